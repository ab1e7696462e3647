//! Batch norm's statistics in one read of its input, and its backward sums in one read of
//! the input and the gradient, where the backend runs [`Kernel::ChannelMoments`] and
//! [`Kernel::ChannelGradSums`] for the dtype (see
//! [`moments_plan`](crate::lower::moments_plan)). `None` leaves the two reductions to the
//! caller.

use crate::dtype::DType;
use crate::error::Result;
use crate::ir::Kernel;
use crate::lower::moments_plan::SHORTEST_RUN;
use crate::tensor::Tensor;

/// `x` (`[N, C, …]`) as `[outer, channels, inner]` where its backend runs a kernel of these
/// slices for the dtypes `dtypes` over it: `x` contiguous (the reductions read it in place),
/// its runs of positions at least [`SHORTEST_RUN`] long, not empty, and within a binding.
fn channels_of(x: &Tensor, dtypes: &[DType]) -> Option<[usize; 3]> {
    let target = x.device().backend().target();
    let shape = x.shape();
    let (outer, channels) = (shape[0], shape[1]);
    let inner: usize = shape[2..].iter().product();
    let bytes = (x.numel() * x.dtype().itemsize()) as u64;
    let binds = target
        .binding_limit
        .is_none_or(|limit| bytes + target.offset_align + 16 <= limit);
    (dtypes.contains(&x.dtype())
        && x.is_contiguous()
        && inner >= SHORTEST_RUN
        && outer * inner > 0
        && binds)
        .then_some([outer, channels, inner])
}

/// The mean and biased variance of each channel of `x` (`[N, C, …]`), each `[1, C, 1, …]` in
/// `x`'s dtype; `None` where the backend does not run the kernel for `x`'s dtype, `x` is not
/// contiguous (the reductions read it in place), its runs of positions are shorter than
/// [`SHORTEST_RUN`], or a binding would not hold it.
pub(super) fn channel_statistics(x: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
    let target = x.device().backend().target();
    let Some([outer, channels, inner]) = channels_of(x, target.channel_moments_dtypes) else {
        return Ok(None);
    };
    let (shape, d) = (x.shape(), x.dtype());
    let dev = x.device();
    let (mean, var) = (
        Tensor::empty([channels], d, dev)?,
        Tensor::empty([channels], d, dev)?,
    );
    crate::tensor::launch_writing(
        Kernel::ChannelMoments,
        &mean,
        &[&var],
        &[&x.reshape([outer, channels, inner])?],
        vec![],
    )?;
    let mut kept = vec![1; shape.len()];
    kept[1] = channels;
    Ok(Some((mean.reshape(kept.clone())?, var.reshape(kept)?)))
}

/// Batch norm's backward sums `Σg` and `Σg·(x − mean)·rstd` over each channel of `x`
/// (`[N, C, …]`, statistics `mean` and `rstd` `[1, C, 1, …]`) for the upstream gradient `g`,
/// each `[1, C, 1, …]` in `x`'s dtype, from one read of `x` and `g`; `None` where the backend
/// does not run the kernel for the dtype, `g` is not of `x`'s shape and dtype or either is not
/// contiguous (a broadcast `g` costs the reductions nothing to read), the runs of positions are
/// shorter than [`SHORTEST_RUN`], or a binding would not hold them or their six tensors.
pub(super) fn channel_grad_sums(
    x: &Tensor,
    g: &Tensor,
    mean: &Tensor,
    rstd: &Tensor,
) -> Result<Option<(Tensor, Tensor)>> {
    let target = x.device().backend().target();
    let Some([outer, channels, inner]) = channels_of(x, target.channel_sums_dtypes) else {
        return Ok(None);
    };
    let (shape, d) = (x.shape(), x.dtype());
    if g.shape() != shape
        || [g, mean, rstd].iter().any(|t| t.dtype() != d)
        || !g.is_contiguous()
        || !target.binds(6)
    {
        return Ok(None);
    }
    let dev = x.device();
    let (sum_g, sum_gx) = (
        Tensor::empty([channels], d, dev)?,
        Tensor::empty([channels], d, dev)?,
    );
    let as_channels = |t: &Tensor| t.contiguous()?.reshape([channels]);
    crate::tensor::launch_writing(
        Kernel::ChannelGradSums,
        &sum_g,
        &[&sum_gx],
        &[
            &x.reshape([outer, channels, inner])?,
            &g.reshape([outer, channels, inner])?,
            &as_channels(mean)?,
            &as_channels(rstd)?,
        ],
        vec![],
    )?;
    let mut kept = vec![1; shape.len()];
    kept[1] = channels;
    Ok(Some((sum_g.reshape(kept.clone())?, sum_gx.reshape(kept)?)))
}
