//! Batch norm's statistics in one read of its input where the backend runs
//! [`Kernel::ChannelMoments`] for its dtype (see
//! [`moments_plan`](crate::lower::moments_plan)). `None` leaves the two reductions to the
//! caller.

use crate::error::Result;
use crate::ir::Kernel;
use crate::lower::moments_plan::SHORTEST_RUN;
use crate::tensor::Tensor;

/// The mean and biased variance of each channel of `x` (`[N, C, …]`), each `[1, C, 1, …]` in
/// `x`'s dtype; `None` where the backend does not run the kernel for `x`'s dtype, `x` is not
/// contiguous (the reductions read it in place), its runs of positions are shorter than
/// [`SHORTEST_RUN`], or a binding would not hold it.
pub(super) fn channel_statistics(x: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
    let shape = x.shape().to_vec();
    let target = x.device().backend().target();
    let (d, channels) = (x.dtype(), shape[1]);
    let inner: usize = shape[2..].iter().product();
    let outer = shape[0];
    let binds = target
        .binding_limit
        .is_none_or(|limit| (x.numel() * d.itemsize()) as u64 + target.offset_align + 16 <= limit);
    if !target.channel_moments_dtypes.contains(&d)
        || !x.is_contiguous()
        || inner < SHORTEST_RUN
        || outer * inner == 0
        || !binds
    {
        return Ok(None);
    }
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
