//! A layer norm's launches, forward and backward: core's plan ([`layer_norm_plan`]) as the
//! kernel's words and grid, a block of `threads` per part.

use super::step::{Sig, Step};
use crate::launch::{Args, Launch};
use crate::memory::element_address;
use crate::render::layer_norm::{LayerNormForwardSig, LayerNormSig};
use strata_core::backend::{KernelArgs, Operand};
use strata_core::lower::layer_norm_plan::{self, LayerNormForwardOperands, LayerNormOperands};
use strata_core::target::Target;
use strata_core::Result;

/// The step of `LayerNormBackward { weight, columns }` over `args` on `target`; none for no
/// rows.
pub(crate) fn steps(
    weight: bool,
    columns: bool,
    args: &KernelArgs,
    target: &Target,
) -> Result<Vec<Step<'static>>> {
    let ops = LayerNormOperands::of(args, weight, columns)?;
    if ops.rows == 0 || ops.n == 0 {
        return Ok(Vec::new());
    }
    let mut operands = vec![ops.x, ops.g, ops.mean, ops.rstd, ops.dx];
    operands.extend(ops.weight);
    operands.extend(ops.columns.into_iter().flatten());
    let addresses = operands
        .iter()
        .map(|o| element_address(o))
        .collect::<Result<Vec<u64>>>()?;
    // Rows start on a vector where x, g, dx and γ do (the statistics and the sums are read
    // and written an element at a time).
    let vectored: Vec<u64> = addresses
        .iter()
        .enumerate()
        .filter(|&(k, _)| !matches!(k, 2 | 3) && k < 5 + weight as usize)
        .map(|(_, &a)| a)
        .collect();
    let plan = layer_norm_plan::plan(&ops, &vectored, target);
    let mut w = Args::new();
    w.push(ops.rows as u64);
    w.push(ops.n as u64);
    for &a in &addresses[..5] {
        w.push(a);
    }
    let mut rest = addresses[5..].iter().copied();
    w.push(match weight {
        true => rest.next().unwrap_or(0),
        false => 0,
    });
    w.push(rest.next().unwrap_or(0));
    w.push(rest.next().unwrap_or(0));
    let sig = LayerNormSig {
        dtype: ops.dtype,
        weight,
        columns,
        threads: plan.threads,
        per_thread: plan.per_thread,
        vector: plan.vector,
    };
    let grid = (plan.parts as u32, 1, 1);
    Ok(vec![Step::Kernel {
        sig: Sig::LayerNorm(sig),
        launch: Launch::fixed(w, grid, (plan.threads as u32, 1, 1), 0),
    }])
}

/// The step of `LayerNorm { weight, bias }` over `args` on `target`; none for no rows.
pub(crate) fn forward_steps(
    weight: bool,
    bias: bool,
    args: &KernelArgs,
    target: &Target,
) -> Result<Vec<Step<'static>>> {
    let ops = LayerNormForwardOperands::of(args, weight, bias)?;
    if ops.rows == 0 || ops.n == 0 {
        return Ok(Vec::new());
    }
    let params: Vec<&Operand> = ops.weight.into_iter().chain(ops.bias).collect();
    let rows = [ops.x, ops.y]
        .into_iter()
        .chain(params.iter().copied())
        .map(element_address)
        .collect::<Result<Vec<u64>>>()?;
    let plan = layer_norm_plan::forward_plan(&ops, &rows, target);
    let mut w = Args::new();
    w.push(ops.rows as u64);
    w.push(ops.n as u64);
    for op in [ops.x, ops.y, ops.mean, ops.rstd] {
        w.push(element_address(op)?);
    }
    for p in [ops.weight, ops.bias] {
        w.push(p.map(element_address).transpose()?.unwrap_or(0));
    }
    w.push(args.scalars[0].bits());
    let sig = LayerNormForwardSig {
        dtype: ops.dtype,
        weight,
        bias,
        threads: plan.threads,
        per_thread: plan.per_thread,
        vector: plan.vector,
    };
    Ok(vec![Step::Kernel {
        sig: Sig::LayerNormForward(sig),
        launch: Launch::fixed(w, (plan.parts as u32, 1, 1), (plan.threads as u32, 1, 1), 0),
    }])
}
