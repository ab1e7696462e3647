//! Softmax along the last axis as one kernel ([`Kernel::Softmax`](crate::ir::Kernel::Softmax)):
//! its operands, the per-element expressions every backend evaluates (the ones
//! [`Tensor::softmax`](crate::Tensor::softmax) composes, so the numbers are the eager ones),
//! and the launch plan: a group of threads per row that passes over it three times (maximum,
//! sum of terms, output), keeping the row in registers, in shared memory (a long row, where the
//! target has room for it) or in cache, so memory sees one read and one write.
//!
//! ```
//! use strata_core::lower::softmax_plan::*;
//! use strata_core::target::Target;
//! use strata_core::{backend::KernelArgs, DType, Device, Tensor};
//! let dev = Device::cpu();
//! let x = Tensor::zeros([8, 4096], DType::F32, &dev).unwrap();
//! let y = Tensor::zeros([8, 4096], DType::F32, &dev).unwrap();
//! let args = KernelArgs { outputs: vec![y.operand().unwrap()], inputs: vec![x.operand().unwrap()], scalars: vec![] };
//! let ops = SoftmaxOperands::of(&args).unwrap();
//! let mut target = Target::cpu(4);
//! target.row_groups = &[1, 32, 256, 1024];
//! let plan = plan(&ops, [0, 0], &target);
//! assert_eq!((plan.rows, plan.n, plan.group, plan.staged), (8, 4096, 1024, false));
//! ```

use crate::backend::{KernelArgs, Operand};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, Expr, UnaryOp};
use crate::layout::{Dims, Strides};
use crate::target::Target;

/// The operands of a softmax: one float input and one output of its shape and dtype.
#[derive(Debug)]
pub struct SoftmaxOperands<'a> {
    /// The tensor normalized along its last axis.
    pub input: &'a Operand,
    /// The tensor written.
    pub out: &'a Operand,
    /// Rows: the product of the leading axes.
    pub rows: usize,
    /// Elements per row: the last axis.
    pub n: usize,
}

impl<'a> SoftmaxOperands<'a> {
    /// Checks `args` for a softmax.
    pub fn of(args: &'a KernelArgs) -> Result<SoftmaxOperands<'a>> {
        let ([input], [out]) = (args.inputs.as_slice(), args.outputs.as_slice()) else {
            return Err(Error::Invalid(
                "a softmax takes one input and one output".into(),
            ));
        };
        let shape = input.layout.shape();
        if out.layout.shape() != shape || out.dtype != input.dtype || !input.dtype.is_float() {
            return Err(Error::Invalid(format!(
                "a softmax writes its float input's shape and dtype: input {shape:?} {}, \
                 output {:?} {}",
                input.dtype,
                out.layout.shape(),
                out.dtype
            )));
        }
        let Some((&n, lead)) = shape.split_last() else {
            return Err(Error::Invalid(
                "a softmax needs an axis: got a scalar".into(),
            ));
        };
        Ok(SoftmaxOperands {
            input,
            out,
            rows: lead.iter().product(),
            n,
        })
    }
}

/// A row's term, `exp(x - m)` over input 0 (`x`) and input 1 (the row's maximum `m`), in
/// `dtype`: what the eager `(x - m).exp()` computes and rounds.
///
/// ```
/// use strata_core::{lower::softmax_plan::softmax_term, DType};
/// assert_eq!(softmax_term(DType::F16).dtype, DType::F16);
/// ```
pub fn softmax_term(dtype: DType) -> Expr {
    let shifted = Expr::binary(BinaryOp::Sub, Expr::input(0, dtype), Expr::input(1, dtype));
    Expr::unary(UnaryOp::Exp, shifted)
}

/// The output over input 0 (`x`), input 1 (`m`) and input 2 (the row's sum of terms `s`,
/// rounded to `dtype`): `exp(x - m) / s`, or with `log`, `(x - m) - log(s)`.
///
/// ```
/// use strata_core::{lower::softmax_plan::softmax_output, DType};
/// assert_eq!(softmax_output(DType::F32, true).max_input(), Some(2));
/// ```
pub fn softmax_output(dtype: DType, log: bool) -> Expr {
    if log {
        let shifted = Expr::binary(BinaryOp::Sub, Expr::input(0, dtype), Expr::input(1, dtype));
        Expr::binary(BinaryOp::Sub, shifted, log_of_sum(dtype))
    } else {
        Expr::binary(BinaryOp::Div, softmax_term(dtype), Expr::input(2, dtype))
    }
}

/// Log-softmax's `log(s)` over input 2 (the row's sum rounded to `dtype`): the part of
/// [`softmax_output`] that is one value a row, so a backend can compute it once a row and
/// finish each element with [`log_softmax_from_log_sum`] (the same numbers).
///
/// ```
/// use strata_core::{lower::softmax_plan::log_of_sum, DType};
/// assert_eq!(log_of_sum(DType::F32).max_input(), Some(2));
/// ```
pub fn log_of_sum(dtype: DType) -> Expr {
    Expr::unary(UnaryOp::Log, Expr::input(2, dtype))
}

/// [`softmax_output`] for log-softmax with the row's [`log_of_sum`] given as input 3:
/// `(x - m) - l`.
///
/// ```
/// use strata_core::{lower::softmax_plan::log_softmax_from_log_sum, DType};
/// assert_eq!(log_softmax_from_log_sum(DType::F16).max_input(), Some(3));
/// ```
pub fn log_softmax_from_log_sum(dtype: DType) -> Expr {
    let shifted = Expr::binary(BinaryOp::Sub, Expr::input(0, dtype), Expr::input(1, dtype));
    Expr::binary(BinaryOp::Sub, shifted, Expr::input(3, dtype))
}

/// [`softmax_output`] (not log) over a row whose terms are already computed: input 0 is the
/// term `exp(x - m)` (rounded to `dtype`, as the output's own term is), input 2 the sum `s`.
/// A backend that keeps a row's terms uses it instead of computing each term twice; the
/// numbers are the same.
///
/// ```
/// use strata_core::{lower::softmax_plan::softmax_from_term, DType};
/// assert_eq!(softmax_from_term(DType::F32).max_input(), Some(2));
/// ```
pub fn softmax_from_term(dtype: DType) -> Expr {
    Expr::binary(BinaryOp::Div, Expr::input(0, dtype), Expr::input(2, dtype))
}

/// How a softmax launch walks its rows. Strides are in elements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SoftmaxPlan {
    /// Rows (outputs of the row reductions).
    pub rows: usize,
    /// Elements per row.
    pub n: usize,
    /// The leading axes (a row's coordinates), size-1 axes dropped.
    pub outer_shape: Dims,
    /// The input's strides along `outer_shape`.
    pub in_outer: Strides,
    /// The output's strides along `outer_shape`.
    pub out_outer: Strides,
    /// The input's stride along a row.
    pub in_stride: isize,
    /// The output's stride along a row.
    pub out_stride: isize,
    /// Elements per vector load and store (1: none): both operands run contiguously along
    /// the row, `n` and every row start are multiples of it, and both bases are aligned.
    pub vector: usize,
    /// Threads that share a row (one of the target's group sizes, or its staging group).
    pub group: usize,
    /// The row is kept in shared memory between the passes (`group` is the target's
    /// `row_stage_group`): a row too long for the registers of a smaller group, short enough
    /// for the target's `row_stage_bytes`, in whole vectors.
    pub staged: bool,
}

/// The plan for `ops` on `target`. `addresses`: the byte addresses of the output's and the
/// input's first elements.
pub fn plan(ops: &SoftmaxOperands, addresses: [u64; 2], target: &Target) -> SoftmaxPlan {
    let shape = ops.input.layout.shape();
    let last = shape.len() - 1;
    let (ins, outs) = (ops.input.layout.strides(), ops.out.layout.strides());
    let mut outer_shape = Dims::new();
    let (mut in_outer, mut out_outer) = (Strides::new(), Strides::new());
    for d in (0..last).filter(|&d| shape[d] != 1) {
        outer_shape.push(shape[d]);
        in_outer.push(ins[d]);
        out_outer.push(outs[d]);
    }
    let (in_stride, out_stride) = (ins[last], outs[last]);
    let itemsize = ops.out.dtype.itemsize();
    let mut vector = if target.reduce_vectors && in_stride == 1 && out_stride == 1 {
        (target.vector_bytes / itemsize).max(1)
    } else {
        1
    };
    let fits = |v: usize| {
        let bytes = (v * itemsize) as u64;
        ops.n.is_multiple_of(v)
            && addresses.iter().all(|&a| a % bytes == 0)
            && in_outer
                .iter()
                .chain(&out_outer)
                .all(|s| s.unsigned_abs().is_multiple_of(v))
    };
    while vector > 1 && !fits(vector) {
        vector /= 2;
    }
    // A thread per row of up to 16 vectors; else enough threads that each holds at most four
    // (a row kept in registers, and many rows in flight per multiprocessor).
    let need = (ops.n / vector).div_ceil(4);
    let largest = *target.row_groups.last().unwrap_or(&1);
    let mut group = match need {
        0..=4 => 1,
        _ => target
            .row_groups
            .iter()
            .copied()
            .find(|&g| g >= need)
            .unwrap_or(largest),
    };
    // Rows for more threads than one staging group hold in registers: in shared memory where
    // they fit (measured on an H100: a [16384, 16384] f32 softmax at copy speed, 0.72 ms,
    // against 0.90 through L2 with 1,024 threads a row).
    let staged =
        vector > 1 && group > target.row_stage_group && ops.n * itemsize <= target.row_stage_bytes;
    if staged {
        group = target.row_stage_group;
    }
    SoftmaxPlan {
        rows: ops.rows,
        n: ops.n,
        outer_shape,
        in_outer,
        out_outer,
        in_stride,
        out_stride,
        vector,
        group,
        staged,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, Tensor};

    fn plan_of(x: &Tensor, y: &Tensor, addresses: [u64; 2]) -> SoftmaxPlan {
        let args = KernelArgs {
            outputs: vec![y.operand().unwrap()],
            inputs: vec![x.operand().unwrap()],
            scalars: vec![],
        };
        let ops = SoftmaxOperands::of(&args).unwrap();
        let mut target = Target::cpu(4);
        target.row_groups = &[1, 32, 256, 1024];
        target.vector_bytes = 16;
        target.reduce_vectors = true;
        target.row_stage_bytes = 64 << 10;
        target.row_stage_group = 512;
        plan(&ops, addresses, &target)
    }

    #[test]
    fn contiguous_rows_take_vectors_and_a_group_that_fits_the_row() {
        let dev = Device::cpu();
        let x = Tensor::zeros([2, 3, 256], DType::F32, &dev).unwrap();
        let p = plan_of(&x, &x, [0, 0]);
        assert_eq!((p.rows, p.n, p.vector, p.group), (6, 256, 4, 32));
        // Long rows: in shared memory up to 64 KiB in whole vectors, else a block reading
        // the row in each pass.
        let long = Tensor::zeros([2, 16384], DType::F32, &dev).unwrap();
        let p = plan_of(&long, &long, [0, 0]);
        assert_eq!((p.group, p.staged), (512, true));
        let p = plan_of(&long, &long, [0, 4]);
        assert_eq!((p.group, p.vector, p.staged), (1024, 1, false));
        let longer = Tensor::zeros([2, 16388], DType::F32, &dev).unwrap();
        let p = plan_of(&longer, &longer, [0, 0]);
        assert_eq!((p.group, p.staged), (1024, false));
        let p = plan_of(&x, &x, [0, 0]);
        assert!(!p.staged);
        let short = Tensor::zeros([2, 64], DType::F32, &dev).unwrap();
        assert_eq!(plan_of(&short, &short, [0, 0]).group, 1);
        assert_eq!(&p.outer_shape[..], &[2, 3]);
        // A misaligned base, an odd row, a transposed input: narrower vectors or none.
        assert_eq!(plan_of(&x, &x, [0, 8]).vector, 2);
        let odd = Tensor::zeros([4, 7], DType::F32, &dev).unwrap();
        assert_eq!(plan_of(&odd, &odd, [0, 0]).vector, 1);
        let t = Tensor::zeros([8, 4], DType::F32, &dev)
            .unwrap()
            .t()
            .unwrap();
        let out = Tensor::zeros([4, 8], DType::F32, &dev).unwrap();
        let p = plan_of(&t, &out, [0, 0]);
        assert_eq!((p.vector, p.in_stride, p.group), (1, 4, 1));
    }

    #[test]
    fn operands_are_checked() {
        let dev = Device::cpu();
        let x = Tensor::zeros([2, 3], DType::F32, &dev).unwrap();
        let bad = |out: &Tensor, input: &Tensor| {
            let args = KernelArgs {
                outputs: vec![out.operand().unwrap()],
                inputs: vec![input.operand().unwrap()],
                scalars: vec![],
            };
            SoftmaxOperands::of(&args).unwrap_err().to_string()
        };
        let other = Tensor::zeros([3, 2], DType::F32, &dev).unwrap();
        assert!(bad(&other, &x).contains("[3, 2]"));
        let ints = Tensor::zeros([2, 3], DType::I32, &dev).unwrap();
        assert!(bad(&ints, &ints).contains("i32"));
    }
}
