//! The operands of each kernel kind, checked once against the kind's contract: every backend
//! (the CPU included) takes its operands from here, in one order, instead of checking them
//! itself.

use crate::backend::{KernelArgs, Operand};
use crate::dtype::{DType, Scalar};
use crate::error::{Error, Result};
use crate::ir::{Expr, IndexKind};

/// The operands of a [`Kernel::Map`](crate::ir::Kernel::Map): one output of the expression's
/// dtype, inputs of the output's shape, and a tree in canonical form.
///
/// ```
/// use strata_core::{ir::Expr, backend::KernelArgs, lower::operands::MapOperands, DType, Device, Tensor};
/// let t = Tensor::zeros([2], DType::F32, &Device::cpu()).unwrap();
/// let args = KernelArgs { outputs: vec![t.operand().unwrap()], inputs: vec![t.operand().unwrap()], scalars: vec![] };
/// assert!(MapOperands::of(&Expr::input(0, DType::F32), &args).is_ok());
/// assert!(MapOperands::of(&Expr::input(0, DType::I8), &args).is_err());
/// ```
#[derive(Debug)]
pub struct MapOperands<'a> {
    /// The tensor written (output 0).
    pub out: &'a Operand,
    /// The further outputs of a multi-output map, each of the output's shape.
    pub also: &'a [Operand],
    /// The tensors read, each of the output's shape.
    pub inputs: &'a [Operand],
    /// The launch scalars.
    pub scalars: &'a [Scalar],
    /// The most elements one Philox call serves in the trees ([`Expr::draw_lanes`]).
    pub draw_lanes: usize,
}

impl<'a> MapOperands<'a> {
    /// Checks `args` against `expr` (see the type's docs).
    pub fn of(expr: &Expr, args: &'a KernelArgs) -> Result<MapOperands<'a>> {
        MapOperands::of_outputs(expr, &[], args)
    }

    /// Checks `args` against a multi-output map: `expr` for output 0, `also[k]` for output
    /// `k + 1`.
    ///
    /// ```
    /// use strata_core::{ir::Expr, backend::KernelArgs, lower::operands::MapOperands, DType, Device, Tensor};
    /// let t = Tensor::zeros([4], DType::F32, &Device::cpu()).unwrap();
    /// let args = KernelArgs { outputs: vec![t.operand().unwrap(), t.operand().unwrap()], inputs: vec![t.operand().unwrap()], scalars: vec![] };
    /// let x = Expr::input(0, DType::F32);
    /// assert_eq!(MapOperands::of_outputs(&x, &[x.clone()], &args).unwrap().operands().count(), 3);
    /// assert!(MapOperands::of(&x, &args).is_err()); // two outputs, one expression
    /// ```
    pub fn of_outputs(expr: &Expr, also: &[Expr], args: &'a KernelArgs) -> Result<MapOperands<'a>> {
        let Some((out, more)) = args
            .outputs
            .split_first()
            .filter(|(_, m)| m.len() == also.len())
        else {
            return Err(Error::Invalid(format!(
                "a map of {} expression{} writes as many outputs, {} were given",
                1 + also.len(),
                if also.is_empty() { "" } else { "s" },
                args.outputs.len()
            )));
        };
        for (e, o) in std::iter::once(expr).chain(also).zip(&args.outputs) {
            if o.dtype != e.dtype {
                return Err(Error::Invalid(format!(
                    "map expression of {} written to an output of {}",
                    e.dtype, o.dtype
                )));
            }
        }
        if let Some(op) = more
            .iter()
            .chain(&args.inputs)
            .find(|op| op.layout.shape() != out.layout.shape())
        {
            return Err(Error::Shape(format!(
                "map operand of shape {:?} for an output of shape {:?}",
                op.layout.shape(),
                out.layout.shape()
            )));
        }
        for e in std::iter::once(expr).chain(also) {
            if let Some(k) = e.max_input().filter(|&k| k >= args.inputs.len()) {
                return Err(Error::Invalid(format!(
                    "map reads input {k}, but {} were given",
                    args.inputs.len()
                )));
            }
            super::legal::check(e)?;
        }
        Ok(MapOperands {
            out,
            also: more,
            inputs: &args.inputs,
            scalars: &args.scalars,
            draw_lanes: std::iter::once(expr)
                .chain(also)
                .map(Expr::draw_lanes)
                .max()
                .unwrap_or(1),
        })
    }

    /// Every operand in plan order: the outputs, then the inputs.
    pub fn operands(&self) -> impl Iterator<Item = &'a Operand> + Clone {
        std::iter::once(self.out)
            .chain(self.also)
            .chain(self.inputs)
    }

    /// How many outputs the map writes.
    pub fn outputs(&self) -> usize {
        1 + self.also.len()
    }
}

/// The operands of a [`Kernel::Reduce`](crate::ir::Kernel::Reduce): one input whose trailing
/// `reduced_axes` axes are reduced into one output of the input's leading axes (and, for a
/// fused map, more inputs of exactly the first one's layout and item size).
///
/// ```
/// use strata_core::{backend::KernelArgs, lower::operands::ReduceOperands, DType, Device, Tensor};
/// let dev = Device::cpu();
/// let (x, y) = (Tensor::zeros([3, 4], DType::F32, &dev).unwrap(), Tensor::zeros([3], DType::F32, &dev).unwrap());
/// let args = KernelArgs { outputs: vec![y.operand().unwrap()], inputs: vec![x.operand().unwrap()], scalars: vec![] };
/// let r = ReduceOperands::of(1, &args).unwrap();
/// assert_eq!((r.outputs, r.extent), (3, 4));
/// assert!(ReduceOperands::of(2, &args).is_err());
/// ```
#[derive(Debug)]
pub struct ReduceOperands<'a> {
    /// The tensor read (the first of a fused map's inputs).
    pub input: &'a Operand,
    /// A fused map's other inputs: laid out like `input`, or one value per output (see
    /// [`per_output`]), or one value per position in a row (see [`per_position`]).
    pub more: &'a [Operand],
    /// The tensor written: the input's leading axes.
    pub out: &'a Operand,
    /// How many leading (kept) axes the input has.
    pub kept: usize,
    /// Output elements.
    pub outputs: usize,
    /// Elements reduced into each output.
    pub extent: usize,
}

impl<'a> ReduceOperands<'a> {
    /// Checks `args` for a reduction of the trailing `reduced_axes` axes.
    pub fn of(reduced_axes: usize, args: &'a KernelArgs) -> Result<ReduceOperands<'a>> {
        let (Some((input, more)), [out]) = (args.inputs.split_first(), args.outputs.as_slice())
        else {
            return Err(Error::Invalid(
                "a reduction takes an input and one output".into(),
            ));
        };
        let shape = input.layout.shape();
        let kept = shape.len().checked_sub(reduced_axes).ok_or_else(|| {
            Error::Invalid(format!(
                "cannot reduce {reduced_axes} axes of a rank-{} input",
                shape.len()
            ))
        })?;
        if out.layout.shape() != &shape[..kept] {
            return Err(Error::Shape(format!(
                "reduction output {:?} for input {shape:?} over its last {reduced_axes} axes",
                out.layout.shape()
            )));
        }
        if let Some(m) = more.iter().find(|m| {
            !per_output(m, out, kept) && !alike(m, input) && !per_position(m, input, kept)
        }) {
            return Err(Error::Invalid(format!(
                "a fused reduction's inputs are laid out like the first ({:?} {}), hold one \
                 value per output (laid out like the output, {:?}) or one value per position \
                 in a row (contiguous rows, broadcast along the kept axes); got {:?} {}",
                input.layout, input.dtype, out.layout, m.layout, m.dtype
            )));
        }
        Ok(ReduceOperands {
            input,
            more,
            out,
            kept,
            outputs: shape[..kept].iter().product(),
            extent: shape[kept..].iter().product(),
        })
    }
}

/// The structure of a map fused into a reduction (map→reduce), what a backend's generated
/// source depends on: the tree, its inputs' dtypes (input 0 is the reduction's input), which
/// inputs hold one value per output ([`per_output`], read at the output's position) and which
/// one value per position in a row ([`per_position`], read at the element's position along
/// the reduced axes: a layer norm's weight in a row sum, per-row statistics in a column sum),
/// and the scalars' dtypes.
///
/// ```
/// use strata_core::ir::Expr;
/// use strata_core::backend::KernelArgs;
/// use strata_core::lower::operands::{ReduceMap, ReduceOperands};
/// use strata_core::{DType, Device, Tensor};
/// let dev = Device::cpu();
/// let x = Tensor::zeros([3, 4], DType::F32, &dev).unwrap();
/// let m = Tensor::zeros([3, 1], DType::F32, &dev).unwrap().broadcast_to([3, 4]).unwrap();
/// let y = Tensor::zeros([3], DType::F32, &dev).unwrap();
/// let args = KernelArgs {
///     outputs: vec![y.operand().unwrap()],
///     inputs: vec![x.operand().unwrap(), m.operand().unwrap()],
///     scalars: vec![],
/// };
/// let ops = ReduceOperands::of(1, &args).unwrap();
/// let map = ReduceMap::of(&Expr::input(0, DType::F32), &ops, &args);
/// assert_eq!(map.per_output, vec![false, true]);
/// assert_eq!(map.per_position, vec![false, false]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReduceMap {
    /// The tree evaluated per element.
    pub expr: Expr,
    /// Its inputs' dtypes, input 0 first.
    pub inputs: Vec<DType>,
    /// Per input, whether it holds one value per output.
    pub per_output: Vec<bool>,
    /// Per input, whether it holds one value per position in a row: element `j` of the
    /// reduced axes (row-major) reads its element `j`, whichever row it is in.
    pub per_position: Vec<bool>,
    /// Its scalars' dtypes.
    pub scalars: Vec<DType>,
}

impl ReduceMap {
    /// The structure of `expr` fused into the reduction `ops` of `args`.
    pub fn of(expr: &Expr, ops: &ReduceOperands, args: &KernelArgs) -> ReduceMap {
        let inputs = std::iter::once(ops.input).chain(ops.more);
        ReduceMap {
            expr: expr.clone(),
            inputs: inputs.clone().map(|o| o.dtype).collect(),
            per_output: inputs
                .clone()
                .map(|o| o.layout != ops.input.layout && per_output(o, ops.out, ops.kept))
                .collect(),
            per_position: inputs
                .map(|o| {
                    o.layout != ops.input.layout
                        && !per_output(o, ops.out, ops.kept)
                        && per_position(o, ops.input, ops.kept)
                })
                .collect(),
            scalars: args.scalars.iter().map(|s| s.dtype()).collect(),
        }
    }
}

/// True when `m` has `input`'s layout and item size (read at the same offsets).
fn alike(m: &Operand, input: &Operand) -> bool {
    m.layout == input.layout && m.dtype.itemsize() == input.dtype.itemsize()
}

/// True when `m` holds one value per output of a reduction keeping `kept` leading axes: zero
/// strides along the reduced axes and the output's strides along the kept ones (a keepdim
/// result broadcast back, as softmax and var read theirs), so it is read at the output's
/// offset.
///
/// ```
/// use strata_core::{lower::operands::per_output, DType, Device, Tensor};
/// let dev = Device::cpu();
/// let x = Tensor::zeros([3, 4], DType::F32, &dev).unwrap();
/// let m = Tensor::zeros([3, 1], DType::F32, &dev).unwrap().broadcast_to([3, 4]).unwrap();
/// let y = Tensor::zeros([3], DType::F32, &dev).unwrap();
/// assert!(per_output(&m.operand().unwrap(), &y.operand().unwrap(), 1));
/// assert!(!per_output(&x.operand().unwrap(), &y.operand().unwrap(), 1));
/// ```
pub fn per_output(m: &Operand, out: &Operand, kept: usize) -> bool {
    per_output_layout(&m.layout, &out.layout, kept)
}

/// [`per_output`] for layouts (no buffer needed: core asks before a pending input runs).
///
/// ```
/// use strata_core::{lower::operands::per_output_layout, Layout};
/// let m = Layout::new(vec![3, 4], vec![1, 0], 0).unwrap();
/// assert!(per_output_layout(&m, &Layout::contiguous(&[3]).unwrap(), 1));
/// ```
pub fn per_output_layout(
    m: &crate::layout::Layout,
    out: &crate::layout::Layout,
    kept: usize,
) -> bool {
    let (shape, strides) = (m.shape(), m.strides());
    kept <= shape.len()
        && strides[kept..].iter().all(|&s| s == 0)
        && shape[..kept] == *out.shape()
        && strides[..kept]
            .iter()
            .zip(out.strides())
            .zip(out.shape())
            .all(|((&a, &b), &n)| a == b || n == 1)
}

/// True when `m` holds one value per position in a row of a reduction of `input` keeping
/// `kept` leading axes: `input`'s shape, zero strides along the kept axes and contiguous
/// (row-major) along the reduced ones, so position `j` of every row is `m`'s element `j` (a
/// layer norm's weight broadcast over the rows; a column sum's per-row statistics, its axes
/// permuted).
///
/// ```
/// use strata_core::{lower::operands::per_position, DType, Device, Tensor};
/// let dev = Device::cpu();
/// let x = Tensor::zeros([3, 4], DType::F32, &dev).unwrap();
/// let w = Tensor::zeros([4], DType::F32, &dev).unwrap().broadcast_to([3, 4]).unwrap();
/// assert!(per_position(&w.operand().unwrap(), &x.operand().unwrap(), 1));
/// assert!(!per_position(&x.operand().unwrap(), &x.operand().unwrap(), 1));
/// ```
pub fn per_position(m: &Operand, input: &Operand, kept: usize) -> bool {
    per_position_layout(&m.layout, &input.layout, kept)
}

/// [`per_position`] for layouts.
///
/// ```
/// use strata_core::{lower::operands::per_position_layout, Layout};
/// let w = Layout::new(vec![3, 4], vec![0, 1], 8).unwrap();
/// assert!(per_position_layout(&w, &Layout::contiguous(&[3, 4]).unwrap(), 1));
/// ```
pub fn per_position_layout(
    m: &crate::layout::Layout,
    rows: &crate::layout::Layout,
    kept: usize,
) -> bool {
    let (shape, strides) = (m.shape(), m.strides());
    if kept > shape.len() || shape != rows.shape() || strides[..kept].iter().any(|&s| s != 0) {
        return false;
    }
    // Row-major over the reduced axes (an axis of one element may have any stride).
    let mut step = 1;
    for (&n, &s) in shape[kept..].iter().zip(&strides[kept..]).rev() {
        if n != 1 && s != step as isize {
            return false;
        }
        step *= n;
    }
    true
}

/// The operands of a [`Kernel::Matmul`](crate::ir::Kernel::Matmul):
/// `A [batch, m, k] · B [batch, k, n] → C [batch, m, n]` with scalars α and β.
///
/// ```
/// use strata_core::{backend::KernelArgs, lower::operands::MatmulOperands, DType, Device, Scalar, Tensor};
/// let dev = Device::cpu();
/// let a = Tensor::zeros([1, 2, 3], DType::F32, &dev).unwrap();
/// let b = Tensor::zeros([1, 3, 4], DType::F32, &dev).unwrap();
/// let c = Tensor::zeros([1, 2, 4], DType::F32, &dev).unwrap();
/// let args = KernelArgs {
///     outputs: vec![c.operand().unwrap()],
///     inputs: vec![a.operand().unwrap(), b.operand().unwrap()],
///     scalars: vec![Scalar::F32(1.0), Scalar::F32(0.0)],
/// };
/// assert_eq!(MatmulOperands::of(&args).unwrap().dims, (1, 2, 3, 4));
/// ```
#[derive(Debug)]
pub struct MatmulOperands<'a> {
    /// `A [batch, m, k]`.
    pub a: &'a Operand,
    /// `B [batch, k, n]`.
    pub b: &'a Operand,
    /// `C [batch, m, n]`, written.
    pub c: &'a Operand,
    /// α.
    pub alpha: Scalar,
    /// β (0: `C` is not read).
    pub beta: Scalar,
    /// `(batch, m, k, n)`.
    pub dims: (usize, usize, usize, usize),
}

impl<'a> MatmulOperands<'a> {
    /// Splits `args` into the matmul's operands, or `Err` naming the shapes that do not fit.
    ///
    /// ```
    /// use strata_core::{backend::KernelArgs, lower::operands::MatmulOperands};
    /// let args = KernelArgs { outputs: vec![], inputs: vec![], scalars: vec![] };
    /// assert!(MatmulOperands::of(&args).is_err());
    /// ```
    pub fn of(args: &'a KernelArgs) -> Result<MatmulOperands<'a>> {
        let ([a, b], [c], [alpha, beta]) = (
            args.inputs.as_slice(),
            args.outputs.as_slice(),
            args.scalars.as_slice(),
        ) else {
            return Err(Error::Invalid(
                "a matmul takes inputs A and B, output C, and scalars α and β".into(),
            ));
        };
        let (sa, sb, sc) = (a.layout.shape(), b.layout.shape(), c.layout.shape());
        if sa.len() != 3
            || sb.len() != 3
            || sc.len() != 3
            || sa[2] != sb[1]
            || sa[1] != sc[1]
            || sb[2] != sc[2]
            || sa[0] != sc[0]
            || sb[0] != sc[0]
        {
            return Err(Error::Shape(format!(
                "matmul operands {sa:?} @ {sb:?} -> {sc:?} do not fit"
            )));
        }
        if a.dtype != c.dtype || b.dtype != c.dtype {
            return Err(Error::DType(format!(
                "matmul operands of {}, {} and {}: core converts A and B to C's dtype",
                a.dtype, b.dtype, c.dtype
            )));
        }
        Ok(MatmulOperands {
            a,
            b,
            c,
            alpha: *alpha,
            beta: *beta,
            dims: (sc[0], sc[1], sa[2], sc[2]),
        })
    }
}

/// The operands of a [`Kernel::Index`](crate::ir::Kernel::Index), in one order for every kind:
/// inputs `[src, index]` and the output (and a gather's range flag). All share one rank;
/// `index` holds i64; `src` has the output's dtype.
///
/// ```
/// use strata_core::{ir::IndexKind, backend::KernelArgs, lower::operands::IndexOperands, DType, Device, Tensor};
/// let dev = Device::cpu();
/// let src = Tensor::zeros([3, 4], DType::F32, &dev).unwrap();
/// let idx = Tensor::zeros([2, 4], DType::I64, &dev).unwrap();
/// let out = Tensor::zeros([2, 4], DType::F32, &dev).unwrap();
/// let flag = Tensor::zeros([1], DType::U32, &dev).unwrap();
/// let args = KernelArgs { outputs: vec![out.operand().unwrap(), flag.operand().unwrap()], inputs: vec![src.operand().unwrap(), idx.operand().unwrap()], scalars: vec![] };
/// let ops = IndexOperands::of(IndexKind::Gather, 0, &args).unwrap();
/// assert_eq!(ops.space(), &[2, 4]);
/// assert!(ops.flag.is_some());
/// ```
#[derive(Debug)]
pub struct IndexOperands<'a> {
    /// Gather, scatter or scatter-add.
    pub kind: IndexKind,
    /// The axis the index values select along.
    pub axis: usize,
    /// The values read: the source of a gather, the values of a scatter.
    pub src: &'a Operand,
    /// The positions along `axis` (i64, in range: core checks them).
    pub index: &'a Operand,
    /// The tensor written (read too by a scatter-add).
    pub out: &'a Operand,
    /// A gather's range flag (one u32): negative index values then count from the end of the
    /// axis, and one still outside it sets the flag to 1. `None`: core checked the range.
    pub flag: Option<&'a Operand>,
}

impl<'a> IndexOperands<'a> {
    /// Checks `args` for an index kernel of `kind` along `axis`.
    pub fn of(kind: IndexKind, axis: usize, args: &'a KernelArgs) -> Result<IndexOperands<'a>> {
        let ([src, index], [out, flag @ ..]) = (args.inputs.as_slice(), args.outputs.as_slice())
        else {
            return Err(Error::Invalid(
                "an index kernel takes inputs [src, index] and one output".into(),
            ));
        };
        let flag = match flag {
            [] => None,
            [f] if kind == IndexKind::Gather && f.dtype == DType::U32 && f.layout.numel() == 1 => {
                Some(f)
            }
            _ => {
                return Err(Error::Invalid(format!(
                    "{kind:?} takes one output{}",
                    if kind == IndexKind::Gather {
                        " and a one-element u32 range flag"
                    } else {
                        ""
                    }
                )))
            }
        };
        if index.dtype != DType::I64 {
            return Err(Error::DType(format!(
                "index tensors hold i64, not {}",
                index.dtype
            )));
        }
        if src.dtype != out.dtype {
            return Err(Error::DType(format!(
                "{kind:?} moves one dtype: core converts {} to {} first",
                src.dtype, out.dtype
            )));
        }
        let rank = out.layout.ndim();
        if axis >= rank.max(1) || [src, index].iter().any(|o| o.layout.ndim() != rank) {
            return Err(Error::Shape(format!(
                "{kind:?} along axis {axis} of operands of ranks {}, {} and {rank}",
                src.layout.ndim(),
                index.layout.ndim()
            )));
        }
        Ok(IndexOperands {
            kind,
            axis,
            src,
            index,
            out,
            flag,
        })
    }

    /// The iteration space: the output's shape for a gather, the index's for a scatter.
    pub fn space(&self) -> &'a [usize] {
        match self.kind {
            IndexKind::Gather => self.out.layout.shape(),
            IndexKind::Scatter | IndexKind::ScatterAdd => self.index.layout.shape(),
        }
    }
}
