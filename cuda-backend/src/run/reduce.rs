//! A reduction's launches: core's plan as the kernel's words, partial buffers and a combine
//! launch where the plan splits the extent, and a row prologue in the same kernel where the
//! row fits shared memory (else the two launches core defines it by).

use super::step::{chain, Sig, Step};
use crate::launch::{Args, Grid, Launch};
use crate::render::reduce::{held, per_warp, staged, StagedEpilogue, StagedPrologue};
use crate::render::reduce::{repr, ReduceSig, Words};
use crate::render::softmax::STAGE_GROUP;
use strata_core::backend::KernelArgs;
use strata_core::ir::{Expr, Kernel, ReduceOp, RowEpilogue, RowPrologue};
use strata_core::lower::operands::{ReduceMap, ReduceOperands};
use strata_core::lower::pieces::BufferInfo;
use strata_core::lower::reduce_plan::{self, ReducePlan};
use strata_core::target::Target;
use strata_core::{DType, Error, Result};

/// The steps of `kernel`, a `Kernel::Reduce`, over `args`.
pub(crate) fn steps(
    kernel: &Kernel,
    args: &KernelArgs,
    target: &Target,
) -> Result<Vec<Step<'static>>> {
    let &Kernel::Reduce {
        op,
        reduced_axes,
        acc,
        ref map,
        prologue,
        ref epilogue,
        stores_map,
    } = kernel
    else {
        return Err(Error::Backend(
            "internal error: reduce::steps takes a reduction".into(),
        ));
    };
    if stores_map {
        return plain_stored(op, reduced_axes, acc, map.as_ref(), args, target);
    }
    if prologue.is_none() && epilogue.is_none() {
        return plain(op, reduced_axes, acc, map.as_ref(), args, target);
    }
    // One pass over each row where it fits shared memory, else core's launches.
    if let Some(map) = map {
        let how = (op, reduced_axes, acc);
        let staged = staged_kernel(how, map, prologue, epilogue.as_ref(), args, target)?;
        if let Some((sig, launch)) = staged {
            return Ok(vec![Step::Kernel {
                sig: Sig::Reduce(sig),
                launch,
            }]);
        }
    }
    if epilogue.is_some() {
        return Err(unstaged_epilogue());
    }
    let launches = strata_core::lower::prologue::split(kernel, args)?;
    let [(k1, a1), (k2, a2)] = &launches[..] else {
        return Err(Error::Backend(
            "internal error: a row prologue splits into two reductions".into(),
        ));
    };
    Ok(chain(steps(k1, a1, target)?, steps(k2, a2, target)?))
}

/// A row epilogue that does not stage runs as core's launches, each its own `run` (a map
/// among them binds its own arguments): [`stages`] says which, before the steps are asked.
fn unstaged_epilogue() -> Error {
    Error::Backend(
        "internal error: a row epilogue that does not stage runs as core's launches".into(),
    )
}

/// True when `kernel` (a `Reduce`) runs as one staged launch; false for a reduction with a row
/// epilogue that does not fit one, which then runs as
/// [`split`](strata_core::lower::prologue::split)'s launches.
pub(crate) fn stages(kernel: &Kernel, args: &KernelArgs, target: &Target) -> Result<bool> {
    let Kernel::Reduce {
        op,
        reduced_axes,
        acc,
        map: Some(map),
        prologue,
        epilogue,
        ..
    } = kernel
    else {
        return Ok(false);
    };
    if prologue.is_none() && epilogue.is_none() {
        return Ok(false);
    }
    let how = (*op, *reduced_axes, *acc);
    Ok(staged_kernel(how, map, *prologue, epilogue.as_ref(), args, target)?.is_some())
}

/// Core's plan of the reduction `Reduce { reduced_axes }` over `args` on `target`.
pub(crate) fn plan_of(
    reduced_axes: usize,
    args: &KernelArgs,
    target: &Target,
) -> Result<ReducePlan> {
    let ops = ReduceOperands::of(reduced_axes, args)?;
    let buffers = [ops.out, ops.input]
        .iter()
        .map(|o| crate::memory::buffer_info(o))
        .collect::<Result<Vec<_>>>()?;
    reduce_plan::plan(&ops, &buffers, target)
}

/// True when two plans combine their elements in one order: the same coalesced extents,
/// group, vector width, ranges and launches, so the same bits — even a maximum's, whose NaN
/// payload follows the order.
pub(crate) fn same_order(a: &ReducePlan, b: &ReducePlan) -> bool {
    a.outer_shape == b.outer_shape
        && a.reduced_shape == b.reduced_shape
        && (a.group, a.vector, a.splits, a.combine_group)
            == (b.group, b.vector, b.splits, b.combine_group)
        && a.launches == b.launches
}

/// A reduction planned by core, with its first launch's structure.
#[derive(Debug)]
struct Reduction {
    sig: ReduceSig,
    plan: ReducePlan,
    in_ptr: u64,
    out_ptr: u64,
    /// A fused map's other input pointers (at input 0's element offset) and scalar words,
    /// and the stored map's output pointer where it is stored.
    map_words: Vec<u64>,
}

/// Plans `Reduce { op, reduced_axes, acc }` for `args` on `target` (one launch: CUDA binds no
/// windows), or `None` when there is no output.
fn reduction(
    op: ReduceOp,
    reduced_axes: usize,
    acc: DType,
    map: Option<&Expr>,
    args: &KernelArgs,
    target: &Target,
) -> Result<Option<Reduction>> {
    let ops = ReduceOperands::of(reduced_axes, args)?;
    if ops.outputs == 0 {
        return Ok(None);
    }
    let buffers = [ops.out, ops.input]
        .iter()
        .map(|o| crate::memory::buffer_info(o))
        .collect::<Result<Vec<BufferInfo>>>()?;
    let plan = reduce_plan::plan(&ops, &buffers, target)?;
    let sig = ReduceSig {
        op,
        input: ops.input.dtype,
        acc,
        out: ops.out.dtype,
        outer_rank: plan.outer_shape.len(),
        reduced_rank: plan.reduced_shape.len(),
        group: plan.group,
        vector: plan.vector,
        wide: plan.wide,
        combine: false,
        map: map.map(|expr| ReduceMap::of(expr, &ops, args)),
        prologue: None,
        epilogue: None,
        held: false,
        stores_map: false,
        out_vector: 1,
    };
    let mut map_words = Vec::new();
    if map.is_some() {
        for o in ops.more {
            map_words.push(crate::memory::element_address(o)?);
        }
        map_words.extend(args.scalars.iter().map(|s| s.bits()));
    }
    Ok(Some(Reduction {
        sig,
        in_ptr: crate::memory::element_address(ops.input)?,
        out_ptr: crate::memory::element_address(ops.out)?,
        plan,
        map_words,
    }))
}

/// The steps of a reduction that also stores its map (`stores_map`), in output 1 laid out
/// like input 0: [`plain`]'s, its first launch storing each element's value as it folds it.
fn plain_stored(
    op: ReduceOp,
    reduced_axes: usize,
    acc: DType,
    map: Option<&Expr>,
    args: &KernelArgs,
    target: &Target,
) -> Result<Vec<Step<'static>>> {
    let ([out, stored], Some(map), Some(first)) =
        (args.outputs.as_slice(), map, args.inputs.first())
    else {
        return Err(Error::Backend(format!(
            "internal error: a reduction that stores its map has a map, an input and two \
             outputs (got {} outputs, {} inputs)",
            args.outputs.len(),
            args.inputs.len()
        )));
    };
    if stored.layout.shape() != first.layout.shape()
        || stored.layout.strides() != first.layout.strides()
        || stored.dtype != map.dtype
    {
        return Err(Error::Backend(format!(
            "internal error: a reduction's stored map is laid out like input 0 ({:?}) in the \
             map's dtype ({}); got {:?} {}",
            first.layout, map.dtype, stored.layout, stored.dtype
        )));
    }
    let main = KernelArgs {
        outputs: vec![out.clone()],
        inputs: args.inputs.clone(),
        scalars: args.scalars.clone(),
    };
    let Some(mut red) = reduction(op, reduced_axes, acc, Some(map), &main, target)? else {
        return Ok(Vec::new());
    };
    red.sig.stores_map = true;
    let stored_at = crate::memory::element_address(stored)?;
    red.map_words.push(stored_at);
    // A thread a column: neighbouring columns are walked together, with vector loads and
    // stores, where every row of them is whole aligned vectors.
    let item = red.sig.input.itemsize();
    let ov = (16 / item).min(4);
    let p = &red.plan;
    let mut pointers = vec![crate::memory::element_address(first)?, stored_at];
    for (k, o) in args.inputs.iter().enumerate().skip(1) {
        if !red
            .sig
            .map
            .as_ref()
            .is_some_and(|m| m.per_output[k] || m.per_position[k])
        {
            pointers.push(crate::memory::element_address(o)?);
        }
    }
    let (inner, rest) = p.in_outer.split_last().unwrap_or((&0, &[]));
    let columns = ov > 1
        && p.group == 1
        && p.launches.len() == 1
        && p.reduced_shape.len() == 1
        && map.dtype.itemsize() == item
        && *inner == 1
        && p.out_outer.last() == Some(&1)
        && p.outer_shape.last().is_some_and(|n| n % ov == 0)
        && rest
            .iter()
            .chain(&p.in_reduced)
            .all(|s| s % ov as isize == 0)
        && pointers.iter().all(|a| a % (ov * item) as u64 == 0);
    if !columns {
        return Ok(launches(red, op, acc));
    }
    red.sig.out_vector = ov;
    let mut steps = launches(red, op, acc);
    // (The first launch: a thread per `ov` outputs and range.)
    if let Some(Step::Kernel { launch, .. }) =
        steps.iter_mut().find(|s| matches!(s, Step::Kernel { .. }))
    {
        if let Grid::Linear { work, .. } = &mut launch.grid {
            *work /= ov;
        }
    }
    Ok(steps)
}

/// The steps of a reduction without a prologue: one launch, or partials in two scratch
/// buffers (values, and positions for argmin/argmax), the ranges' launch and the combine.
fn plain(
    op: ReduceOp,
    reduced_axes: usize,
    acc: DType,
    map: Option<&Expr>,
    args: &KernelArgs,
    target: &Target,
) -> Result<Vec<Step<'static>>> {
    let Some(red) = reduction(op, reduced_axes, acc, map, args, target)? else {
        return Ok(Vec::new());
    };
    Ok(launches(red, op, acc))
}

/// The launches of the planned reduction `red`: one, or partials in two scratch buffers
/// (values, and positions for argmin/argmax), the ranges' launch and the combine.
fn launches(red: Reduction, op: ReduceOp, acc: DType) -> Vec<Step<'static>> {
    if red.plan.splits == 1 {
        return vec![Step::Kernel {
            launch: red.first(),
            sig: Sig::Reduce(red.sig),
        }];
    }
    let n = red.plan.outputs * red.plan.splits;
    let positions = if op.returns_index() { n * 8 } else { 0 };
    let (combine_sig, combine) = red.combine();
    vec![
        Step::Scratch {
            bytes: n * repr(op, acc).itemsize(),
        },
        Step::Scratch { bytes: positions },
        Step::Kernel {
            launch: red.first(),
            sig: Sig::Reduce(red.sig),
        },
        Step::Kernel {
            sig: Sig::Reduce(combine_sig),
            launch: combine,
        },
    ]
}

/// The words of a launch: counts, shapes, the input, the output, and the partial buffers.
fn words(
    red: &Reduction,
    (extent, splits, chunk): (usize, usize, usize),
    reduced_shape: &[usize],
    (in_ptr, in_outer, in_reduced): (u64, &[isize], &[isize]),
) -> Args {
    let p = &red.plan;
    let mut w = Args::new();
    for v in [p.outputs, extent, splits, chunk] {
        w.push(v as u64);
    }
    for &n in p.outer_shape.iter().chain(reduced_shape) {
        w.push(n as u64);
    }
    w.push(in_ptr);
    for &s in in_outer.iter().chain(in_reduced) {
        w.push(s as i64 as u64);
    }
    w.push(red.out_ptr);
    for &s in &p.out_outer {
        w.push(s as i64 as u64);
    }
    // The partial values and positions, and the positions a combine reads: scratch buffers
    // (`Launch::scratch`), or none.
    w.push(0);
    w.push(0);
    w.push(0);
    w
}

impl Reduction {
    /// The first launch: it writes the output (one range), or partials into scratch buffers
    /// 0 and 1 (values and positions).
    fn first(&self) -> Launch {
        let p = &self.plan;
        let launch = &p.launches[0];
        let mut w = words(
            self,
            (p.extent, p.splits, launch.chunk),
            &p.reduced_shape,
            (self.in_ptr, &p.in_outer, &p.in_reduced),
        );
        w.0.extend_from_slice(&self.map_words);
        let mut first = Launch::linear(w, p.work(launch));
        if p.splits > 1 {
            let part = Words::of(&self.sig).part;
            first.scratch = vec![(part, 0), (part + 1, 1)];
        }
        first
    }

    /// The combine launch reading `splits` partials per output from scratch buffers 0 and 1.
    fn combine(&self) -> (ReduceSig, Launch) {
        let p = &self.plan;
        let s = p.splits;
        let in_outer = reduce_plan::partial_strides(&p.outer_shape, s);
        let w = words(self, (s, 1, s), &[s], (0, &in_outer, &[1]));
        let sig = ReduceSig {
            input: repr(self.sig.op, self.sig.acc),
            reduced_rank: 1,
            group: p.combine_group,
            vector: 1,
            combine: true,
            map: None,
            stores_map: false,
            out_vector: 1,
            prologue: None,
            ..self.sig.clone()
        };
        let at = Words::of(&sig);
        let mut combine = Launch::linear(w, p.outputs * p.combine_group);
        combine.scratch = vec![(at.in_ptr, 0), (at.part + 2, 1)];
        (sig, combine)
    }
}

/// Plans `Reduce { op, map, prologue, epilogue }` (a prologue, an epilogue or both) over
/// `args` as one staged launch (`render::reduce::staged`'s kernel), or `None` when the
/// reduction does not take that shape.
fn staged_kernel(
    (op, reduced_axes, acc): (ReduceOp, usize, DType),
    map: &Expr,
    prologue: Option<RowPrologue>,
    epilogue: Option<&RowEpilogue>,
    args: &KernelArgs,
    target: &Target,
) -> Result<Option<(ReduceSig, Launch)>> {
    let (out, prologue_out, epilogue_out) = match (args.outputs.as_slice(), prologue, epilogue) {
        ([out, p], Some(_), None) => (out, Some(p), None),
        ([out, p, e], Some(_), Some(_)) => (out, Some(p), Some(e)),
        ([out, e], None, Some(_)) => (out, None, Some(e)),
        _ => return Ok(None),
    };
    if prologue.is_some_and(|p| p.source != 0) {
        return Ok(None);
    }
    let main = KernelArgs {
        outputs: vec![out.clone()],
        inputs: args.inputs.clone(),
        scalars: args.scalars.clone(),
    };
    let Some(red) = reduction(op, reduced_axes, acc, Some(map), &main, target)? else {
        return Ok(None);
    };
    let p = &red.plan;
    let input = red.sig.input;
    let v = p.vector;
    // Splits are followed as the eager launches run them (ranges, then one thread adding
    // the partials in order), where that combine is one thread's.
    // Output 1 is written during the kernel: no other input may read its buffer.
    let prologue_buffer = match prologue_out {
        Some(o) => Some(crate::memory::buffer_info(o)?.address),
        None => None,
    };
    let out_buffer = crate::memory::buffer_info(out)?.address;
    let aliased = args.inputs.iter().enumerate().any(|(k, o)| {
        let at = crate::memory::buffer_info(o).map(|b| b.address).ok();
        let reads_prologue = prologue.is_some_and(|p| p.result == k);
        (!reads_prologue && at.is_some() && at == prologue_buffer)
            || (epilogue.is_some_and(|e| e.result != k) && at == Some(out_buffer))
    });
    // The epilogue's output is laid out like input 0 (it is written at the row's offsets),
    // and its result input holds one value per output.
    let epilogue_fits = match (epilogue, epilogue_out) {
        (Some(e), Some(o)) => {
            let x = &args.inputs[0];
            let vector_bytes = (red.plan.vector * o.dtype.itemsize()) as u64;
            o.layout.shape() == x.layout.shape()
                && o.layout.strides() == x.layout.strides()
                && crate::memory::element_address(o)? % vector_bytes == 0
                && red
                    .sig
                    .map
                    .as_ref()
                    .is_some_and(|m| e.result < m.per_output.len() && m.per_output[e.result])
        }
        _ => true,
    };
    // One value per position in the row: read as the rows are, a vector at a time.
    let mut positions_fit = true;
    if let Some(m) = &red.sig.map {
        for (k, o) in args.inputs.iter().enumerate() {
            if m.per_position.get(k) == Some(&true) {
                let vector_bytes = (v * o.dtype.itemsize()) as u64;
                positions_fit &= crate::memory::element_address(o)? % vector_bytes == 0;
            }
        }
    }
    // A prologue is order-free, laid out and typed like the output and read one value per
    // output.
    // A sum (a mean's) adds as the eager sum of the row does: in the accumulator the terms
    // have, with the reduction's own plan (the same lanes, ranges and combine).
    let sums_in_order = |pr: &RowPrologue, o: &strata_core::backend::Operand| -> Result<bool> {
        let eager = KernelArgs {
            outputs: vec![o.clone()],
            inputs: vec![args.inputs[0].clone()],
            scalars: vec![],
        };
        Ok(pr.op == ReduceOp::Sum
            && o.dtype.is_float()
            && repr(pr.op, o.dtype) == repr(op, acc)
            && same_order(&plan_of(reduced_axes, &eager, target)?, p))
    };
    let prologue_fits = match (prologue, prologue_out) {
        (Some(pr), Some(o)) => {
            (pr.op.is_order_free() || sums_in_order(&pr, o)?)
                && o.layout == out.layout
                && o.dtype == input
                && red
                    .sig
                    .map
                    .as_ref()
                    .is_some_and(|m| m.per_output[pr.result])
        }
        _ => true,
    };
    // (Where the eager plan gives a row one warp, each warp stages its own rows:
    // `render::reduce::per_warp`.)
    let fits = p.combine_group == 1
        && !aliased
        && epilogue_fits
        && positions_fit
        && prologue_fits
        && !op.returns_index()
        && (p.group == 256 || p.group == 32)
        && p.group <= STAGE_GROUP
        && target.row_stage_group == STAGE_GROUP
        && p.reduced_shape.len() == 1
        && p.in_reduced[..] == [1]
        && v > 1
        && p.extent.is_multiple_of(v)
        && p.extent * input.itemsize() <= target.row_stage_bytes
        && repr(op, acc).itemsize() == input.itemsize();
    if !fits {
        return Ok(None);
    }
    let sig = ReduceSig {
        prologue: prologue.zip(prologue_out).map(|(pr, o)| StagedPrologue {
            op: pr.op,
            result: pr.result,
            out: o.dtype,
        }),
        epilogue: epilogue.zip(epilogue_out).map(|(e, o)| StagedEpilogue {
            expr: e.expr.clone(),
            result: e.result,
            out: o.dtype,
        }),
        // A row with a prologue that a block's lanes add in one range, short enough for
        // registers, is held there (`render::reduce::held`).
        held: prologue.is_some_and(|pr| pr.op.is_order_free())
            && p.group == 256
            && p.splits == 1
            && p.extent <= held::VECTORS * p.group * v,
        ..red.sig.clone()
    };
    let mut launch = red.first();
    // A split row's partials stay in the block's shared memory (`sh_part`): no scratch.
    launch.scratch.clear();
    if let Some(o) = prologue_out {
        launch.args.push(crate::memory::element_address(o)?);
    }
    if let Some(o) = epilogue_out {
        launch.args.push(crate::memory::element_address(o)?);
    }
    let rows = p.outputs.min(1 << 20) as u32;
    if sig.held {
        launch.grid = Grid::Fixed {
            grid: (rows, 1, 1),
            block: (p.group as u32, 1, 1),
            shared: 0,
        };
        return Ok(Some((sig, launch)));
    }
    let row_bytes = p.extent * input.itemsize();
    if sig.staged_by_warps() {
        // Each warp its own rows, a slice of the block's shared memory each.
        // Operands of one value a position (γ, β) are read by every row from L1: fewer rows at
        // once, and an L1 of three times their bytes (`Grid::Cached`).
        let positions = sig.map.as_ref().map_or(0, |m| {
            (m.inputs.iter().zip(&m.per_position))
                .filter(|(_, &at)| at)
                .map(|(d, _)| p.extent * d.itemsize())
                .sum::<usize>()
        });
        let mut warps = per_warp::warps(row_bytes, target.row_stage_bytes);
        if positions > 0 {
            warps = warps.min(2);
        }
        let (grid, block, shared) = (
            (p.outputs.div_ceil(warps).min(1 << 20) as u32, 1, 1),
            (32 * warps as u32, 1, 1),
            (warps * row_bytes) as u32,
        );
        launch.grid = match positions {
            0 => Grid::Fixed {
                grid,
                block,
                shared,
            },
            _ => Grid::Cached {
                grid,
                block,
                shared,
                cached: (3 * positions) as u32,
            },
        };
        return Ok(Some((sig, launch)));
    }
    let (block, shared) = (
        (staged::block_threads(&sig) as u32, 1, 1),
        (p.extent * input.itemsize()) as u32,
    );
    // An epilogue that reads rows from memory again reads them from L2 while few rows are
    // in flight: few blocks a multiprocessor (`staged::resident_blocks`: one, or two where
    // only the rows besides input 0's are read again; softmax's backward over [16384, 16384]
    // f32 on an H200 took 1.27 ms with three blocks of 512, 50 MiB of rows in flight).
    launch.grid = if staged::rereads_rows(&sig) {
        Grid::Resident {
            items: rows,
            per_sm: staged::resident_blocks(&sig) as u32,
            block,
            shared,
        }
    } else {
        Grid::Fixed {
            grid: (rows, 1, 1),
            block,
            shared,
        }
    };
    Ok(Some((sig, launch)))
}
