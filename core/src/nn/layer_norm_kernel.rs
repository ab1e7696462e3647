//! Layer norm as one kernel each way where the backend runs [`Kernel::LayerNorm`] and
//! [`Kernel::LayerNormBackward`] for rows this long: forward, `y` and the statistics in one
//! pass over `x`; backward, `dx` and the column sums of γ's and β's gradients in one pass over
//! `x` and `g` (see [`layer_norm_plan`](crate::lower::layer_norm_plan)). `None` leaves the
//! composition to the caller.

use crate::error::Result;
use crate::ir::Kernel;
use crate::lower::layer_norm_plan;
use crate::tensor::Tensor;

/// Whether the backend of `x` runs the layer norm kernels over its last `normalized` axes
/// (rows of `n`, `rows` of them, each operand of `x`'s dtype), with every operand bound whole
/// where the backend binds windows (`parts` rows of column sums beside).
fn runs(x: &Tensor, rows: usize, n: usize, operands: &[&Tensor]) -> bool {
    let target = x.device().backend().target();
    let d = x.dtype();
    let parts = layer_norm_plan::parts(rows, n, target);
    let widest = (rows * n * d.itemsize()).max(parts * n * d.accumulator().itemsize());
    n > 0
        && rows > 0
        && n <= target.layer_norm_row
        && target.layer_norm_dtypes.contains(&d)
        && operands.iter().all(|t| t.dtype() == d)
        && target
            .binding_limit
            .is_none_or(|limit| widest as u64 + target.offset_align + 16 <= limit)
}

/// `x` normalized over its last `normalized` axes by one kernel, with its per-row mean and
/// `rstd` (each of `x`'s leading axes' shape with the normalized ones kept as 1); `None` where
/// the backend does not run it for these rows, `x` is not contiguous (the composition reads it
/// in place), or an affine parameter is not of `x`'s dtype and the normalized shape.
pub(super) fn forward(
    x: &Tensor,
    normalized: usize,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Option<[Tensor; 3]>> {
    let lead = x.ndim() - normalized;
    let n: usize = x.shape()[lead..].iter().product();
    let rows: usize = x.shape()[..lead].iter().product();
    let params: Vec<&Tensor> = weight.into_iter().chain(bias).collect();
    if !x.is_contiguous()
        || !runs(x, rows, n, &params)
        || params.iter().any(|p| p.shape() != &x.shape()[lead..])
    {
        return Ok(None);
    }
    let dev = x.device();
    let d = x.dtype();
    let mut inputs = vec![x.reshape([rows, n])?];
    for p in &params {
        inputs.push(p.contiguous()?.reshape([n])?);
    }
    let y = Tensor::empty([rows, n], d, dev)?;
    let (mean, rstd) = (
        Tensor::empty([rows], d, dev)?,
        Tensor::empty([rows], d, dev)?,
    );
    crate::tensor::launch_writing(
        Kernel::LayerNorm {
            weight: weight.is_some(),
            bias: bias.is_some(),
        },
        &y,
        &[&mean, &rstd],
        &inputs.iter().collect::<Vec<_>>(),
        vec![crate::dtype::Scalar::F64(eps).cast(d.accumulator(), false)],
    )?;
    let mut kept = x.shape()[..lead].to_vec();
    kept.resize(x.ndim(), 1);
    Ok(Some([
        mean.reshape(kept.clone())?,
        rstd.reshape(kept)?,
        y.reshape(x.shape().to_vec())?,
    ]))
}

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
    let lead = x.ndim() - normalized;
    let n: usize = x.shape()[lead..].iter().product();
    let rows: usize = x.shape()[..lead].iter().product();
    if !runs(x, rows, n, &[g, mean, rstd])
        || g.shape() != x.shape()
        || weight.is_some_and(|w| w.dtype() != x.dtype() || w.shape() != &x.shape()[lead..])
    {
        return Ok(None);
    }
    let dev = x.device();
    let d = x.dtype();
    let parts = layer_norm_plan::parts(rows, n, dev.backend().target());
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
