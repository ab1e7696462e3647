//! How a map launch runs: the iteration space with as few axes as possible, cut into pieces
//! under a binding limit, and per piece how each operand is reached (contiguous, strided, or
//! through 32×32 tiles), how the element's position is read, the vector width and the index
//! width. One planner for every backend; a backend turns a piece into source and arguments.
//!
//! ```
//! use strata_core::lower::{map_plan::{plan, Path}, operands::MapOperands, pieces::BufferInfo};
//! use strata_core::target::Target;
//! use strata_core::{ir::Expr, backend::KernelArgs, DType, Device, Tensor};
//! let dev = Device::cpu();
//! let x = Tensor::zeros([64, 64], DType::F32, &dev).unwrap();
//! let out = Tensor::zeros([64, 64], DType::F32, &dev).unwrap();
//! let args = KernelArgs { outputs: vec![out.operand().unwrap()], inputs: vec![x.t().unwrap().operand().unwrap()], scalars: vec![] };
//! let expr = Expr::input(0, DType::F32);
//! let ops = MapOperands::of(&expr, &args).unwrap();
//! let p = plan(&ops, false, &BufferInfo::of_operands(&args), &Target::cpu(1)).unwrap();
//! assert_eq!(p.pieces[0].operands[1].path, Path::Tiled); // the transposed input
//! ```

use super::operands::MapOperands;
use super::pieces::{self, Access, BufferInfo, Piece, Window};
use crate::error::{Error, Result};
use crate::layout::contiguous_strides;
use crate::layout::{Dims, Strides};
use crate::target::Target;

/// How a piece reaches one operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Path {
    /// Its offset is the element's index in the piece.
    Contiguous,
    /// Its offset is decoded from the element's coordinates and its strides.
    Strided,
    /// An input read down the columns through a 32×32 tile in shared memory.
    Tiled,
    /// Strided between rows, contiguous along them, in a vectorized piece: whole vectors at
    /// the offset decoded for each vector's first element (targets with `vector_rows`).
    Rows,
}

/// How a piece reads the output element's row-major position (arange, random numbers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Position {
    /// The expression does not read it.
    Unused,
    /// `base` plus the element's index in the piece (the piece is a run of positions).
    Linear {
        /// The position of the piece's first element.
        base: usize,
    },
    /// `base` plus the element's coordinates times `strides` (the full launch's row-major
    /// strides).
    Strided {
        /// The position of the piece's first element.
        base: usize,
        /// Row-major strides of the whole launch over the piece's axes.
        strides: Strides,
    },
}

/// What a kernel's source knows of how a piece reads the position (a part of its signature;
/// [`Position`] holds the values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PositionKind {
    /// Not read.
    Unused,
    /// `base` plus the element's index in the piece.
    Linear,
    /// The same, in vectors whose first position is a multiple of the vector width: each
    /// lane's position modulo the width is known at compile time.
    Aligned,
    /// Decoded from the coordinates.
    Strided,
}

impl Position {
    /// What a kernel with vectors of `vector` elements knows of this position.
    ///
    /// ```
    /// use strata_core::lower::map_plan::{Position, PositionKind};
    /// assert_eq!(Position::Linear { base: 8 }.kind(4), PositionKind::Aligned);
    /// assert_eq!(Position::Linear { base: 6 }.kind(4), PositionKind::Linear);
    /// assert_eq!(Position::Unused.kind(4), PositionKind::Unused);
    /// ```
    pub fn kind(&self, vector: usize) -> PositionKind {
        match *self {
            Position::Unused => PositionKind::Unused,
            Position::Linear { base } if vector > 1 && base.is_multiple_of(vector) => {
                PositionKind::Aligned
            }
            Position::Linear { .. } => PositionKind::Linear,
            Position::Strided { .. } => PositionKind::Strided,
        }
    }
}

/// One operand of a piece (output first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedOperand {
    /// Strides over the piece's axes.
    pub strides: Strides,
    /// The piece's first element: in the window when the target binds windows, else in the
    /// buffer.
    pub offset: usize,
    /// The bytes of the buffer bound for this piece (targets with a binding limit).
    pub window: Option<Window>,
    /// How the piece reaches it.
    pub path: Path,
}

/// One launch of a planned map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapPiece {
    /// The piece's extents (its axes, coalesced).
    pub shape: Dims,
    /// Elements in the piece.
    pub numel: usize,
    /// The output, then each input.
    pub operands: Vec<PlannedOperand>,
    /// How the element's position is read.
    pub position: Position,
    /// Elements per work item (1: not vectorized).
    pub vector: usize,
    /// Offsets or counts need 64-bit index arithmetic.
    pub wide: bool,
    /// Work items: elements over the vector width, or 256 per 32×32 tile.
    pub work: usize,
}

impl MapPiece {
    /// True when some input goes through tiles.
    pub fn tiled(&self) -> bool {
        self.operands.iter().any(|o| o.path == Path::Tiled)
    }
}

/// A planned map: its pieces in order (none when the output is empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapPlan {
    /// One launch each.
    pub pieces: Vec<MapPiece>,
}

/// True when some offset or count over `shape` does not fit 32-bit indexing (with a margin of
/// 2, so sums of two offsets do not overflow either).
///
/// ```
/// use strata_core::lower::map_plan::needs_wide;
/// assert!(!needs_wide(1 << 20, &[1 << 20], &[vec![1]]));
/// assert!(needs_wide(4, &[2, 2], &[vec![1 << 31, 1]]));
/// ```
pub fn needs_wide<S: AsRef<[isize]>>(numel: usize, shape: &[usize], strides: &[S]) -> bool {
    needs_wide_of(numel, shape, strides.iter().map(|s| s.as_ref()))
}

/// [`needs_wide`] over any sequence of stride lists (no collecting on the launch path).
fn needs_wide_of<'s>(
    numel: usize,
    shape: &[usize],
    mut strides: impl Iterator<Item = &'s [isize]>,
) -> bool {
    const LIMIT: u128 = i32::MAX as u128;
    if numel as u128 > LIMIT / 2 {
        return true;
    }
    strides.any(|s| {
        let reach: u128 = shape
            .iter()
            .zip(s)
            .map(|(&n, &st)| (n.saturating_sub(1)) as u128 * st.unsigned_abs() as u128)
            .sum();
        reach > LIMIT / 2
    })
}

/// The order a map visits the output's axes in, the first step of planning it: a map that
/// does not read the element's position may visit the elements in any order, so its
/// operands are passed with their axes in the output's memory order (a permuted output, and
/// inputs laid out like it, reach the planner contiguous). `None`: as they are (the map reads
/// the position, or the output is contiguous or has fewer than two axes).
///
/// ```
/// use strata_core::{lower::map_plan::iteration_order, Layout};
/// let t = Layout::contiguous(&[2, 3]).unwrap().permuted(&[1, 0]).unwrap();
/// assert_eq!(iteration_order(false, &t), Some(vec![1, 0]));
/// assert_eq!(iteration_order(true, &t), None);
/// ```
pub fn iteration_order(reads_position: bool, out: &crate::layout::Layout) -> Option<Vec<usize>> {
    if reads_position || out.ndim() < 2 || out.is_contiguous() {
        return None;
    }
    Some(out.memory_order())
}

/// Plans the map over `ops` for `target`. `reads_position`: the expression reads the element's
/// position. `buffers`: each operand's buffer (output first).
pub fn plan(
    ops: &MapOperands,
    reads_position: bool,
    buffers: &[BufferInfo],
    target: &Target,
) -> Result<MapPlan> {
    let out = ops.out;
    let numel = out.layout.numel();
    if numel == 0 {
        return Ok(MapPlan { pieces: Vec::new() });
    }
    let operands = || ops.operands();
    let (shape, strides) = coalesce(out.layout.shape(), operands().map(|o| o.layout.strides()));
    if !target.wide_index && reads_position && numel > u32::MAX as usize {
        return Err(Error::Unsupported(format!(
            "maps that read the position (arange, random) take at most 2^32 elements on this \
             backend, not {numel}"
        )));
    }
    let access: Vec<Access> = operands()
        .zip(strides)
        .zip(buffers)
        .map(|((o, s), b)| Access {
            strides: s,
            offset: o.layout.offset(),
            itemsize: o.dtype.itemsize(),
            buffer_bytes: b.bytes,
        })
        .collect();
    let full_dense = contiguous_strides(&shape);
    let outputs = ops.outputs();
    let piece = |p: &Piece| {
        plan_piece(
            p,
            &access,
            outputs,
            buffers,
            &full_dense,
            reads_position,
            ops.draw_lanes,
            target,
        )
    };
    let planned = match target.binding_limit {
        Some(limit) => pieces::split(&shape, &access, limit, target.offset_align)?
            .iter()
            .map(piece)
            .collect(),
        None => vec![piece(&Piece::whole(&shape))],
    };
    Ok(MapPlan { pieces: planned })
}

/// Merges neighbouring axes that every operand walks as one (and drops size-1 axes), as
/// [`crate::layout::coalesce`] does, into inline lists.
fn coalesce<'s>(
    shape: &[usize],
    strides: impl Iterator<Item = &'s [isize]> + Clone,
) -> (Dims, Vec<Strides>) {
    let mut out_shape = Dims::new();
    let mut out: Vec<Strides> = strides.clone().map(|_| Strides::new()).collect();
    for (d, &n) in shape.iter().enumerate() {
        if n == 1 {
            continue;
        }
        let merge = !out_shape.is_empty()
            && strides
                .clone()
                .zip(&out)
                .all(|(s, o)| o.last().is_some_and(|&l| l == s[d] * n as isize));
        if merge {
            *out_shape.last_mut().expect("merging into an axis") *= n;
            for (o, s) in out.iter_mut().zip(strides.clone()) {
                *o.last_mut().expect("one stride per axis") = s[d];
            }
        } else {
            out_shape.push(n);
            for (o, s) in out.iter_mut().zip(strides.clone()) {
                o.push(s[d]);
            }
        }
    }
    (out_shape, out)
}

/// True when `strides` walk `len` in row-major order without gaps (size-1 axes may have any
/// stride).
fn is_dense(strides: &[isize], len: &[usize]) -> bool {
    let mut expected = 1isize;
    for (&st, &n) in strides.iter().zip(len).rev() {
        if n != 1 && st != expected {
            return false;
        }
        expected *= n as isize;
    }
    true
}

#[allow(clippy::too_many_arguments)]
fn plan_piece(
    p: &Piece,
    access: &[Access],
    outputs: usize,
    buffers: &[BufferInfo],
    full_dense: &[isize],
    reads_position: bool,
    draw_lanes: usize,
    target: &Target,
) -> MapPiece {
    let numel = p.numel();
    // Allocation-light: this runs on every launch, and a one-element op's whole host cost is
    // a few microseconds.
    let mut operands: Vec<PlannedOperand> = access
        .iter()
        .map(|a| {
            let w: Option<Window> = target
                .binding_limit
                .map(|_| pieces::window(a, p, target.offset_align));
            let origin: isize = p
                .start
                .iter()
                .zip(&a.strides)
                .map(|(&s, &st)| s as isize * st)
                .sum();
            PlannedOperand {
                strides: Strides::from_slice(&a.strides),
                offset: match w {
                    Some(w) => w.rel_offset,
                    None => (a.offset as isize + origin) as usize,
                },
                window: w,
                path: if is_dense(&a.strides, &p.len) {
                    Path::Contiguous
                } else {
                    Path::Strided
                },
            }
        })
        .collect();
    let base: isize = p
        .start
        .iter()
        .zip(full_dense)
        .map(|(&s, &f)| s as isize * f)
        .sum();
    let position = if !reads_position {
        Position::Unused
    } else if is_dense(full_dense, &p.len) {
        Position::Linear {
            base: base as usize,
        }
    } else {
        Position::Strided {
            base: base as usize,
            strides: Strides::from_slice(full_dense),
        }
    };
    // The tiled path: rank 2, at least 32×32, the output along the rows, an input down the
    // columns. An input constant along the rows (inner stride 0, a [n, 1] broadcast) is no
    // column walk: it is read once per row (a splat, below), never through a tile.
    let all_32_bit = access.iter().all(|a| a.itemsize == 4);
    let column_wise = |s: &[isize]| s[0].unsigned_abs() == 1 && s[1].unsigned_abs() > 1;
    let tiled = p.len.len() == 2
        && p.len[0] >= 32
        && p.len[1] >= 32
        && operands[..outputs].iter().all(|o| o.strides[1] == 1)
        && (all_32_bit || !target.tile_32bit_only)
        && (position == Position::Unused || target.tile_reads_position)
        && operands[outputs..].iter().any(|o| column_wise(&o.strides));
    if tiled {
        for (k, o) in operands.iter_mut().enumerate() {
            o.path = if k >= outputs && column_wise(&o.strides) {
                Path::Tiled
            } else {
                Path::Strided
            };
        }
    }
    // Strided operands may join a vectorized launch where the target decodes one offset per
    // vector (whole vectors within a row): inputs constant along the innermost axis (stride 0,
    // splats read once per vector) and operands contiguous along it (stride 1, whole-vector
    // accesses at the decoded offset).
    let inner = p.len.last().copied().unwrap_or(1);
    let by_rows = target.vector_rows;
    let splats = by_rows || target.vector_splats;
    let splat = |k: usize, o: &PlannedOperand| {
        splats && k >= outputs && o.path == Path::Strided && o.strides.last() == Some(&0)
    };
    // (A strided operand with stride 1 along the inner axis has more than one axis: a 1-D
    // one would be contiguous.)
    let row =
        |o: &PlannedOperand| by_rows && o.path == Path::Strided && o.strides.last() == Some(&1);
    let contiguous = operands
        .iter()
        .enumerate()
        .all(|(k, o)| o.path == Path::Contiguous || splat(k, o) || row(o));
    let any_strided = operands.iter().any(|o| o.path != Path::Contiguous);
    let (output_access, input_access) = access.split_at(outputs.min(access.len()));
    let widest = |a: &[_]| a.iter().map(|a: &Access| a.itemsize).max().unwrap_or(1);
    let (max_output_item, max_input_item) = (widest(output_access), widest(input_access));
    let max_item = max_output_item.max(max_input_item);
    let mut vector =
        if contiguous && target.vector_bytes > 0 && !matches!(position, Position::Strided { .. }) {
            match target.vector_lanes {
                0 => (target.vector_bytes / max_item).max(1),
                n if n * max_item <= target.vector_bytes => n,
                // Lanes of 64-bit values that draw (one Philox call serves them), or that are
                // only written (inputs that fit the plain vector): each store moves whole words.
                n if (draw_lanes > 1 || n * max_input_item <= target.vector_bytes)
                    && !any_strided
                    && n * max_item <= target.draw_vector_bytes =>
                {
                    n
                }
                _ => 1,
            }
        } else {
            1
        };
    // Random draws that serve more elements a Philox call than a vector holds: a wider vector
    // (two loads) so one call serves them all, where the target has one and the outputs
    // still take one store a vector. (Two stores a work item write every other vector of a
    // warp's store: i64 `randint` took 0.85 ms so on an H200, 0.57 in vectors of two whose
    // warp shares each counter's words.)
    if !any_strided
        && target.vector_lanes == 0
        && vector > 1
        && draw_lanes > vector
        && draw_lanes * max_item <= target.draw_vector_bytes
        && draw_lanes * max_output_item <= target.vector_bytes
    {
        vector = draw_lanes;
    }
    let address = |k: usize| -> u64 {
        let o = &operands[k];
        let window_start = o.window.map_or(0, |w| w.byte_offset);
        buffers.get(k).map_or(0, |b| b.address)
            + window_start
            + (o.offset * access[k].itemsize) as u64
    };
    // Contiguous operands start on a vector; row operands start every row on one.
    let aligned = |v: usize| {
        operands.iter().enumerate().all(|(k, o)| {
            let starts = address(k) % (v * access[k].itemsize) as u64 == 0;
            match o.path {
                Path::Contiguous => starts,
                _ if row(o) => {
                    starts
                        && o.strides[..o.strides.len() - 1]
                            .iter()
                            .all(|s| s.unsigned_abs() % v == 0)
                }
                _ => true,
            }
        })
    };
    if any_strided {
        // A vector must not cross a row: a splat takes one value per row, a row operand's
        // next row starts elsewhere. A target whose vectors hold a fixed count of elements
        // (WGSL's four) has no narrower vector to fall back to.
        while vector > 1 && inner % vector != 0 {
            vector = if target.vector_lanes > 0 {
                1
            } else {
                vector / 2
            };
        }
    }
    if target.vector_tail {
        while vector > 1 && !aligned(vector) {
            vector /= 2;
        }
    } else if vector > 1 && (!numel.is_multiple_of(vector) || !aligned(vector)) {
        vector = 1;
    }
    if vector > 1 {
        for o in operands.iter_mut().filter(|o| row(o)) {
            o.path = Path::Rows;
        }
    }
    let wide = target.wide_index
        && needs_wide_of(numel, &p.len, operands.iter().map(|o| o.strides.as_slice()));
    let work = if tiled {
        p.len[0].div_ceil(32) * p.len[1].div_ceil(32) * 256
    } else {
        numel.div_ceil(vector)
    };
    MapPiece {
        shape: Dims::from_slice(&p.len),
        numel,
        operands,
        position,
        vector,
        wide,
        work,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::KernelArgs;
    use crate::ir::Expr;
    use crate::{DType, Device, Tensor};

    fn gpu(limit: Option<u64>) -> Target {
        Target {
            vector_bytes: 16,
            vector_lanes: 0,
            draw_vector_bytes: 0,
            vector_tail: true,
            binding_limit: limit,
            offset_align: 256,
            ..Target::cpu(1)
        }
    }

    fn args(out: &Tensor, inputs: &[&Tensor]) -> KernelArgs {
        KernelArgs {
            outputs: vec![out.operand().unwrap()],
            inputs: inputs.iter().map(|t| t.operand().unwrap()).collect(),
            scalars: vec![],
        }
    }

    #[test]
    fn a_row_broadcast_input_joins_vectors_where_the_target_splats() {
        let dev = Device::cpu();
        let x = Tensor::zeros([6, 12], DType::F32, &dev).unwrap();
        let m = Tensor::zeros([6, 1], DType::F32, &dev).unwrap();
        let m = m.broadcast_to([6, 12]).unwrap();
        let y = Tensor::zeros([6, 12], DType::F32, &dev).unwrap();
        let a = args(&y, &[&x, &m]);
        let e = Expr::binary(
            crate::ir::BinaryOp::Sub,
            Expr::input(0, DType::F32),
            Expr::input(1, DType::F32),
        );
        let ops = MapOperands::of(&e, &a).unwrap();
        let buffers = BufferInfo::of_operands(&a);
        let splat = Target {
            vector_rows: true,
            ..gpu(None)
        };
        let p = plan(&ops, false, &buffers, &splat).unwrap();
        // 12 elements a row: vectors of 4 stay inside a row; m is read once per vector.
        assert_eq!(p.pieces[0].vector, 4);
        assert_eq!(p.pieces[0].operands[2].path, Path::Strided);
        // Rows of 6: vectors of 2.
        let (x, y) = (x.reshape([12, 6]).unwrap(), y.reshape([12, 6]).unwrap());
        let m6 = Tensor::zeros([12, 1], DType::F32, &dev).unwrap();
        let m6 = m6.broadcast_to([12, 6]).unwrap();
        let a = args(&y, &[&x, &m6]);
        let ops = MapOperands::of(&e, &a).unwrap();
        let p = plan(&ops, false, &BufferInfo::of_operands(&a), &splat).unwrap();
        assert_eq!(p.pieces[0].vector, 2);
        // Without splats (wgpu), no vectors.
        let p = plan(&ops, false, &BufferInfo::of_operands(&a), &gpu(None)).unwrap();
        assert_eq!(p.pieces[0].vector, 1);
        // Softmax's last map at 32×32 and more: the [n, 1] inputs (strides 1 and 0) are no
        // column walk, so nothing goes through tiles (it did, at 60% of copy bandwidth on the
        // H100) and the launch keeps its vectors.
        let (x, y) = (
            Tensor::zeros([64, 64], DType::F32, &dev).unwrap(),
            Tensor::zeros([64, 64], DType::F32, &dev).unwrap(),
        );
        let m = Tensor::zeros([64, 1], DType::F32, &dev).unwrap();
        let m = m.broadcast_to([64, 64]).unwrap();
        let a = args(&y, &[&x, &m, &m]);
        let e3 = Expr::binary(
            crate::ir::BinaryOp::Div,
            e.clone(),
            Expr::input(2, DType::F32),
        );
        let ops = MapOperands::of(&e3, &a).unwrap();
        for target in [&splat, &gpu(None)] {
            let p = plan(&ops, false, &BufferInfo::of_operands(&a), target).unwrap();
            assert!(!p.pieces[0].tiled(), "{:?}", p.pieces[0]);
        }
        let p = plan(&ops, false, &BufferInfo::of_operands(&a), &splat).unwrap();
        assert_eq!(p.pieces[0].vector, 4);
        assert_eq!(p.pieces[0].operands[0].path, Path::Contiguous);
        // A target that binds windows (wgpu) takes splats without whole-row operands.
        let windowed = Target {
            vector_lanes: 4,
            draw_vector_bytes: 0,
            vector_tail: false,
            vector_splats: true,
            ..gpu(Some(1 << 20))
        };
        let p = plan(&ops, false, &BufferInfo::of_operands(&a), &windowed).unwrap();
        assert_eq!(p.pieces[0].vector, 4);
        assert_eq!(p.pieces[0].operands[2].path, Path::Strided);
        assert!(p.pieces[0].operands[2].window.is_some());
        // Rows of 10 split a vector of four: no vectors there (WGSL has no vector of two), two
        // a vector where the target's vectors follow the bytes.
        let x10 = Tensor::zeros([64, 10], DType::F32, &dev).unwrap();
        let m10 = Tensor::zeros([64, 1], DType::F32, &dev).unwrap();
        let a10 = args(&x10, &[&x10, &m10.broadcast_to([64, 10]).unwrap()]);
        let sub = Expr::binary(
            crate::ir::BinaryOp::Sub,
            Expr::input(0, DType::F32),
            Expr::input(1, DType::F32),
        );
        let ops = MapOperands::of(&sub, &a10).unwrap();
        let vector = |t: &Target| plan(&ops, false, &BufferInfo::of_operands(&a10), t).unwrap();
        assert_eq!(vector(&windowed).pieces[0].vector, 1);
        assert_eq!(vector(&splat).pieces[0].vector, 2);
    }

    #[test]
    fn strided_rows_take_vectors_where_every_row_starts_aligned() {
        let dev = Device::cpu();
        let rows = Target {
            vector_rows: true,
            ..gpu(None)
        };
        let buf = Tensor::zeros([4, 32], DType::F32, &dev).unwrap();
        let x = Tensor::zeros([4, 16], DType::F32, &dev).unwrap();
        let e = Expr::input(0, DType::F32);
        let vector_of = |out: &Tensor, target: &Target| {
            let a = args(out, &[&x]);
            let ops = MapOperands::of(&e, &a).unwrap();
            plan(&ops, false, &BufferInfo::of_operands(&a), target)
                .unwrap()
                .pieces[0]
                .vector
        };
        // cat's second part: columns 16..32 of each row, reached as whole rows.
        assert_eq!(vector_of(&buf.narrow(1, 16, 16).unwrap(), &rows), 4);
        let part = buf.narrow(1, 16, 16).unwrap();
        let a = args(&part, &[&x]);
        let ops = MapOperands::of(&e, &a).unwrap();
        let p = plan(&ops, false, &BufferInfo::of_operands(&a), &rows).unwrap();
        assert_eq!(p.pieces[0].operands[0].path, Path::Rows);
        assert_eq!(p.pieces[0].operands[1].path, Path::Contiguous);
        // Rows starting one element off a vector; rows 18 apart (every other row is off).
        assert_eq!(vector_of(&buf.narrow(1, 1, 16).unwrap(), &rows), 1);
        let b18 = Tensor::zeros([4, 18], DType::F32, &dev).unwrap();
        assert_eq!(vector_of(&b18.narrow(1, 0, 16).unwrap(), &rows), 2);
        // Targets without strided vectors keep one element per work item.
        assert_eq!(vector_of(&buf.narrow(1, 16, 16).unwrap(), &gpu(None)), 1);
        // A target that binds windows (wgpu: four lanes) reaches the rows in its window.
        let windowed = Target {
            vector_lanes: 4,
            draw_vector_bytes: 0,
            vector_tail: false,
            vector_rows: true,
            ..gpu(Some(1 << 20))
        };
        let a = args(&part, &[&x]);
        let ops = MapOperands::of(&e, &a).unwrap();
        let p = plan(&ops, false, &BufferInfo::of_operands(&a), &windowed).unwrap();
        assert_eq!(p.pieces[0].vector, 4);
        assert_eq!(p.pieces[0].operands[0].path, Path::Rows);
        assert!(p.pieces[0].operands[0].window.is_some());
        let b6 = Tensor::zeros([4, 22], DType::F32, &dev).unwrap();
        assert_eq!(vector_of(&b6.narrow(1, 6, 16).unwrap(), &windowed), 1);
    }

    #[test]
    fn contiguous_operands_take_16_byte_vectors() {
        let dev = Device::cpu();
        let (x, y) = (
            Tensor::zeros([1000], DType::F16, &dev).unwrap(),
            Tensor::zeros([1000], DType::F16, &dev).unwrap(),
        );
        let a = args(&y, &[&x]);
        let e = Expr::input(0, DType::F16);
        let ops = MapOperands::of(&e, &a).unwrap();
        let p = plan(&ops, false, &BufferInfo::of_operands(&a), &gpu(None)).unwrap();
        assert_eq!((p.pieces[0].vector, p.pieces[0].work), (8, 125));
        // A misaligned start halves the vector until it fits.
        let x1 = x.narrow(0, 2, 998).unwrap();
        let y1 = y.narrow(0, 0, 998).unwrap();
        let a = args(&y1, &[&x1]);
        let ops = MapOperands::of(&e, &a).unwrap();
        assert_eq!(
            plan(&ops, false, &BufferInfo::of_operands(&a), &gpu(None))
                .unwrap()
                .pieces[0]
                .vector,
            2
        );
    }

    #[test]
    fn draws_widen_a_vector_only_while_its_outputs_take_one_store() {
        let dev = Device::cpu();
        let cuda = Target {
            draw_vector_bytes: 32,
            ..gpu(None)
        };
        let vector = |from: DType, to: DType, draw_lanes: usize| {
            let (x, y) = (
                Tensor::zeros([1024], from, &dev).unwrap(),
                Tensor::zeros([1024], to, &dev).unwrap(),
            );
            let a = args(&y, &[&x]);
            let e = Expr::input(0, from).cast(to, false);
            let mut ops = MapOperands::of(&e, &a).unwrap();
            ops.draw_lanes = draw_lanes;
            plan(&ops, false, &BufferInfo::of_operands(&a), &cuda)
                .unwrap()
                .pieces[0]
                .vector
        };
        // Stochastic rounding to bf16: eight elements a Philox call, 16 bytes stored.
        assert_eq!(vector(DType::F32, DType::BF16, 8), 8);
        // i64 drawn four a call: two a vector (four would be two stores a work item).
        assert_eq!(vector(DType::F32, DType::I64, 4), 2);
        // f32 drawn eight a call: four (32 bytes would be two stores).
        assert_eq!(vector(DType::F32, DType::F32, 8), 4);
    }

    #[test]
    fn a_target_with_fixed_lanes_vectorizes_narrow_dtypes_but_not_64_bit_ones() {
        let dev = Device::cpu();
        let wgsl = Target {
            vector_lanes: 4,
            draw_vector_bytes: 0,
            vector_tail: false,
            ..gpu(Some(1 << 20))
        };
        let vector = |from: DType, to: DType, n: usize| {
            let (x, y) = (
                Tensor::zeros([n], from, &dev).unwrap(),
                Tensor::zeros([n], to, &dev).unwrap(),
            );
            let a = args(&y, &[&x]);
            let e = Expr::input(0, from).cast(to, false);
            let ops = MapOperands::of(&e, &a).unwrap();
            let p = plan(&ops, false, &BufferInfo::of_operands(&a), &wgsl).unwrap();
            (p.pieces[0].vector, p.pieces[0].work)
        };
        // Four elements a work item whatever the width: a cast to f16 writes whole words.
        assert_eq!(vector(DType::F32, DType::F16, 1000), (4, 250));
        assert_eq!(vector(DType::U8, DType::BF16, 1000), (4, 250));
        assert_eq!(vector(DType::F16, DType::F16, 1000), (4, 250));
        // A 64-bit operand: no vectors; nor a count that is not a multiple of four.
        assert_eq!(vector(DType::F64, DType::F32, 1000).0, 1);
        assert_eq!(vector(DType::F32, DType::F16, 1002).0, 1);
        // Unless the target's draw vectors hold four 64-bit lanes and the map draws random
        // numbers (one Philox call serves them) or only writes 64-bit values (two whole
        // word vectors).
        let draws = Target {
            draw_vector_bytes: 32,
            ..wgsl.clone()
        };
        let (x, y) = (
            Tensor::zeros([1000], DType::F32, &dev).unwrap(),
            Tensor::zeros([1000], DType::I64, &dev).unwrap(),
        );
        let a = args(&y, &[&x]);
        let e = Expr::input(0, DType::F32).cast(DType::I64, false);
        let mut ops = MapOperands::of(&e, &a).unwrap();
        let buffers = BufferInfo::of_operands(&a);
        assert_eq!(
            plan(&ops, false, &buffers, &draws).unwrap().pieces[0].vector,
            4
        );
        let a64 = args(&x, &[&y]);
        let e64 = Expr::input(0, DType::I64).cast(DType::F32, false);
        let read64 = MapOperands::of(&e64, &a64).unwrap();
        let b64 = BufferInfo::of_operands(&a64);
        assert_eq!(
            plan(&read64, false, &b64, &draws).unwrap().pieces[0].vector,
            1
        );
        ops.draw_lanes = 4;
        assert_eq!(
            plan(&ops, false, &buffers, &draws).unwrap().pieces[0].vector,
            4
        );
        assert_eq!(
            plan(&ops, false, &buffers, &wgsl).unwrap().pieces[0].vector,
            1
        );
    }

    #[test]
    fn a_binding_limit_cuts_pieces_with_windows_and_positions() {
        let dev = Device::cpu();
        let out = Tensor::zeros([64, 16], DType::F32, &dev).unwrap();
        let a = args(&out, &[]);
        let e = Expr::linear_index().cast(DType::F32, false);
        let ops = MapOperands::of(&e, &a).unwrap();
        let p = plan(&ops, true, &BufferInfo::of_operands(&a), &gpu(Some(1024))).unwrap();
        assert_eq!(p.pieces.len(), 4);
        for (i, piece) in p.pieces.iter().enumerate() {
            assert_eq!(piece.position, Position::Linear { base: i * 256 });
            let w = piece.operands[0].window.unwrap();
            assert!(w.byte_size <= 1024);
            assert_eq!(
                w.byte_offset + 4 * piece.operands[0].offset as u64,
                i as u64 * 1024
            );
        }
    }
}
