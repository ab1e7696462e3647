//! `Softmax` on the CPU: the composition it is defined by, kernel by kernel on scratch
//! buffers (the row maximum, the terms, their sum, the output), so the reference backend's
//! numbers are the eager composition's exactly.

use super::buffer::{CpuBuffer, Pool};
use super::{map, reduce};
use crate::backend::{KernelArgs, Operand};
use crate::error::Result;
use crate::ir::ReduceOp;
use crate::layout::Layout;
use crate::lower::softmax_plan::{softmax_output, softmax_term, SoftmaxOperands};
use std::sync::Arc;

/// Runs `Softmax { log }` over `args`.
pub(super) fn run(log: bool, args: &KernelArgs, pool: &Arc<Pool>) -> Result<()> {
    let ops = SoftmaxOperands::of(args)?;
    let (x, dtype) = (ops.input, ops.out.dtype);
    let shape = x.layout.shape();
    let lead = &shape[..shape.len() - 1];
    let scratch = |shape: &[usize]| -> Result<Operand> {
        let layout = Layout::contiguous(shape)?;
        let bytes = layout.numel() * dtype.itemsize();
        Ok(Operand {
            buffer: Arc::new(CpuBuffer::new(bytes, pool.clone())?),
            layout,
            dtype,
        })
    };
    // A per-row value seen at every element of its row (a stride-0 last axis).
    let along_rows = |row: &Operand| -> Result<Operand> {
        let mut strides = row.layout.strides().to_vec();
        strides.push(0);
        Ok(Operand {
            layout: Layout::new(shape.to_vec(), strides, 0)?,
            ..row.clone()
        })
    };
    let args_of = |out: &Operand, inputs: Vec<Operand>| KernelArgs {
        outputs: vec![out.clone()],
        inputs,
        scalars: vec![],
    };
    let m = scratch(lead)?;
    reduce::run(ReduceOp::Max, 1, dtype, &args_of(&m, vec![x.clone()]))?;
    let m_rows = along_rows(&m)?;
    let terms = scratch(shape)?;
    map::run(
        &softmax_term(dtype),
        &[],
        &args_of(&terms, vec![x.clone(), m_rows.clone()]),
    )?;
    let s = scratch(lead)?;
    let acc = dtype.accumulator();
    reduce::run(ReduceOp::Sum, 1, acc, &args_of(&s, vec![terms]))?;
    let s_rows = along_rows(&s)?;
    map::run(
        &softmax_output(dtype, log),
        &[],
        &args_of(ops.out, vec![x.clone(), m_rows, s_rows]),
    )
}
