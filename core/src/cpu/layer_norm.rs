//! The CPU `LayerNorm` and `LayerNormBackward` kernels: each row's sums and outputs as the
//! kernels' definitions read, in f64 (as exact as the dtype allows), rounded once into the
//! outputs. Plain and obviously right; one thread.

use super::strided::{load_f64, store_f64};
use crate::backend::KernelArgs;
use crate::error::Result;
use crate::lower::layer_norm_plan::{LayerNormForwardOperands, LayerNormOperands};

/// Executes `LayerNorm { weight, bias }` over `args`.
pub(super) fn forward(weight: bool, bias: bool, args: &KernelArgs) -> Result<()> {
    let ops = LayerNormForwardOperands::of(args, weight, bias)?;
    let (rows, n) = (ops.rows, ops.n);
    let eps = args.scalars[0].to_f64();
    let x = load_f64(ops.x)?;
    let w = ops.weight.map(load_f64).transpose()?;
    let b = ops.bias.map(load_f64).transpose()?;
    let mut y = vec![0.0; rows * n];
    let (mut means, mut rstds) = (vec![0.0; rows], vec![0.0; rows]);
    for r in 0..rows {
        let xr = &x[r * n..(r + 1) * n];
        let mean = xr.iter().sum::<f64>() / n as f64;
        let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        for (i, out) in y[r * n..(r + 1) * n].iter_mut().enumerate() {
            let scaled = (xr[i] - mean) * rstd * w.as_ref().map_or(1.0, |w| w[i]);
            *out = scaled + b.as_ref().map_or(0.0, |b| b[i]);
        }
        (means[r], rstds[r]) = (mean, rstd);
    }
    store_f64(y, ops.y)?;
    store_f64(means, ops.mean)?;
    store_f64(rstds, ops.rstd)
}

/// Executes `LayerNormBackward { weight, columns }` over `args`.
pub(super) fn backward(weight: bool, columns: bool, args: &KernelArgs) -> Result<()> {
    let ops = LayerNormOperands::of(args, weight, columns)?;
    let (rows, n) = (ops.rows, ops.n);
    let (x, g) = (load_f64(ops.x)?, load_f64(ops.g)?);
    let (mean, rstd) = (load_f64(ops.mean)?, load_f64(ops.rstd)?);
    let w = ops.weight.map(load_f64).transpose()?;
    let parts = ops.columns.map_or(1, |[c, _]| c.layout.shape()[0]);
    let mut dx = vec![0.0; rows * n];
    let (mut gx_sums, mut g_sums) = (vec![0.0; parts * n], vec![0.0; parts * n]);
    for r in 0..rows {
        let (xr, gr) = (&x[r * n..(r + 1) * n], &g[r * n..(r + 1) * n]);
        let xhat = |i: usize| (xr[i] - mean[r]) * rstd[r];
        let gw = |i: usize| w.as_ref().map_or(gr[i], |w| gr[i] * w[i]);
        let a = (0..n).map(gw).sum::<f64>() / n as f64;
        let b = (0..n).map(|i| (gw(i) - a) * xhat(i)).sum::<f64>() / n as f64;
        for (i, d) in dx[r * n..(r + 1) * n].iter_mut().enumerate() {
            *d = ((gw(i) - a) - xhat(i) * b) * rstd[r];
        }
        let p = (r % parts) * n;
        for i in 0..n {
            gx_sums[p + i] += gr[i] * xhat(i);
            g_sums[p + i] += gr[i];
        }
    }
    store_f64(dx, ops.dx)?;
    if let Some([gx, g]) = ops.columns {
        store_f64(gx_sums, gx)?;
        store_f64(g_sums, g)?;
    }
    Ok(())
}
