//! Elementwise ops: the one place their dtype rules live. Each op lowers to a `Map` kernel
//! whose operands are broadcast views and whose scalars are launch arguments. This file
//! collects an op's operands and decides its dtypes; the methods users call are in `methods`
//! (tables of ops with their docs), the Rust operators in `operators`.

mod methods;
mod operators;

use super::promote::{can_cast, result_type_of, DEFAULT_FLOAT};
use crate::assign::ValueRef;
use crate::dtype::{DType, Scalar};
use crate::error::{Error, Result};
use crate::fusion::defer_or_launch;
use crate::ir::{BinaryOp, Expr, Kernel, UnaryOp};
use crate::layout::{broadcast_shapes, Layout};
use crate::lower::legal::{binary_rule, unary_rule};
use crate::tensor::{launch, Tensor};

/// Operands of one elementwise op, lowered to expression leaves of one compute dtype.
pub(super) struct OpOperands {
    tensors: Vec<Tensor>,
    scalars: Vec<Scalar>,
    /// The broadcast shape (inline: recording an op allocates as little as it can).
    shape: crate::layout::Dims,
}

impl OpOperands {
    /// Collects the operands, broadcasting their shapes, and finds the device.
    pub(super) fn new<'v>(
        operands: &[ValueRef<'v>],
        what: &str,
    ) -> Result<(OpOperands, &'v Tensor)> {
        let first = operands
            .iter()
            .find_map(|v| match *v {
                ValueRef::Tensor(t) => Some(t),
                ValueRef::Scalar(_) => None,
            })
            .ok_or_else(|| Error::Invalid(format!("{what} needs at least one tensor operand")))?;
        let mut shape = crate::layout::Dims::from_slice(first.shape());
        for v in operands {
            if let ValueRef::Tensor(t) = *v {
                first.same_device(t, what)?;
                if t.shape() != &shape[..] {
                    shape = broadcast_shapes(&shape, t.shape())
                        .map_err(|e| Error::Shape(format!("{what}: {}", strip(&e))))?
                        .into();
                }
            }
        }
        let lowering = OpOperands {
            // Sized at once: growing from empty takes the slower reallocation path.
            tensors: Vec::with_capacity(operands.len()),
            scalars: vec![],
            shape,
        };
        Ok((lowering, first))
    }

    /// The leaf for `v`, converted to `compute`.
    pub(super) fn leaf(&mut self, v: ValueRef, compute: DType) -> Result<Expr> {
        Ok(match v {
            ValueRef::Tensor(t) => {
                self.tensors.push(if t.shape() == &self.shape[..] {
                    t.clone()
                } else {
                    t.broadcast_to(&self.shape[..])?
                });
                Expr::input(self.tensors.len() - 1, t.dtype()).cast(compute, false)
            }
            ValueRef::Scalar(s) => {
                self.scalars.push(s.cast(compute, false));
                Expr::scalar(self.scalars.len() - 1, compute)
            }
        })
    }

    /// The layout of a new output: axes in the memory order of the first input that is a
    /// dense permutation of the result's shape (as PyTorch preserves strides), else row-major.
    fn output_layout(&self) -> Result<Layout> {
        let dense = self.tensors.iter().find(|t| {
            t.shape() == &self.shape[..]
                && t.ndim() > 1
                && !t.is_contiguous()
                && t.strides().iter().all(|&s| s > 0)
                && t.permute_to_contiguous().is_some()
        });
        let Some(t) = dense else {
            return Layout::contiguous(&self.shape);
        };
        let order = t.layout().memory_order();
        let permuted: Vec<usize> = order.iter().map(|&a| self.shape[a]).collect();
        let mut inverse = vec![0usize; order.len()];
        for (k, &a) in order.iter().enumerate() {
            inverse[a] = k;
        }
        Layout::contiguous(&permuted)?.permuted(&inverse)
    }

    /// Writes `expr` into `out` (checked), or returns it as a new tensor: pending (recorded
    /// for fusion) where the device defers, else computed now.
    #[track_caller]
    pub(super) fn finish(
        self,
        expr: Expr,
        device_of: &Tensor,
        out: Option<&Tensor>,
        what: &'static str,
    ) -> Result<Tensor> {
        let Some(out) = out else {
            let layout = self.output_layout()?;
            let device = device_of.device();
            if !crate::autograd::needed(&self.tensors) {
                return defer_or_launch(expr, layout, self.tensors, self.scalars, device, what);
            }
            let result = defer_or_launch(
                expr.clone(),
                layout,
                self.tensors.clone(),
                self.scalars.clone(),
                device,
                what,
            )?;
            let name = crate::autograd::backward_name(what);
            if what == "relu" {
                return Ok(crate::autograd::record_relu(
                    &expr,
                    &self.tensors[0],
                    result,
                ));
            }
            return Ok(crate::autograd::record_elementwise(
                name,
                &expr,
                &self.tensors,
                &self.scalars,
                result,
            ));
        };
        check_out(out, &self.shape, expr.dtype, what)?;
        crate::autograd::refuse_write_into(out)?;
        for t in &self.tensors {
            crate::autograd::refuse_in_place_source(t, what)?;
        }
        device_of.same_device(out, what)?;
        let expr = expr.cast(out.dtype(), false);
        let inputs: Vec<&Tensor> = self.tensors.iter().collect();
        launch(Kernel::map(expr), out, &inputs, self.scalars)?;
        Ok(out.clone())
    }
}

/// The message of an error without its category prefix (for re-wrapping with context).
fn strip(e: &Error) -> String {
    let s = e.to_string();
    s.split_once(": ")
        .map_or(s.clone(), |(_, rest)| rest.to_string())
}

/// Checks an `out` tensor: the op's shape exactly, and a dtype the result may be cast to.
fn check_out(out: &Tensor, shape: &[usize], dtype: DType, what: &str) -> Result<()> {
    if out.shape() != shape {
        return Err(Error::Shape(format!(
            "{what}: the output has shape {:?}, the result has shape {shape:?}",
            out.shape()
        )));
    }
    if !can_cast(dtype, out.dtype()) {
        return Err(Error::DType(format!(
            "{what}: a result of {dtype} cannot be written into an output of {}",
            out.dtype()
        )));
    }
    Ok(())
}

/// The dtype `op` computes in, given the promoted dtype of its operands.
fn binary_compute(op: BinaryOp, promoted: DType, what: &str) -> Result<DType> {
    use BinaryOp::*;
    let float = |d: DType| if d.is_float() { d } else { DEFAULT_FLOAT };
    Ok(match op {
        Div | Atan2 => float(promoted),
        BitAnd | BitOr | BitXor if promoted.is_float() => {
            return Err(Error::DType(format!(
                "{what} is defined for integer and bool tensors, not {promoted}"
            )))
        }
        Shl | Shr if !promoted.is_int() => {
            return Err(Error::DType(format!(
                "{what} is defined for integer tensors, not {promoted}"
            )))
        }
        Sub | SubSat | FloorDiv | Rem | Pow | DivSat | AddSat | MulSat
            if promoted == DType::Bool =>
        {
            return Err(Error::DType(format!(
                "{what} is not defined for two bool operands; convert them with to_dtype, \
                 or use logical_xor for subtraction"
            )))
        }
        _ if !binary_rule(op, promoted).defined() => {
            return Err(Error::DType(format!(
                "{what} is not defined for {promoted}"
            )))
        }
        _ => promoted,
    })
}

/// Lowers `op(a, b)` and runs it, into `out` when given.
#[track_caller]
pub(super) fn binary(
    op: BinaryOp,
    a: ValueRef,
    b: ValueRef,
    out: Option<&Tensor>,
    what: &'static str,
) -> Result<Tensor> {
    let (mut l, device_of) = OpOperands::new(&[a, b], what)?;
    let compute = binary_compute(op, result_type_of([a, b]), what)?;
    let (x, y) = (l.leaf(a, compute)?, l.leaf(b, compute)?);
    l.finish(Expr::binary(op, x, y), device_of, out, what)
}

/// The dtype `op` computes in for an operand of `dtype`.
fn unary_compute(op: UnaryOp, dtype: DType, what: &str) -> Result<DType> {
    if op.float_only() && !dtype.is_float() {
        return Ok(DEFAULT_FLOAT);
    }
    match (op, dtype) {
        (UnaryOp::Neg | UnaryOp::NegSat, DType::Bool) => Err(Error::DType(format!(
            "{what} of a bool tensor is not defined; use logical_not"
        ))),
        (UnaryOp::BitNot, d) if d.is_float() => Err(Error::DType(format!(
            "{what} is defined for integer and bool tensors, not {d}"
        ))),
        (op, d) if !unary_rule(op, d).defined() => {
            Err(Error::DType(format!("{what} is not defined for {d}")))
        }
        _ => Ok(dtype),
    }
}

#[track_caller]
pub(super) fn unary(
    op: UnaryOp,
    a: &Tensor,
    out: Option<&Tensor>,
    what: &'static str,
) -> Result<Tensor> {
    let v = ValueRef::from(a);
    let (mut l, device_of) = OpOperands::new(&[v], what)?;
    let compute = unary_compute(op, a.dtype(), what)?;
    let x = l.leaf(v, compute)?;
    l.finish(Expr::unary(op, x), device_of, out, what)
}
