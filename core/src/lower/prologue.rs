//! A reduction with a row prologue ([`RowPrologue`]) as two launches: the prologue (a max or min of the same rows) into
//! output 1, then the main one, whose map reads that output through input `result`. This is
//! the definition of its numbers; a backend that keeps the row on chip between the two
//! passes (CUDA) computes the same ones, and the others run these two launches.
//!
//! ```
//! use strata_core::ir::{BinaryOp, Expr, Kernel, RowPrologue, ReduceOp};
//! use strata_core::backend::KernelArgs;
//! use strata_core::{DType, Device, Tensor};
//! let dev = Device::cpu();
//! let x = Tensor::zeros([2, 4], DType::F32, &dev)?;
//! let m = Tensor::zeros([2], DType::F32, &dev)?;
//! let s = Tensor::zeros([2], DType::F32, &dev)?;
//! let m_read = m.reshape([2, 1])?.broadcast_to([2, 4])?;
//! let map = Expr::binary(BinaryOp::Sub, Expr::input(0, DType::F32), Expr::input(1, DType::F32));
//! let prologue = Some(RowPrologue { op: ReduceOp::Max, source: 0, result: 1 });
//! let kernel = Kernel::Reduce { op: ReduceOp::Sum, reduced_axes: 1, acc: DType::F32, map: Some(map), prologue };
//! let args = KernelArgs {
//!     outputs: vec![s.operand()?, m.operand()?],
//!     inputs: vec![x.operand()?, m_read.operand()?],
//!     scalars: vec![],
//! };
//! let [(first, a), (second, b)] = strata_core::lower::prologue::split(&kernel, &args)?;
//! assert!(matches!(first, Kernel::Reduce { op: ReduceOp::Max, map: None, .. }));
//! assert!(matches!(second, Kernel::Reduce { op: ReduceOp::Sum, prologue: None, .. }));
//! assert_eq!((a.inputs.len(), a.outputs.len(), b.inputs.len(), b.outputs.len()), (1, 1, 2, 1));
//! # Ok::<(), strata_core::Error>(())
//! ```

use crate::backend::KernelArgs;
use crate::error::{Error, Result};
use crate::ir::{Kernel, RowPrologue};

/// `kernel` (a `Reduce` with a prologue) as its two launches, in order; an `Err` for any other
/// kernel or for operands that do not match the prologue.
pub fn split(kernel: &Kernel, args: &KernelArgs) -> Result<[(Kernel, KernelArgs); 2]> {
    let &Kernel::Reduce {
        op,
        reduced_axes,
        acc,
        ref map,
        prologue:
            Some(RowPrologue {
                op: prologue_op,
                source,
                result,
            }),
    } = kernel
    else {
        return Err(Error::Invalid(
            "internal error: only a reduction with a row prologue is split in two".into(),
        ));
    };
    let ([out, prologue_out], Some(src), Some(_)) = (
        args.outputs.as_slice(),
        args.inputs.get(source),
        args.inputs.get(result),
    ) else {
        return Err(Error::Invalid(format!(
            "a reduction with a row prologue writes two outputs and reads inputs {source} and \
             {result}: got {} outputs, {} inputs",
            args.outputs.len(),
            args.inputs.len()
        )));
    };
    let first = (
        Kernel::Reduce {
            op: prologue_op,
            reduced_axes,
            acc: prologue_out.dtype,
            map: None,
            prologue: None,
        },
        KernelArgs {
            outputs: vec![prologue_out.clone()],
            inputs: vec![src.clone()],
            scalars: vec![],
        },
    );
    let second = (
        Kernel::Reduce {
            op,
            reduced_axes,
            acc,
            map: map.clone(),
            prologue: None,
        },
        KernelArgs {
            outputs: vec![out.clone()],
            inputs: args.inputs.clone(),
            scalars: args.scalars.clone(),
        },
    );
    Ok([first, second])
}
