//! Layer norm as one kernel each way ([`Kernel::LayerNorm`](crate::ir::Kernel::LayerNorm),
//! [`Kernel::LayerNormBackward`](crate::ir::Kernel::LayerNormBackward)): their operands,
//! checked once, and the launch plan a GPU backend renders. A block of threads takes a row at
//! a time; each thread keeps its share of the row (`x`, and backward `g`; `γ` and `β` for every
//! row) in registers from the row's sums to its output, so memory sees each input row read
//! once and each output row written once — backward, where the composition makes five passes
//! (the statistics' uses, `Σĝ`, `dx`'s reduction and map, the two column sums). Backward, each
//! thread also keeps running sums of its columns (`g·x̂` and `g`) over the block's rows, stored
//! once at the end: γ's and β's gradients are then a column sum over the blocks (`parts`), not
//! over the rows.
//!
//! ```
//! use strata_core::lower::layer_norm_plan::{longest_row, threads, PER_THREAD};
//! assert_eq!(threads(4096), 512);
//! assert_eq!(threads(10), 32);
//! assert_eq!(longest_row(1024), 1024 * PER_THREAD);
//! ```

use crate::backend::{KernelArgs, Operand};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::target::Target;

/// Elements of a row each thread keeps in registers (with `γ` and two column sums: about 60
/// registers a thread, so a multiprocessor holds half its threads' worth of such blocks).
pub const PER_THREAD: usize = 8;

/// The longest row a backend whose blocks hold up to `max_threads` threads takes.
pub fn longest_row(max_threads: usize) -> usize {
    max_threads * PER_THREAD
}

/// Threads of the block that takes a row of `n` elements: a power of two, at least a warp,
/// each keeping at most [`PER_THREAD`] elements.
pub fn threads(n: usize) -> usize {
    n.div_ceil(PER_THREAD).next_power_of_two().max(32)
}

/// How many blocks share the rows (each its rows `p, p + parts, …` and its row of the column
/// sums): enough to fill `target` with blocks of [`threads`]`(n)` keeping
/// [`PER_THREAD`] elements a thread (half its threads), at most one a row.
///
/// ```
/// use strata_core::lower::layer_norm_plan::parts;
/// use strata_core::target::Target;
/// let t = Target { parallel_slots: 132 * 2048, ..Target::cpu(1) };
/// assert_eq!(parts(65536, 4096, &t), 264);
/// assert_eq!(parts(10, 4096, &t), 10);
/// assert_eq!(parts(0, 4096, &t), 1);
/// ```
pub fn parts(rows: usize, n: usize, target: &Target) -> usize {
    (target.parallel_slots / (2 * threads(n))).clamp(1, rows.max(1))
}

/// The operands of a layer norm's backward, checked.
#[derive(Debug)]
pub struct LayerNormOperands<'a> {
    /// The normalized input, `[rows, n]`.
    pub x: &'a Operand,
    /// The upstream gradient, `[rows, n]`.
    pub g: &'a Operand,
    /// Each row's mean, `[rows]`.
    pub mean: &'a Operand,
    /// Each row's `1 / sqrt(var + eps)`, `[rows]`.
    pub rstd: &'a Operand,
    /// `γ`, `[n]`, where given.
    pub weight: Option<&'a Operand>,
    /// The input's gradient, `[rows, n]`.
    pub dx: &'a Operand,
    /// The column sums of `g·x̂` and of `g`, each `[parts, n]`, where asked for.
    pub columns: Option<[&'a Operand; 2]>,
    /// Rows.
    pub rows: usize,
    /// Elements per row.
    pub n: usize,
    /// The dtype of `x`, `g`, the statistics, `γ` and `dx`.
    pub dtype: DType,
}

impl<'a> LayerNormOperands<'a> {
    /// Checks `args` for `LayerNormBackward { weight, columns }`.
    pub fn of(args: &'a KernelArgs, weight: bool, columns: bool) -> Result<LayerNormOperands<'a>> {
        let (ins, outs) = (args.inputs.as_slice(), args.outputs.as_slice());
        if ins.len() != 4 + weight as usize || outs.len() != 1 + 2 * columns as usize {
            return Err(Error::Invalid(format!(
                "a layer norm's backward (weight {weight}, columns {columns}) takes {} inputs \
                 and {} outputs: got {} and {}",
                4 + weight as usize,
                1 + 2 * columns as usize,
                ins.len(),
                outs.len()
            )));
        }
        let (x, dtype) = (&ins[0], ins[0].dtype);
        let [rows, n] = *x.layout.shape() else {
            return Err(Error::Invalid(format!(
                "a layer norm's backward takes rows [rows, n]: got x of shape {:?}",
                x.layout.shape()
            )));
        };
        let acc = dtype.accumulator();
        let mut expected: Vec<(&str, &Operand, Vec<usize>, DType)> = vec![
            ("g", &ins[1], vec![rows, n], dtype),
            ("mean", &ins[2], vec![rows], dtype),
            ("rstd", &ins[3], vec![rows], dtype),
            ("dx", &outs[0], vec![rows, n], dtype),
        ];
        if weight {
            expected.push(("weight", &ins[4], vec![n], dtype));
        }
        let parts = outs.get(1).and_then(|o| o.layout.shape().first().copied());
        if columns {
            for (name, o) in [("Σ g·x̂", &outs[1]), ("Σ g", &outs[2])] {
                expected.push((name, o, vec![parts.unwrap_or(0).max(1), n], acc));
            }
        }
        for (name, op, shape, want) in
            std::iter::once(("x", x, vec![rows, n], dtype)).chain(expected)
        {
            if op.layout.shape() != shape.as_slice()
                || op.dtype != want
                || !op.layout.is_contiguous()
                || !want.is_float()
            {
                return Err(Error::Invalid(format!(
                    "a layer norm's backward takes {name} contiguous of shape {shape:?} and \
                     float dtype {want}: got shape {:?}, strides {:?}, dtype {}",
                    op.layout.shape(),
                    op.layout.strides(),
                    op.dtype
                )));
            }
        }
        Ok(LayerNormOperands {
            x,
            g: &ins[1],
            mean: &ins[2],
            rstd: &ins[3],
            weight: weight.then(|| &ins[4]),
            dx: &outs[0],
            columns: columns.then(|| [&outs[1], &outs[2]]),
            rows,
            n,
            dtype,
        })
    }
}

/// The operands of a layer norm (forward), checked.
#[derive(Debug)]
pub struct LayerNormForwardOperands<'a> {
    /// The input, `[rows, n]`.
    pub x: &'a Operand,
    /// `γ`, `[n]`, where given.
    pub weight: Option<&'a Operand>,
    /// `β`, `[n]`, where given.
    pub bias: Option<&'a Operand>,
    /// The output, `[rows, n]`.
    pub y: &'a Operand,
    /// Each row's mean, `[rows]`.
    pub mean: &'a Operand,
    /// Each row's `1 / sqrt(var + eps)`, `[rows]`.
    pub rstd: &'a Operand,
    /// Rows.
    pub rows: usize,
    /// Elements per row.
    pub n: usize,
    /// The dtype of every operand.
    pub dtype: DType,
}

impl<'a> LayerNormForwardOperands<'a> {
    /// Checks `args` for `LayerNorm { weight, bias }`.
    ///
    /// ```
    /// use strata_core::lower::layer_norm_plan::LayerNormForwardOperands;
    /// use strata_core::{backend::KernelArgs, DType, Device, Scalar, Tensor};
    /// let dev = Device::cpu();
    /// let z = |s: &[usize]| Tensor::zeros(s.to_vec(), DType::F32, &dev).unwrap().operand().unwrap();
    /// let args = KernelArgs {
    ///     outputs: vec![z(&[3, 8]), z(&[3]), z(&[3])],
    ///     inputs: vec![z(&[3, 8]), z(&[8])],
    ///     scalars: vec![Scalar::F32(1e-5)],
    /// };
    /// let ops = LayerNormForwardOperands::of(&args, true, false).unwrap();
    /// assert_eq!((ops.rows, ops.n), (3, 8));
    /// assert!(LayerNormForwardOperands::of(&args, true, true).is_err());
    /// ```
    pub fn of(
        args: &'a KernelArgs,
        weight: bool,
        bias: bool,
    ) -> Result<LayerNormForwardOperands<'a>> {
        let (ins, outs) = (args.inputs.as_slice(), args.outputs.as_slice());
        let want_ins = 1 + weight as usize + bias as usize;
        if ins.len() != want_ins || outs.len() != 3 || args.scalars.len() != 1 {
            return Err(Error::Invalid(format!(
                "a layer norm (weight {weight}, bias {bias}) takes {want_ins} inputs, 3 outputs \
                 and eps: got {} inputs, {} outputs and {} scalars",
                ins.len(),
                outs.len(),
                args.scalars.len()
            )));
        }
        let (x, dtype) = (&ins[0], ins[0].dtype);
        let [rows, n] = *x.layout.shape() else {
            return Err(Error::Invalid(format!(
                "a layer norm takes rows [rows, n]: got x of shape {:?}",
                x.layout.shape()
            )));
        };
        let mut expected: Vec<(&str, &Operand, Vec<usize>)> = vec![
            ("x", x, vec![rows, n]),
            ("y", &outs[0], vec![rows, n]),
            ("mean", &outs[1], vec![rows]),
            ("rstd", &outs[2], vec![rows]),
        ];
        for (name, op) in ["weight", "bias"].iter().zip(&ins[1..]) {
            expected.push((name, op, vec![n]));
        }
        for (name, op, shape) in expected {
            if op.layout.shape() != shape.as_slice()
                || op.dtype != dtype
                || !op.layout.is_contiguous()
                || !dtype.is_float()
            {
                return Err(Error::Invalid(format!(
                    "a layer norm takes {name} contiguous of shape {shape:?} and float dtype \
                     {dtype}: got shape {:?}, strides {:?}, dtype {}",
                    op.layout.shape(),
                    op.layout.strides(),
                    op.dtype
                )));
            }
        }
        Ok(LayerNormForwardOperands {
            x,
            weight: weight.then(|| &ins[1]),
            bias: bias.then(|| &ins[1 + weight as usize]),
            y: &outs[0],
            mean: &outs[1],
            rstd: &outs[2],
            rows,
            n,
            dtype,
        })
    }
}

/// How a GPU backend launches a layer norm, either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerNormPlan {
    /// Threads of a block (a power of two, at least 32).
    pub threads: usize,
    /// Elements of a row each thread keeps: a multiple of `vector`, at most
    /// [`PER_THREAD`]; thread `t`'s are the vectors `t, t + threads, …` of the row.
    pub per_thread: usize,
    /// Elements per vector load and store (1: none).
    pub vector: usize,
    /// Blocks (the column sums' rows).
    pub parts: usize,
}

/// Plans `ops` on `target`, whose operands start at `addresses` (a vector load needs each
/// row to start on a vector).
///
/// ```
/// use strata_core::lower::layer_norm_plan::{plan, LayerNormOperands};
/// use strata_core::target::Target;
/// use strata_core::{backend::KernelArgs, DType, Device, Tensor};
/// let dev = Device::cpu();
/// let z = |s: &[usize], d| Tensor::zeros(s.to_vec(), d, &dev).unwrap().operand().unwrap();
/// let args = KernelArgs {
///     outputs: vec![z(&[64, 4096], DType::F32)],
///     inputs: vec![z(&[64, 4096], DType::F32), z(&[64, 4096], DType::F32), z(&[64], DType::F32), z(&[64], DType::F32)],
///     scalars: vec![],
/// };
/// let ops = LayerNormOperands::of(&args, false, false).unwrap();
/// let t = Target { vector_bytes: 16, parallel_slots: 132 * 2048, ..Target::cpu(1) };
/// let p = plan(&ops, &[0, 256, 512], &t);
/// assert_eq!((p.threads, p.per_thread, p.vector, p.parts), (512, 8, 4, 64));
/// ```
pub fn plan(ops: &LayerNormOperands, addresses: &[u64], target: &Target) -> LayerNormPlan {
    let parts = match ops.columns {
        Some([c, _]) => c.layout.shape()[0],
        None => parts(ops.rows, ops.n, target),
    };
    rows_plan(ops.n, ops.dtype, parts, addresses, target)
}

/// Plans a layer norm's forward `ops` on `target` (as [`plan`]).
pub fn forward_plan(
    ops: &LayerNormForwardOperands,
    addresses: &[u64],
    target: &Target,
) -> LayerNormPlan {
    let parts = parts(ops.rows, ops.n, target);
    rows_plan(ops.n, ops.dtype, parts, addresses, target)
}

/// Rows of `n` elements of `dtype` over `parts` blocks.
fn rows_plan(
    n: usize,
    dtype: DType,
    parts: usize,
    addresses: &[u64],
    target: &Target,
) -> LayerNormPlan {
    let size = dtype.itemsize();
    let lanes = (target.vector_bytes / size).clamp(1, 4);
    let aligned = |v: usize| {
        n.is_multiple_of(v)
            && addresses
                .iter()
                .all(|a| a.is_multiple_of((v * size) as u64))
    };
    let vector = [lanes, 2, 1]
        .into_iter()
        .find(|&v| v <= lanes && aligned(v))
        .unwrap_or(1);
    let threads = threads(n);
    LayerNormPlan {
        threads,
        per_thread: n.div_ceil(threads * vector) * vector,
        vector,
        parts,
    }
}
