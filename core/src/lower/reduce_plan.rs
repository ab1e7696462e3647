//! How a reduction runs: its kept (outer) and reduced axes coalesced, how many threads reduce
//! one output together (a group), how wide its loads are, and how a long extent with few
//! outputs is split into ranges whose partial results a second, combine launch reduces. Under
//! a binding limit the input is also cut into windows along its first reduced and first outer
//! axes, one launch each. One planner for every backend; the CPU executes split plans too, so
//! splitting and combining are tested without a GPU.
//!
//! ```
//! use strata_core::lower::{operands::ReduceOperands, pieces::BufferInfo, reduce_plan::plan};
//! use strata_core::target::Target;
//! use strata_core::{backend::KernelArgs, DType, Device, Tensor};
//! let dev = Device::cpu();
//! let (x, y) = (Tensor::zeros([1 << 20], DType::F32, &dev).unwrap(), Tensor::zeros([0usize; 0], DType::F32, &dev).unwrap());
//! let args = KernelArgs { outputs: vec![y.operand().unwrap()], inputs: vec![x.operand().unwrap()], scalars: vec![] };
//! let p = plan(&ReduceOperands::of(1, &args).unwrap(), &BufferInfo::of_operands(&args), &Target::cpu(4)).unwrap();
//! assert_eq!((p.outputs, p.splits), (1, 8)); // eight ranges for four threads, then a combine
//! ```

use super::map_plan::needs_wide;
use super::operands::ReduceOperands;
use super::pieces::{self, Access, BufferInfo, Piece, Window};
use crate::error::{Error, Result};
use crate::layout::{coalesce, contiguous_strides};
use crate::target::Target;

/// One launch of a planned reduction (one per window; one in all without a binding limit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReduceLaunch {
    /// The box of `[outer..., reduced...]` (the plan's coalesced axes) this launch covers.
    pub piece: Piece,
    /// Row-major index (over the outer axes) of the launch's first output.
    pub first_output: usize,
    /// Row-major position (over the reduced axes) of its first reduced element.
    pub first_position: usize,
    /// Index of its first range among an output's `splits` partials.
    pub first_split: usize,
    /// Ranges its reduced extent is cut into.
    pub splits: usize,
    /// Reduced positions per range (a multiple of the vector width; the last may be shorter).
    pub chunk: usize,
    /// The input's binding (targets with a binding limit).
    pub input: Option<Window>,
    /// The output's binding when the launch writes the output (no splits).
    pub out: Option<Window>,
}

/// A planned reduction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReducePlan {
    /// Kept axes, coalesced (`[1]` when there are none).
    pub outer_shape: Vec<usize>,
    /// Reduced axes, coalesced (`[1]` for a one-element extent).
    pub reduced_shape: Vec<usize>,
    /// Input strides along the kept axes.
    pub in_outer: Vec<isize>,
    /// Input strides along the reduced axes.
    pub in_reduced: Vec<isize>,
    /// Output strides along the kept axes.
    pub out_outer: Vec<isize>,
    /// Output elements.
    pub outputs: usize,
    /// Elements reduced into each.
    pub extent: usize,
    /// Threads that reduce one output (or one range of it) together. With more than one
    /// reduced axis, a group above 1 promises that the innermost reduced axis is contiguous and
    /// that every range holds whole rows of it (its `chunk` a multiple of the row).
    pub group: usize,
    /// Elements per vector load of the reduced axis (1: none); with several reduced axes,
    /// every reduced stride but the innermost's is a multiple of it.
    pub vector: usize,
    /// Offsets or counts need 64-bit index arithmetic.
    pub wide: bool,
    /// Partial results per output: 1 when the launches write the output, else a combine
    /// launch reduces `[outputs, splits]` partials (row-major) into it.
    pub splits: usize,
    /// The launches, in order.
    pub launches: Vec<ReduceLaunch>,
    /// Threads per output of the combine launch.
    pub combine_group: usize,
    /// The output's binding for the combine launch (targets with a binding limit).
    pub combine_out: Option<Window>,
}

impl ReducePlan {
    /// Work items of a launch: a group of threads per output and range.
    pub fn work(&self, launch: &ReduceLaunch) -> usize {
        launch.piece.len[..self.outer_shape.len()]
            .iter()
            .product::<usize>()
            * launch.splits
            * self.group
    }
}

/// Ranges a reduction of `per_launch` elements into each of `outputs` outputs is cut into, so
/// that the device has enough threads while each folds at least `items_per_thread` elements.
fn split_count(
    outputs: usize,
    per_launch: usize,
    group: usize,
    vector: usize,
    t: &Target,
) -> usize {
    let want = (t.parallel_slots * 2 / group).max(1);
    if outputs >= want {
        return 1;
    }
    want.div_ceil(outputs)
        .min(per_launch.div_ceil(group * vector * t.items_per_thread))
        .max(1)
}

/// `(chunk, splits)` for `extent` positions in about `splits` ranges: chunks a multiple of
/// `unit` (the vector width, or a row's length), and no empty range.
fn chunks(extent: usize, splits: usize, unit: usize) -> (usize, usize) {
    let chunk = extent.div_ceil(splits).div_ceil(unit) * unit;
    if chunk == 0 {
        return (1, 1);
    }
    (chunk, extent.div_ceil(chunk).max(1))
}

/// `(shape, strides...)` coalesced, padded to one axis when none is left.
fn coalesced(shape: &[usize], strides: &[&[isize]]) -> (Vec<usize>, Vec<Vec<isize>>) {
    let (s, st) = coalesce(shape, strides);
    if s.is_empty() {
        return (vec![1], vec![vec![0]; strides.len()]);
    }
    (s, st)
}

/// Plans the reduction of `ops` for `target`; `buffers` are the output's and the input's
/// buffers (in that order, as [`BufferInfo::of_operands`] lists them).
pub fn plan(ops: &ReduceOperands, buffers: &[BufferInfo], target: &Target) -> Result<ReducePlan> {
    let [out_buffer, in_buffer] = buffers else {
        return Err(Error::Invalid(format!(
            "a reduce plan takes the output's and the input's buffers, {} were given",
            buffers.len()
        )));
    };
    let address = in_buffer.address;
    let (input, out, k) = (ops.input, ops.out, ops.kept);
    let (shape, strides) = (input.layout.shape(), input.layout.strides());
    let (outer_shape, outer) = coalesced(&shape[..k], &[&strides[..k], out.layout.strides()]);
    let (reduced_shape, reduced) = coalesced(&shape[k..], &[&strides[k..]]);
    let (in_outer, out_outer, in_reduced) =
        (outer[0].clone(), outer[1].clone(), reduced[0].clone());
    let (outputs, extent) = (ops.outputs, ops.extent);
    if !target.wide_index && (extent > u32::MAX as usize || outputs > u32::MAX as usize) {
        return Err(Error::Unsupported(format!(
            "reductions on this backend take at most 2^32 outputs of 2^32 elements each \
             ({outputs} × {extent})"
        )));
    }
    let item = input.dtype.itemsize();
    // A group of threads per output pays when they read along a contiguous reduced axis;
    // strided reductions run a thread per output, so neighbouring threads read neighbours.
    let contiguous = reduced_shape.len() == 1 && in_reduced[0] == 1;
    // Several reduced axes whose innermost is contiguous and long (a batch norm's statistics:
    // `[N, C, H, W]` over N, H and W): a group reads each row of that axis together, and
    // every range holds whole rows, so the group's reads stay neighbours in memory.
    let inner = *reduced_shape.last().unwrap_or(&1);
    let rows = reduced_shape.len() > 1 && in_reduced.last() == Some(&1) && inner >= 32;
    // A long row takes the largest group even when there are outputs enough for a warp each:
    // a warp's lanes would each add `extent / 32` terms one after another, a chain that a
    // kernel staging one row a block (softmax from its primitives, its backward) waits on
    // with the rest of its block idle, and that fused kernels must repeat to equal this
    // order. Long: each lane of the largest group still folds 8 whole vectors.
    let largest = target.group_of(usize::MAX);
    let nominal_vector = if target.reduce_vectors {
        (target.vector_bytes / item).max(1)
    } else {
        1
    };
    let long_row = extent >= largest * nominal_vector * 8;
    let group = if contiguous && extent >= 64 {
        if extent >= 1024 && (outputs * 32 < target.parallel_slots || long_row) {
            largest
        } else {
            target.group_of(32)
        }
    } else if rows {
        target.group_of(32)
    } else {
        1
    };
    let mut vector = if (contiguous || rows) && target.reduce_vectors && target.vector_bytes > 0 {
        (target.vector_bytes / item).max(1)
    } else {
        1
    };
    let first = address + (input.layout.offset() * item) as u64;
    let row_strides = &in_reduced[..in_reduced.len() - 1];
    while vector > 1
        && (!first.is_multiple_of((vector * item) as u64)
            || in_outer.iter().any(|&s| s.rem_euclid(vector as isize) != 0)
            || (rows
                && row_strides
                    .iter()
                    .any(|&s| s.rem_euclid(vector as isize) != 0)))
    {
        vector /= 2;
    }
    // Ranges are cut at multiples of this many positions.
    let unit = if rows { inner } else { vector };
    let (ro, mut full) = (outer_shape.len(), outer_shape.clone());
    full.extend(&reduced_shape);
    let in_access = Access {
        strides: in_outer.iter().chain(&in_reduced).copied().collect(),
        offset: input.layout.offset(),
        itemsize: item,
        buffer_bytes: in_buffer.bytes,
    };
    let out_access = Access {
        strides: out_outer
            .iter()
            .copied()
            .chain(std::iter::repeat_n(0, reduced_shape.len()))
            .collect(),
        offset: out.layout.offset(),
        itemsize: out.dtype.itemsize(),
        buffer_bytes: out_buffer.bytes,
    };
    let windows = window_grid(&outer_shape, &reduced_shape, &in_access, target)?;
    let (reduced_windows, outer_windows) = (windows.0, windows.1);
    // Ranges per reduced window, from the positions a window holds.
    let rest: usize = reduced_shape[1..].iter().product();
    let rows = reduced_shape[0].div_ceil(reduced_windows).max(1);
    let per_window = (rows * rest).min(extent);
    let ranges = split_count(outputs, per_window, group, vector, target);
    let mut window_splits = Vec::new(); // (start row, rows, first split, splits, chunk)
    let mut first_split = 0;
    let mut row = 0;
    loop {
        let n = rows.min(reduced_shape[0] - row);
        let (chunk, s) = chunks(n * rest, ranges, unit);
        window_splits.push((row, n, first_split, s, chunk));
        first_split += s;
        row += n;
        if row >= reduced_shape[0] {
            break;
        }
    }
    let splits = first_split;
    let outer_rows = outer_shape[0].div_ceil(outer_windows).max(1);
    let outer_rest: usize = outer_shape[1..].iter().product();
    let mut launches = Vec::new();
    let mut o = 0;
    while o < outer_shape[0] {
        let on = outer_rows.min(outer_shape[0] - o);
        for &(r, rn, first_split, s, chunk) in &window_splits {
            let mut piece = Piece::whole(&full);
            piece.start[0] = o;
            piece.len[0] = on;
            piece.start[ro] = r;
            piece.len[ro] = rn;
            let bind = target.binding_limit.is_some();
            launches.push(ReduceLaunch {
                first_output: o * outer_rest,
                first_position: r * rest,
                first_split,
                splits: s,
                chunk,
                input: bind.then(|| pieces::window(&in_access, &piece, target.offset_align)),
                out: (bind && splits == 1)
                    .then(|| pieces::window(&out_access, &piece, target.offset_align)),
                piece,
            });
        }
        o += on;
    }
    let wide = target.wide_index
        && needs_wide(
            input.layout.numel().max(outputs * splits),
            &full,
            &[in_access.strides.clone(), out_access.strides.clone()],
        );
    let combine_out = (target.binding_limit.is_some() && splits > 1).then(|| {
        let only_out = Access {
            strides: out_outer.iter().copied().collect(),
            ..out_access.clone()
        };
        pieces::window(&only_out, &Piece::whole(&outer_shape), target.offset_align)
    });
    Ok(ReducePlan {
        outer_shape,
        reduced_shape,
        in_outer,
        in_reduced,
        out_outer,
        outputs,
        extent,
        group,
        vector,
        wide,
        splits,
        launches,
        combine_group: if splits >= 64 { target.group_of(32) } else { 1 },
        combine_out,
    })
}

/// Windows along the first reduced and first outer axis that make every launch's input fit
/// the binding limit: `(along the reduced axis, along the outer axis)`, halving the reduced
/// rows first.
fn window_grid(
    outer: &[usize],
    reduced: &[usize],
    input: &Access,
    target: &Target,
) -> Result<(usize, usize)> {
    let Some(limit) = target.binding_limit else {
        return Ok((1, 1));
    };
    let ro = outer.len();
    let mut full = outer.to_vec();
    full.extend(reduced);
    let (mut s, mut t) = (1usize, 1usize);
    loop {
        let rows = reduced[0].div_ceil(s).max(1);
        let orows = outer[0].div_ceil(t).max(1);
        let fits = (0..outer[0].max(1)).step_by(orows).all(|o| {
            (0..reduced[0].max(1)).step_by(rows).all(|r| {
                let mut p = Piece::whole(&full);
                p.start[0] = o;
                p.len[0] = orows.min(outer[0] - o);
                p.start[ro] = r;
                p.len[ro] = rows.min(reduced[0].saturating_sub(r));
                p.len.contains(&0)
                    || pieces::window(input, &p, target.offset_align).byte_size <= limit
            })
        });
        if fits {
            return Ok((
                reduced[0].div_ceil(rows).max(1),
                outer[0].div_ceil(orows).max(1),
            ));
        }
        if rows > 1 {
            s *= 2;
        } else if orows > 1 {
            t *= 2;
        } else {
            return Err(Error::Unsupported(format!(
                "a reduce slice does not fit the adapter's {limit}-byte storage binding"
            )));
        }
    }
}

/// Row-major strides of `shape` (the partials' layout over the outer axes, times `splits`).
///
/// ```
/// assert_eq!(strata_core::lower::reduce_plan::partial_strides(&[3, 4], 5), vec![20, 5]);
/// ```
pub fn partial_strides(outer: &[usize], splits: usize) -> Vec<isize> {
    contiguous_strides(outer)
        .iter()
        .map(|&s| s * splits as isize)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::KernelArgs;
    use crate::{DType, Device, Tensor};

    fn gpu(limit: Option<u64>) -> Target {
        Target {
            vector_bytes: 16,
            parallel_slots: 1 << 14,
            items_per_thread: 8,
            group_sizes: &[1, 32, 256],
            row_groups: &[1],
            row_stage_bytes: 0,
            row_stage_group: 1,
            reduce_vectors: true,
            binding_limit: limit,
            offset_align: 256,
            ..Target::cpu(1)
        }
    }

    fn plan_of(x: &Tensor, kept: &[usize], t: &Target) -> ReducePlan {
        let out = Tensor::zeros(kept, DType::F32, x.device()).unwrap();
        let args = KernelArgs {
            outputs: vec![out.operand().unwrap()],
            inputs: vec![x.operand().unwrap()],
            scalars: vec![],
        };
        let ops = ReduceOperands::of(x.ndim() - kept.len(), &args).unwrap();
        plan(&ops, &BufferInfo::of_operands(&args), t).unwrap()
    }

    #[test]
    fn contiguous_rows_get_a_group_and_vectors_columns_a_thread_each() {
        let dev = Device::cpu();
        let x = Tensor::zeros([64, 4096], DType::F32, &dev).unwrap();
        let rows = plan_of(&x, &[64], &gpu(None));
        assert_eq!((rows.group, rows.vector), (256, 4));
        let cols = plan_of(&x.t().unwrap(), &[4096], &gpu(None));
        assert_eq!((cols.group, cols.vector), (1, 1));
        assert!(cols.splits > 1, "few outputs for the device: split");
        assert_eq!(cols.combine_group, 1);
    }

    #[test]
    fn many_rows_take_a_warp_each_unless_a_lane_would_add_a_long_chain() {
        let dev = Device::cpu();
        // Outputs enough for the device either way (2^14 slots over 32 lanes).
        let x = Tensor::zeros([1024, 4096], DType::F32, &dev).unwrap();
        assert_eq!(plan_of(&x, &[1024], &gpu(None)).group, 32);
        // 8192 f32: a warp's lanes would add 256 terms each, a block's 32 (8 vectors).
        let x = Tensor::zeros([1024, 8192], DType::F32, &dev).unwrap();
        let p = plan_of(&x, &[1024], &gpu(None));
        assert_eq!((p.group, p.vector, p.splits), (256, 4, 1));
        // Without vectors a row is long from 2048 elements.
        let t = Target {
            reduce_vectors: false,
            ..gpu(None)
        };
        assert_eq!(
            plan_of(&x.narrow(1, 0, 2048).unwrap(), &[1024], &t).group,
            256
        );
        assert_eq!(
            plan_of(&x.narrow(1, 0, 2047).unwrap(), &[1024], &t).group,
            32
        );
    }

    #[test]
    fn per_channel_statistics_read_rows_with_a_group_in_whole_row_ranges() {
        let dev = Device::cpu();
        // A batch norm's mean over N, H and W of [N, C, H, W]: C kept, N and H·W reduced.
        let x = Tensor::zeros([16, 8, 12, 12], DType::F32, &dev).unwrap();
        let p = plan_of(&x.permute([1, 0, 2, 3]).unwrap(), &[8], &gpu(None));
        assert_eq!(
            (&p.reduced_shape[..], &p.in_reduced[..]),
            (&[16, 144][..], &[1152, 1][..])
        );
        assert_eq!((p.group, p.vector), (32, 4));
        assert!(p.splits > 1);
        assert_eq!(p.launches[0].chunk % 144, 0, "ranges of whole rows");
        // A row too short for a group, or a strided innermost axis: a thread per output.
        let short = Tensor::zeros([16, 8, 4, 4], DType::F32, &dev).unwrap();
        let p = plan_of(&short.permute([1, 0, 2, 3]).unwrap(), &[8], &gpu(None));
        assert_eq!((p.group, p.vector), (1, 1));
        let p = plan_of(&x.permute([1, 3, 2, 0]).unwrap(), &[8], &gpu(None));
        assert_eq!(p.group, 1);
    }

    #[test]
    fn splits_cover_the_extent_without_empty_ranges() {
        let dev = Device::cpu();
        let x = Tensor::zeros([100_003], DType::F32, &dev).unwrap();
        let p = plan_of(&x, &[], &gpu(None));
        let l = &p.launches[0];
        assert_eq!(l.splits, p.splits);
        assert!(l.chunk * (l.splits - 1) < p.extent && l.chunk * l.splits >= p.extent);
    }

    #[test]
    fn a_binding_limit_windows_the_reduced_and_outer_axes() {
        let dev = Device::cpu();
        let x = Tensor::zeros([8, 1000], DType::F32, &dev).unwrap();
        let p = plan_of(&x, &[8], &gpu(Some(4096)));
        assert!(p.launches.len() > 1);
        let mut covered = vec![0; 8 * 1000];
        for l in &p.launches {
            assert!(l.input.unwrap().byte_size <= 4096);
            for o in l.piece.start[0]..l.piece.start[0] + l.piece.len[0] {
                for r in l.piece.start[1]..l.piece.start[1] + l.piece.len[1] {
                    covered[o * 1000 + r] += 1;
                }
            }
        }
        assert!(covered.iter().all(|&c| c == 1));
        let total: usize = p
            .launches
            .iter()
            .filter(|l| l.piece.start[0] == 0)
            .map(|l| l.splits)
            .sum();
        assert_eq!(total, p.splits);
    }
}
