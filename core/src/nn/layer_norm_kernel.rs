//! Layer norm's backward as one kernel where the backend runs
//! [`Kernel::LayerNormBackward`] for rows this long: `dx` and the column sums of γ's and β's
//! gradients in one pass over `x` and `g` (see
//! [`layer_norm_plan`](crate::lower::layer_norm_plan)); `None` leaves the composition to the
//! caller.

use crate::error::Result;
use crate::ir::Kernel;
use crate::lower::layer_norm_plan;
use crate::tensor::Tensor;

/// What the kernel gives a layer norm's backward.
pub(super) struct Gradients {
    /// The input's gradient, in `x`'s shape and dtype.
    pub dx: Tensor,
    /// `Σ g·x̂` and `Σ g` over the rows, each of the normalized axes' shape in the accumulation
    /// dtype: γ's and β's gradients before their cast.
    pub columns: Option<(Tensor, Tensor)>,
}

/// The gradients of a layer norm over the last `normalized` axes of `x` (statistics `mean`
/// and `rstd`, one a row, weight `weight`) for the upstream gradient `g`, with the column sums
/// where `columns`; `None` where the backend does not run the kernel for these rows or the
/// dtypes differ (the composition promotes them).
pub(super) fn backward(
    x: &Tensor,
    g: &Tensor,
    [mean, rstd]: [&Tensor; 2],
    weight: Option<&Tensor>,
    normalized: usize,
    columns: bool,
) -> Result<Option<Gradients>> {
    let dev = x.device();
    let target = dev.backend().target();
    let lead = x.ndim() - normalized;
    let n: usize = x.shape()[lead..].iter().product();
    let rows: usize = x.shape()[..lead].iter().product();
    let d = x.dtype();
    if n == 0
        || rows == 0
        || n > target.layer_norm_backward_row
        || !target.layer_norm_backward_dtypes.contains(&d)
        || g.shape() != x.shape()
        || weight.is_some_and(|w| w.shape() != &x.shape()[lead..])
        || [g, mean, rstd]
            .into_iter()
            .chain(weight)
            .any(|t| t.dtype() != d)
    {
        return Ok(None);
    }
    let parts = layer_norm_plan::parts(rows, n, target);
    // A backend that binds windows of its buffers (wgpu) binds each operand whole.
    if let Some(limit) = target.binding_limit {
        let widest = (rows * n * d.itemsize()).max(parts * n * d.accumulator().itemsize());
        if widest as u64 + target.offset_align + 16 > limit {
            return Ok(None);
        }
    }
    let as_rows = |t: &Tensor, shape: &[usize]| t.contiguous()?.reshape(shape.to_vec());
    let mut inputs = vec![
        as_rows(x, &[rows, n])?,
        as_rows(g, &[rows, n])?,
        as_rows(mean, &[rows])?,
        as_rows(rstd, &[rows])?,
    ];
    if let Some(w) = weight {
        inputs.push(as_rows(w, &[n])?);
    }
    let dx = Tensor::empty([rows, n], d, dev)?;
    let sums = match columns {
        true => vec![
            Tensor::empty([parts, n], d.accumulator(), dev)?,
            Tensor::empty([parts, n], d.accumulator(), dev)?,
        ],
        false => Vec::new(),
    };
    crate::tensor::launch_writing(
        Kernel::LayerNormBackward {
            weight: weight.is_some(),
            columns,
        },
        &dx,
        &sums.iter().collect::<Vec<_>>(),
        &inputs.iter().collect::<Vec<_>>(),
        vec![],
    )?;
    let normalized_shape = &x.shape()[lead..];
    let column = |t: &Tensor| t.sum([0], false)?.reshape(normalized_shape.to_vec());
    Ok(Some(Gradients {
        dx: dx.reshape(x.shape().to_vec())?,
        columns: match sums.as_slice() {
            [gx, g] => Some((column(gx)?, column(g)?)),
            _ => None,
        },
    }))
}
