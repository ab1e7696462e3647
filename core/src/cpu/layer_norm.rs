//! The CPU `LayerNormBackward` kernel: each row's two sums and its `dx` as the kernel's
//! definition reads, in f64 (as exact as the dtype allows), rounded once into the outputs.
//! Plain and obviously right; one thread.

use super::strided::{load_f64, store_f64};
use crate::backend::KernelArgs;
use crate::error::Result;
use crate::lower::layer_norm_plan::LayerNormOperands;

/// Executes `LayerNormBackward { weight, columns }` over `args`.
pub(super) fn run(weight: bool, columns: bool, args: &KernelArgs) -> Result<()> {
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
