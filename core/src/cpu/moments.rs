//! The CPU `ChannelMoments` and `ChannelGradSums` kernels: each channel's mean and then its
//! variance around that mean, or its two gradient sums, in f64, rounded once into the outputs.
//! Plain and obviously right; one thread.

use super::strided::{load_f64, store_f64};
use crate::backend::KernelArgs;
use crate::error::Result;
use crate::lower::moments_plan::{GradSumsOperands, MomentsOperands};

/// Executes `ChannelMoments` over `args`.
pub(super) fn run(args: &KernelArgs) -> Result<()> {
    let ops = MomentsOperands::of(args)?;
    let (channels, inner) = (ops.channels, ops.inner);
    let values = ops.outer * inner;
    let x = load_f64(ops.x)?;
    let (mut means, mut vars) = (vec![0.0; channels], vec![0.0; channels]);
    for c in 0..channels {
        // Value `j` of the channel is `x[j / inner, c, j % inner]`.
        let at = |j: usize| x[((j / inner) * channels + c) * inner + j % inner];
        let mean = (0..values).map(at).sum::<f64>() / values as f64;
        let var = (0..values).map(|j| (at(j) - mean).powi(2)).sum::<f64>() / values as f64;
        (means[c], vars[c]) = (mean, var);
    }
    store_f64(means, ops.mean)?;
    store_f64(vars, ops.var)
}

/// Executes `ChannelGradSums` over `args`.
pub(super) fn grad_sums(args: &KernelArgs) -> Result<()> {
    let ops = GradSumsOperands::of(args)?;
    let (channels, inner) = (ops.channels, ops.inner);
    let (x, g) = (load_f64(ops.x)?, load_f64(ops.g)?);
    let (mean, rstd) = (load_f64(ops.mean)?, load_f64(ops.rstd)?);
    let (mut sum_g, mut sum_gx) = (vec![0.0; channels], vec![0.0; channels]);
    for c in 0..channels {
        for j in 0..ops.outer * inner {
            let at = ((j / inner) * channels + c) * inner + j % inner;
            sum_g[c] += g[at];
            sum_gx[c] += g[at] * (x[at] - mean[c]) * rstd[c];
        }
    }
    store_f64(sum_g, ops.sum_g)?;
    store_f64(sum_gx, ops.sum_gx)
}
