//! A reduction with a row prologue ([`RowPrologue`]) or a row epilogue ([`RowEpilogue`]) as
//! separate launches: the prologue (a max or min of the same rows) into output 1, then the
//! main reduction, whose map reads that output through input `result`, then the epilogue as a
//! map over the rows reading the main result through its own `result` input. This is the
//! definition of their numbers; a backend that keeps the row on chip between the passes
//! (CUDA) computes the same ones, and the others run these launches.
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
//! let kernel = Kernel::Reduce { op: ReduceOp::Sum, reduced_axes: 1, acc: DType::F32, map: Some(map), prologue, epilogue: None, stores_map: false };
//! let args = KernelArgs {
//!     outputs: vec![s.operand()?, m.operand()?],
//!     inputs: vec![x.operand()?, m_read.operand()?],
//!     scalars: vec![],
//! };
//! let launches = strata_core::lower::prologue::split(&kernel, &args)?;
//! let [(first, a), (second, b)] = &launches[..] else { panic!() };
//! assert!(matches!(first, Kernel::Reduce { op: ReduceOp::Max, map: None, .. }));
//! assert!(matches!(second, Kernel::Reduce { op: ReduceOp::Sum, prologue: None, .. }));
//! assert_eq!((a.inputs.len(), a.outputs.len(), b.inputs.len(), b.outputs.len()), (1, 1, 2, 1));
//! # Ok::<(), strata_core::Error>(())
//! ```

use crate::backend::KernelArgs;
use crate::error::{Error, Result};
use crate::ir::{Expr, Kernel, Node, RowEpilogue, RowPrologue};

/// `kernel` (a `Reduce` with a prologue or an epilogue) as its launches, in order: the
/// prologue's reduction, the main one, the epilogue's map. An `Err` for any other kernel or
/// for operands that do not match.
pub fn split(kernel: &Kernel, args: &KernelArgs) -> Result<Vec<(Kernel, KernelArgs)>> {
    let Kernel::Reduce {
        op,
        reduced_axes,
        acc,
        map,
        prologue,
        epilogue,
        ..
    } = kernel
    else {
        return Err(Error::Invalid(
            "internal error: only a reduction with a row prologue or epilogue is split".into(),
        ));
    };
    if let Some(RowEpilogue { expr, result }) = epilogue {
        let (Some((last, outputs)), Some(_)) =
            (args.outputs.split_last(), args.inputs.get(*result))
        else {
            return Err(Error::Invalid(format!(
                "a reduction with a row epilogue writes it last and reads input {result}: got \
                 {} outputs, {} inputs",
                args.outputs.len(),
                args.inputs.len()
            )));
        };
        let main = Kernel::Reduce {
            op: *op,
            reduced_axes: *reduced_axes,
            acc: *acc,
            map: map.clone(),
            prologue: *prologue,
            epilogue: None,
            stores_map: false,
        };
        // The reduction binds the inputs up to the last its map or prologue reads: those
        // after it (core appends the epilogue's own there) are the epilogue's alone.
        let bound = (map.as_ref().and_then(Expr::max_input))
            .max(prologue.map(|p| p.source.max(p.result)))
            .map_or(1, |k| k + 1);
        let main_args = KernelArgs {
            outputs: outputs.to_vec(),
            inputs: args.inputs[..bound.min(args.inputs.len())].to_vec(),
            scalars: args.scalars.clone(),
        };
        let mut launches = match prologue {
            Some(_) => split(&main, &main_args)?,
            None => vec![(main, main_args)],
        };
        // The map binds only the inputs it reads.
        let used: Vec<bool> = (0..args.inputs.len())
            .map(|k| expr.reads_input(k))
            .collect();
        let mut to = vec![0; used.len()];
        let mut inputs = Vec::new();
        for (k, o) in args.inputs.iter().enumerate().filter(|&(k, _)| used[k]) {
            to[k] = inputs.len();
            inputs.push(o.clone());
        }
        launches.push((
            Kernel::Map {
                expr: renumber(expr, &to),
                also: vec![],
            },
            KernelArgs {
                outputs: vec![last.clone()],
                inputs,
                scalars: args.scalars.clone(),
            },
        ));
        return Ok(launches);
    }
    let Some(RowPrologue {
        op: prologue_op,
        source,
        result,
    }) = *prologue
    else {
        return Err(Error::Invalid(
            "internal error: only a reduction with a row prologue or epilogue is split".into(),
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
            reduced_axes: *reduced_axes,
            acc: prologue_out.dtype,
            map: None,
            prologue: None,
            epilogue: None,
            stores_map: false,
        },
        KernelArgs {
            outputs: vec![prologue_out.clone()],
            inputs: vec![src.clone()],
            scalars: vec![],
        },
    );
    let second = (
        Kernel::Reduce {
            op: *op,
            reduced_axes: *reduced_axes,
            acc: *acc,
            map: map.clone(),
            prologue: None,
            epilogue: None,
            stores_map: false,
        },
        KernelArgs {
            outputs: vec![out.clone()],
            inputs: args.inputs.clone(),
            scalars: args.scalars.clone(),
        },
    );
    Ok(vec![first, second])
}

/// `e` with input `k` read as input `to[k]`.
fn renumber(e: &Expr, to: &[usize]) -> Expr {
    match &e.node {
        Node::Input(k) => Expr::input(to[*k], e.dtype),
        _ => e.map_children(|c| renumber(c, to)),
    }
}
