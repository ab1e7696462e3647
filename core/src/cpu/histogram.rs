//! `Histogram` on the CPU: each element's bin from the map evaluator, then added in order
//! (the reference's float sums are sequential).

use super::block::{with_dtype, Prim};
use super::buffer::{CpuBuffer, Pool};
use super::map;
use super::strided::View;
use crate::backend::{KernelArgs, Operand};
use crate::dtype::DType;
use crate::error::Result;
use crate::ir::Expr;
use crate::layout::Layout;
use crate::lower::histogram_plan::HistogramOperands;
use std::sync::Arc;

/// Runs `Histogram { bins, bin, weighted }` over `args`.
pub(super) fn run(
    bins: usize,
    bin: &Expr,
    weighted: bool,
    args: &KernelArgs,
    pool: &Arc<Pool>,
) -> Result<()> {
    let ops = HistogramOperands::of(args, bins, weighted)?;
    let n = ops.n;
    if n == 0 {
        return Ok(());
    }
    let layout = Layout::contiguous(ops.values.layout.shape())?;
    let which = Operand {
        buffer: Arc::new(CpuBuffer::new(n * 4, pool.clone())?),
        layout,
        dtype: DType::I32,
    };
    map::run(
        bin,
        &[],
        &KernelArgs {
            outputs: vec![which.clone()],
            inputs: vec![ops.values.clone()],
            scalars: args.scalars.clone(),
        },
    )?;
    let mut scratch = Vec::new();
    // SAFETY: every view below was bounds-checked by View::new.
    let which: Vec<i32> = unsafe { View::new(&which)?.load::<i32>(0, n, &mut scratch) };
    let out = View::new(ops.out)?;
    with_dtype!(ops.out.dtype, T => {
        let mut acc: Vec<T> = unsafe { out.load::<T>(0, bins, &mut scratch) };
        let weights: Option<Vec<T>> = match ops.weights {
            Some(w) => Some(unsafe { View::new(w)?.load::<T>(0, n, &mut scratch) }),
            None => None,
        };
        for (i, &b) in which.iter().enumerate() {
            if b >= 0 && (b as usize) < bins {
                let add = weights.as_ref().map_or(1.0, |w| w[i].to_f64());
                let slot = &mut acc[b as usize];
                *slot = add_to(*slot, add);
            }
        }
        unsafe { out.store::<T>(0, &acc, &mut scratch) };
    });
    Ok(())
}

/// `slot + add` in the slot's dtype (integers wrap; f32 rounds as an f32 add would: the sum
/// of two f32 values is exact in f64 and rounds once).
fn add_to<T: Prim>(slot: T, add: f64) -> T {
    if T::DTYPE.is_float() {
        T::from_f64(slot.to_f64() + add)
    } else {
        T::from_i128(slot.to_i128() + add as i128, false)
    }
}
