//! Losses and the functional ops of training (issue 40), with PyTorch's names, definitions
//! and defaults (`torch.nn.functional`): `mse_loss`, `nll_loss`, `cross_entropy` (with label
//! smoothing, over one `log_softmax` kernel), `one_hot`, `embedding`, `dropout`, `linear`,
//! `layer_norm`, `group_norm`, `batch_norm` (with running statistics), and over sliding
//! windows `conv2d`, `conv_transpose2d`, `max_pool2d`, `avg_pool2d`, `adaptive_avg_pool2d`.
//! Each is written with core's public ops, so its gradient comes from theirs and its
//! elementwise work fuses like any other.
//!
//! ```
//! use strata_core::nn::functional::{mse_loss, Reduction};
//! use strata_core::{Device, Tensor};
//! let dev = Device::cpu();
//! let a = Tensor::from_slice(&[1.0f32, 2.0], [2], &dev)?;
//! let b = Tensor::from_slice(&[1.0f32, 4.0], [2], &dev)?;
//! assert_eq!(mse_loss(&a, &b, Reduction::Mean)?.item::<f32>()?, 2.0);
//! # Ok::<(), strata_core::Error>(())
//! ```

use super::layer_norm_kernel;
use super::moments_kernel;
pub use super::windows::{
    adaptive_avg_pool2d, avg_pool2d, conv2d, conv_transpose2d, max_pool2d, Pair,
};
use crate::autograd::sum_to_shape;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::Axes;
use crate::random::Generator;
use crate::tensor::Tensor;

/// How a loss over many elements is combined, as PyTorch's `reduction=`.
///
/// ```
/// assert_eq!(strata_core::nn::functional::Reduction::default(), strata_core::nn::functional::Reduction::Mean);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduction {
    /// The mean (PyTorch's default).
    #[default]
    Mean,
    /// The sum.
    Sum,
    /// Each element's loss, unreduced.
    None,
}

impl Reduction {
    fn apply(self, losses: Tensor) -> Result<Tensor> {
        match self {
            Reduction::Mean => losses.mean(Axes::All, false),
            Reduction::Sum => losses.sum(Axes::All, false),
            Reduction::None => Ok(losses),
        }
    }
}

/// The squared error `(input - target)²`, reduced; `target` broadcasts to `input`.
///
/// ```
/// use strata_core::nn::functional::{mse_loss, Reduction};
/// use strata_core::{Device, Tensor};
/// let a = Tensor::from_slice(&[0.0f64, 3.0], [2], &Device::cpu())?;
/// let b = Tensor::from_slice(&[1.0f64, 1.0], [2], &Device::cpu())?;
/// assert_eq!(mse_loss(&a, &b, Reduction::Sum)?.item::<f64>()?, 5.0);
/// # Ok::<(), strata_core::Error>(())
/// ```
pub fn mse_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    reduction.apply(input.sub(target)?.square()?)
}

/// An `Err` unless `target` holds one integer class per row of the `[N, C]` (or `[C]`)
/// `scores`.
fn check_classes(scores: &Tensor, target: &Tensor, what: &str) -> Result<()> {
    let ok_rank = match scores.ndim() {
        2 => target.shape() == [scores.shape()[0]],
        1 => target.ndim() == 0,
        _ => false,
    };
    if !ok_rank || !target.dtype().is_int() {
        return Err(Error::Shape(format!(
            "{what} takes scores [N, C] (or [C]) and integer classes [N] (or one): got {:?} \
             and {:?} {}",
            scores.shape(),
            target.shape(),
            target.dtype()
        )));
    }
    Ok(())
}

/// The settings of [`nll_loss_with`] and [`cross_entropy_with`] beyond the common case,
/// PyTorch's keyword arguments: `default()` is `nll_loss` / `cross_entropy` with the mean.
///
/// ```
/// use strata_core::nn::functional::{ClassLoss, Reduction};
/// let opts = ClassLoss { ignore_index: Some(-100), ..ClassLoss::default() };
/// assert_eq!((opts.reduction, opts.label_smoothing), (Reduction::Mean, 0.0));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ClassLoss<'a> {
    /// A weight per class, `[C]` of the scores' dtype (`weight=`): each row's loss is scaled
    /// by its target class's weight, and the mean divides by the sum of those weights.
    pub weight: Option<&'a Tensor>,
    /// Rows whose target is this value count for nothing, in the sum and in the mean's
    /// divisor (`ignore_index=`; PyTorch's -100 is its usual value).
    pub ignore_index: Option<i64>,
    /// Label smoothing ε in `[0, 1]` (cross-entropy only).
    pub label_smoothing: f64,
    /// How the rows' losses are combined.
    pub reduction: Reduction,
}

/// What [`class_rows`] finds for `[N]` rows.
struct ClassRows {
    /// Each row's loss, 0 where ignored.
    losses: Tensor,
    /// Each row's weight (0 where ignored), where weights or an ignored class are set.
    row_weight: Option<Tensor>,
    /// The rows whose target is the ignored class (bool), where one is set.
    ignored: Option<Tensor>,
}

/// Each row's negative log-likelihood `-w[t]·logp[n, t]` (0 for ignored rows) and, where
/// weights or an ignored class are set, each row's weight (0 for ignored rows): the mean's
/// divisor is their sum. `logp` is `[N, C]`, `target` `[N]`.
fn class_rows(logp: &Tensor, target: &Tensor, opts: &ClassLoss) -> Result<ClassRows> {
    let classes = logp.shape()[1];
    let target = target.to_dtype(DType::I64)?;
    let ignored = opts.ignore_index.map(|i| target.eq(i)).transpose()?;
    // An ignored row's target may lie outside 0..C (-100): it reads class 0 instead.
    let index = match &ignored {
        Some(mask) => target.masked_fill(mask, 0)?,
        None => target,
    };
    let picked = logp.gather(1, &index.unsqueeze(1)?)?.squeeze_axis(1)?;
    let mut row_weight = match opts.weight {
        Some(w) => {
            if w.shape() != [classes] || w.dtype() != logp.dtype() {
                return Err(Error::Shape(format!(
                    "class weights are [{classes}] {}, one per class: got {:?} {}",
                    logp.dtype(),
                    w.shape(),
                    w.dtype()
                )));
            }
            Some(w.index_select(0, &index)?)
        }
        None => None,
    };
    if let Some(mask) = &ignored {
        let kept = match row_weight {
            Some(w) => w,
            None => Tensor::ones(index.shape().to_vec(), logp.dtype(), logp.device())?,
        };
        row_weight = Some(kept.masked_fill(mask, 0.0)?);
    }
    let losses = match &row_weight {
        Some(w) => picked.mul(w)?.neg()?,
        None => picked.neg()?,
    };
    Ok(ClassRows {
        losses,
        row_weight,
        ignored,
    })
}

/// Combines rows' losses: the mean divides by the rows' weights where there are some.
fn reduce_rows(losses: Tensor, row_weight: Option<Tensor>, reduction: Reduction) -> Result<Tensor> {
    match (reduction, row_weight) {
        (Reduction::Mean, Some(w)) => losses.sum(Axes::All, false)?.div(&w.sum(Axes::All, false)?),
        (r, _) => r.apply(losses),
    }
}

/// `[N, C]` scores and `[N]` classes from `[N, C]` / `[C]` and `[N]` / `[]`, checked.
fn as_rows(scores: &Tensor, target: &Tensor, what: &str) -> Result<(Tensor, Tensor)> {
    check_classes(scores, target, what)?;
    if scores.ndim() == 1 {
        Ok((scores.unsqueeze(0)?, target.reshape([1])?))
    } else {
        Ok((scores.clone(), target.clone()))
    }
}

/// One row's unreduced loss back to a scalar for `[C]` scores.
fn unrow(losses: Tensor, scores: &Tensor, reduction: Reduction) -> Result<Tensor> {
    if scores.ndim() == 1 && reduction == Reduction::None {
        losses.reshape(Vec::<usize>::new())
    } else {
        Ok(losses)
    }
}

/// The negative log-likelihood of `target`'s classes under `log_probs` (`[N, C]`, or `[C]`
/// with one class): `-log_probs[n, target[n]]`, reduced. A class outside `0..C` is an error
/// (on GPUs at the next read, as a gather's).
///
/// ```
/// use strata_core::nn::functional::{nll_loss, Reduction};
/// use strata_core::{Device, Tensor};
/// let dev = Device::cpu();
/// let logp = Tensor::from_slice(&[-1.0f32, -2.0, -3.0, -4.0], [2, 2], &dev)?;
/// let target = Tensor::from_slice(&[1i64, 0], [2], &dev)?;
/// assert_eq!(nll_loss(&logp, &target, Reduction::Mean)?.item::<f32>()?, 2.5);
/// # Ok::<(), strata_core::Error>(())
/// ```
pub fn nll_loss(log_probs: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    nll_loss_with(
        log_probs,
        target,
        &ClassLoss {
            reduction,
            ..ClassLoss::default()
        },
    )
}

/// [`nll_loss`] with class weights and an ignored class ([`ClassLoss`]; its label smoothing
/// must be 0 here), as PyTorch's `nll_loss(weight=, ignore_index=)`.
///
/// ```
/// use strata_core::nn::functional::{nll_loss_with, ClassLoss};
/// use strata_core::{Device, Tensor};
/// let dev = Device::cpu();
/// let logp = Tensor::from_slice(&[-1.0f64, -2.0, -3.0, -4.0, -5.0, -6.0], [3, 2], &dev)?;
/// let target = Tensor::from_slice(&[1i64, 0, -100], [3], &dev)?;
/// let w = Tensor::from_slice(&[1.0f64, 3.0], [2], &dev)?;
/// let opts = ClassLoss { weight: Some(&w), ignore_index: Some(-100), ..ClassLoss::default() };
/// // (3·2 + 1·3) / (3 + 1); the third row is ignored.
/// assert_eq!(nll_loss_with(&logp, &target, &opts)?.item::<f64>()?, 2.25);
/// # Ok::<(), strata_core::Error>(())
/// ```
pub fn nll_loss_with(log_probs: &Tensor, target: &Tensor, opts: &ClassLoss) -> Result<Tensor> {
    if opts.label_smoothing != 0.0 {
        return Err(Error::Invalid(format!(
            "nll_loss has no label smoothing (cross_entropy has): got {}",
            opts.label_smoothing
        )));
    }
    let (logp, rows) = as_rows(log_probs, target, "nll_loss")?;
    let r = class_rows(&logp, &rows, opts)?;
    unrow(
        reduce_rows(r.losses, r.row_weight, opts.reduction)?,
        log_probs,
        opts.reduction,
    )
}

/// The cross-entropy of `logits` (`[N, C]`, or `[C]`) against integer classes `target`:
/// `nll_loss(log_softmax(logits))`, the log-softmax one kernel where the backend has it.
/// With `label_smoothing` ε in `[0, 1]` the target is `1 - ε` on the class and `ε / C`
/// spread over all classes, as PyTorch defines it: `(1 - ε)·nll + ε·mean_c(-log p_c)`.
///
/// ```
/// use strata_core::nn::functional::{cross_entropy, Reduction};
/// use strata_core::{Device, Tensor};
/// let dev = Device::cpu();
/// let logits = Tensor::from_slice(&[0.0f64, 0.0], [1, 2], &dev)?;
/// let target = Tensor::from_slice(&[0i64], [1], &dev)?;
/// let loss = cross_entropy(&logits, &target, 0.0, Reduction::Mean)?.item::<f64>()?;
/// assert!((loss - 2f64.ln()).abs() < 1e-12);
/// # Ok::<(), strata_core::Error>(())
/// ```
pub fn cross_entropy(
    logits: &Tensor,
    target: &Tensor,
    label_smoothing: f64,
    reduction: Reduction,
) -> Result<Tensor> {
    cross_entropy_with(
        logits,
        target,
        &ClassLoss {
            label_smoothing,
            reduction,
            ..ClassLoss::default()
        },
    )
}

/// [`cross_entropy`] with class weights and an ignored class ([`ClassLoss`]), as PyTorch's
/// `cross_entropy(weight=, ignore_index=, label_smoothing=)`: the smoothing term of a row is
/// `-Σ_c w_c·log p_c / C`, and the mean divides both terms by the counted rows' weights.
///
/// ```
/// use strata_core::nn::functional::{cross_entropy_with, ClassLoss};
/// use strata_core::{Device, Tensor};
/// let dev = Device::cpu();
/// let logits = Tensor::from_slice(&[0.0f64, 0.0, 5.0, -5.0], [2, 2], &dev)?;
/// let target = Tensor::from_slice(&[0i64, -1], [2], &dev)?;
/// let opts = ClassLoss { ignore_index: Some(-1), ..ClassLoss::default() };
/// let loss = cross_entropy_with(&logits, &target, &opts)?.item::<f64>()?;
/// assert!((loss - 2f64.ln()).abs() < 1e-12); // only the first row counts
/// # Ok::<(), strata_core::Error>(())
/// ```
pub fn cross_entropy_with(logits: &Tensor, target: &Tensor, opts: &ClassLoss) -> Result<Tensor> {
    let eps = opts.label_smoothing;
    if !(0.0..=1.0).contains(&eps) {
        return Err(Error::Invalid(format!(
            "cross_entropy: label_smoothing is in [0, 1], got {eps}"
        )));
    }
    let (scores, rows) = as_rows(logits, target, "cross_entropy")?;
    let logp = scores.log_softmax(-1)?;
    let r = class_rows(&logp, &rows, opts)?;
    let losses = if eps == 0.0 {
        r.losses
    } else {
        let classes = scores.shape()[1] as f64;
        let weighted = match opts.weight {
            Some(w) => logp.mul(w)?,
            None => logp.clone(),
        };
        let mut smooth = weighted.sum(-1, false)?.neg()?;
        if let Some(mask) = &r.ignored {
            smooth = smooth.masked_fill(mask, 0.0)?;
        }
        r.losses.mul(1.0 - eps)?.add(&smooth.mul(eps / classes)?)?
    };
    unrow(
        reduce_rows(losses, r.row_weight, opts.reduction)?,
        logits,
        opts.reduction,
    )
}

/// A one-hot encoding: for integer `indices` of any shape, an i64 tensor of shape
/// `[...indices.shape, classes]` with 1 at each index and 0 elsewhere. An index outside
/// `0..classes` is an error (checked here: it reads the indices' smallest and largest).
///
/// ```
/// use strata_core::nn::functional::one_hot;
/// use strata_core::{Device, Tensor};
/// let i = Tensor::from_slice(&[2i64, 0], [2], &Device::cpu())?;
/// assert_eq!(one_hot(&i, 3)?.to_vec::<i64>()?, vec![0, 0, 1, 1, 0, 0]);
/// assert!(one_hot(&i, 2).is_err());
/// # Ok::<(), strata_core::Error>(())
/// ```
pub fn one_hot(indices: &Tensor, classes: usize) -> Result<Tensor> {
    if !indices.dtype().is_int() {
        return Err(Error::DType(format!(
            "one_hot takes integer indices, not {}",
            indices.dtype()
        )));
    }
    if indices.numel() > 0 {
        let wide = indices.to_dtype(DType::I64)?;
        let lo = wide.min(Axes::All, false)?.item::<i64>()?;
        let hi = wide.max(Axes::All, false)?.item::<i64>()?;
        if lo < 0 || hi >= classes as i64 {
            return Err(Error::Invalid(format!(
                "one_hot: indices span {lo}..={hi}, outside 0..{classes}"
            )));
        }
    }
    let range = Tensor::arange(0, classes as i64, 1, DType::I64, indices.device())?;
    indices
        .to_dtype(DType::I64)?
        .unsqueeze(-1)?
        .eq(&range)?
        .to_dtype(DType::I64)
}

/// The rows of `weight` (`[num, dim]`) at integer `indices` of any shape: shape
/// `[...indices.shape, dim]`. Its gradient adds each row's gradients into `weight`'s row,
/// repeated indices summed (an index-select's).
///
/// ```
/// use strata_core::nn::functional::embedding;
/// use strata_core::{Device, DType, Tensor};
/// let dev = Device::cpu();
/// let w = Tensor::arange(0.0, 6.0, 1.0, DType::F32, &dev)?.reshape([3, 2])?;
/// let i = Tensor::from_slice(&[2i64, 0, 2], [3], &dev)?;
/// assert_eq!(embedding(&i, &w)?.to_vec::<f32>()?, vec![4.0, 5.0, 0.0, 1.0, 4.0, 5.0]);
/// # Ok::<(), strata_core::Error>(())
/// ```
pub fn embedding(indices: &Tensor, weight: &Tensor) -> Result<Tensor> {
    if weight.ndim() != 2 || !indices.dtype().is_int() {
        return Err(Error::Shape(format!(
            "embedding takes integer indices and a weight [num, dim]: got {} indices and a \
             weight of shape {:?}",
            indices.dtype(),
            weight.shape()
        )));
    }
    let rows = weight.index_select(0, &indices.flatten()?)?;
    let mut shape = indices.shape().to_vec();
    shape.push(weight.shape()[1]);
    rows.reshape(shape)
}

/// Dropout: in training, each element zeroed with probability `p` and the others scaled by
/// `1 / (1 - p)`, the mask drawn from `gen` (Philox: the same mask on every backend for a
/// seed); out of training (`training == false`), `input` itself. `p` is in `[0, 1]`.
///
/// ```
/// use strata_core::nn::functional::dropout;
/// use strata_core::{random::Generator, Device, DType, Tensor};
/// let x = Tensor::ones([1000], DType::F32, &Device::cpu())?;
/// let y = dropout(&x, 0.5, true, &mut Generator::new(0))?.to_vec::<f32>()?;
/// assert!(y.iter().all(|&v| v == 0.0 || v == 2.0));
/// assert_eq!(dropout(&x, 0.5, false, &mut Generator::new(0))?.to_vec::<f32>()?, vec![1.0; 1000]);
/// # Ok::<(), strata_core::Error>(())
/// ```
pub fn dropout(input: &Tensor, p: f64, training: bool, gen: &mut Generator) -> Result<Tensor> {
    if !(0.0..=1.0).contains(&p) {
        return Err(Error::Invalid(format!(
            "dropout: the probability is in [0, 1], got {p}"
        )));
    }
    if !input.dtype().is_float() {
        return Err(Error::DType(format!(
            "dropout takes a float tensor, not {}",
            input.dtype()
        )));
    }
    if !training || p == 0.0 {
        return Ok(input.clone());
    }
    if p == 1.0 {
        return input.mul(0.0);
    }
    let keep = Tensor::rand(input.shape(), DType::F32, gen, input.device())?.ge(p)?;
    input
        .mul(&keep.to_dtype(input.dtype())?)?
        .mul(1.0 / (1.0 - p))
}

/// `x · weightᵀ + bias`: `x` of shape `[..., in]`, `weight` `[out, in]`, `bias` `[out]`
/// (PyTorch's `linear`). The bias add is lazy elementwise work, so an activation after it
/// fuses with it into one kernel after the matmul.
///
/// ```
/// use strata_core::nn::functional::linear;
/// use strata_core::{Device, Tensor};
/// let dev = Device::cpu();
/// let x = Tensor::from_slice(&[1.0f32, 2.0], [1, 2], &dev)?;
/// let w = Tensor::from_slice(&[1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], [3, 2], &dev)?;
/// let b = Tensor::from_slice(&[0.5f32, 0.5, 0.5], [3], &dev)?;
/// assert_eq!(linear(&x, &w, Some(&b))?.to_vec::<f32>()?, vec![1.5, 2.5, 3.5]);
/// # Ok::<(), strata_core::Error>(())
/// ```
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    if weight.ndim() != 2 || x.shape().last() != weight.shape().get(1) {
        return Err(Error::Shape(format!(
            "linear takes x [..., in] and a weight [out, in]: got {:?} and {:?}",
            x.shape(),
            weight.shape()
        )));
    }
    affine(x.matmul(&weight.t()?)?, None, bias)
}

/// `(x - mean) / sqrt(var + eps)` over the last `normalized` axes, the variance biased (as
/// PyTorch normalizes), then scaled by `weight` and shifted by `bias` (each of the normalized
/// axes' shape) where given: PyTorch's `layer_norm` with `normalized_shape` = the last
/// `normalized` axes.
///
/// ```
/// use strata_core::nn::functional::layer_norm;
/// use strata_core::{Device, Tensor};
/// let x = Tensor::from_slice(&[1.0f64, 3.0], [1, 2], &Device::cpu())?;
/// assert_eq!(layer_norm(&x, 1, None, None, 0.0)?.to_vec::<f64>()?, vec![-1.0, 1.0]);
/// # Ok::<(), strata_core::Error>(())
/// ```
pub fn layer_norm(
    x: &Tensor,
    normalized: usize,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    let nd = x.ndim();
    if normalized == 0 || normalized > nd || !x.dtype().is_float() {
        return Err(Error::Shape(format!(
            "layer_norm normalizes the last 1..={nd} axes of a float tensor: got {normalized} \
             axes of a {} tensor of shape {:?}",
            x.dtype(),
            x.shape()
        )));
    }
    let axes: Vec<isize> = (nd - normalized..nd).map(|a| a as isize).collect();
    let x = x.clone();
    let (mean, rstd, y) = crate::autograd::no_grad(|| -> Result<_> {
        // Where the backend runs it, one kernel: `y` and the statistics in one pass.
        if let Some([mean, rstd, y]) =
            layer_norm_kernel::forward(&x, normalized, weight, bias, eps)?
        {
            return Ok((mean, rstd, y));
        }
        let (mean, var) = moments(&x, &axes)?;
        let rstd = var.add(eps)?.rsqrt()?;
        let y = affine(x.sub(&mean)?.mul(&rstd)?, weight, bias)?;
        Ok((mean, rstd, y))
    })?;
    let Some((inputs, wants, dtypes)) = node_inputs(&x, weight, bias) else {
        return Ok(y);
    };
    let saved = [&x, &mean, &rstd]
        .iter()
        .map(|t| (t.shape().to_vec(), t.dtype()))
        .collect();
    let shapes = (
        weight.map(|w| w.shape().to_vec()),
        bias.map(|b| b.shape().to_vec()),
    );
    let (node_x, node_w) = (x.detach(), weight.map(Tensor::detach));
    let n = x.shape()[nd - normalized..].iter().product::<usize>() as f64;
    Ok(crate::autograd::record(
        "NativeLayerNormBackward",
        &inputs,
        y,
        saved,
        // With `x̂ = (x − mean)·rstd` and `ĝ = g·γ`: `dx = rstd·(ĝ − Σĝ/n − x̂·Σĝ·x̂/n)` over
        // each row (two row reductions, the second with `dx` as its epilogue where rows
        // stage), `dγ = Σ g·x̂` and `dβ = Σ g` over the rows — where differentiating the
        // composition took a dozen kernels. `x̂` and `ĝ` are written anew for each use, not
        // stored: a reduction's map reads γ (one value per position in a row) and the
        // statistics (one value per position in a column) where they are, so each use fuses
        // into its reduction.
        move |g| {
            // The statistics run now, on their own (one reduction, the mean's sum its
            // prologue: `rstd` first), so every use of `x̂` below reads them stored (else
            // `g·x̂`, for `dγ`, becomes the variance's epilogue). `Σ (ĝ − Σĝ/n)·x̂` (equal to
            // `Σ ĝ·x̂`: `Σ x̂ = 0`) takes `dx` as its epilogue: one pass over the rows after
            // the sum of `ĝ`.
            rstd.realize()?;
            mean.realize()?;
            // Where the backend runs it, one kernel: `dx` and the column sums in one pass.
            let weight_grad = shapes.0.is_some() && wants[1];
            let bias_grad = shapes.1.is_some() && wants[1 + shapes.0.is_some() as usize];
            let kernel = match wants[0] {
                true => layer_norm_kernel::backward(
                    &node_x,
                    g,
                    [&mean, &rstd],
                    node_w.as_ref(),
                    normalized,
                    weight_grad || bias_grad,
                )?,
                false => None,
            };
            if let Some(k) = kernel {
                let (gx, gs) = k.columns.unzip();
                let mut grads = vec![Some(k.dx)];
                for (shape, want, sum) in [(&shapes.0, weight_grad, gx), (&shapes.1, bias_grad, gs)]
                {
                    if let Some(shape) = shape {
                        let sum = sum.filter(|_| want);
                        grads.push(sum.map(|t| sum_to_shape(&t, shape)).transpose()?);
                    }
                }
                return in_dtypes(grads, &dtypes);
            }
            let xhat = || node_x.sub(&mean)?.mul(&rstd);
            let gw = || match &node_w {
                Some(w) => g.mul(w),
                None => Ok(g.clone()),
            };
            let mut grads = Vec::with_capacity(3);
            grads.push(match wants[0] {
                true => {
                    // (One mean of ĝ, read by the reduction and by its epilogue: a second one
                    // would be a second deferred sum, run on its own.)
                    let mean_g = gw()?.sum(axes.clone(), true)?.div(n)?;
                    let centred = || gw()?.sub(&mean_g);
                    let sum_gx = centred()?.mul(&xhat()?)?.sum(axes.clone(), true)?.div(n)?;
                    let dx = centred()?.sub(&xhat()?.mul(&sum_gx)?)?;
                    Some(dx.mul(&rstd)?)
                }
                false => None,
            });
            if let Some(shape) = &shapes.0 {
                let dw = wants[1].then(|| sum_to_shape(&g.mul(&xhat()?)?, shape));
                grads.push(dw.transpose()?);
            }
            if let Some(shape) = &shapes.1 {
                let k = 1 + shapes.0.is_some() as usize;
                grads.push(wants[k].then(|| sum_to_shape(g, shape)).transpose()?);
            }
            in_dtypes(grads, &dtypes)
        },
    ))
}

/// A normalization node's inputs (`x`, then γ and β where given), whether each wants a
/// gradient, and each one's dtype; `None` where none needs a gradient.
fn node_inputs<'a>(
    x: &'a Tensor,
    weight: Option<&'a Tensor>,
    bias: Option<&'a Tensor>,
) -> Option<(Vec<&'a Tensor>, Vec<bool>, Vec<DType>)> {
    let inputs: Vec<&Tensor> = std::iter::once(x).chain(weight).chain(bias).collect();
    crate::autograd::needed(inputs.iter().copied()).then(|| {
        let wants = inputs.iter().map(|t| t.requires_grad()).collect();
        let dtypes = inputs.iter().map(|t| t.dtype()).collect();
        (inputs, wants, dtypes)
    })
}

/// Each gradient in its input's dtype: with inputs of mixed dtypes (a bf16 `x`, f32 affine
/// parameters) the closed forms compute in the promoted one.
fn in_dtypes(grads: Vec<Option<Tensor>>, dtypes: &[DType]) -> Result<Vec<Option<Tensor>>> {
    grads
        .into_iter()
        .zip(dtypes)
        .map(|(g, &d)| match g {
            Some(g) if g.dtype() != d => g.to_dtype(d).map(Some),
            g => Ok(g),
        })
        .collect()
}

/// The mean and the biased variance of `x` over `axes` (kept), computed in the accumulation
/// dtype (the variance around that mean, as `Tensor::var` computes it) and rounded to `x`'s
/// dtype: one mean for both, so normalizing reads `x` for the mean once, then once for the
/// variance, whose reduction takes the normalization as its epilogue where rows stage.
fn moments(x: &Tensor, axes: &[isize]) -> Result<(Tensor, Tensor)> {
    let n: usize = axes.iter().map(|&a| x.shape()[a as usize]).product();
    // (No copy where `x` is already in the accumulation dtype: the mean's sum of `x` itself
    // is what the variance's reduction can take in as its prologue.)
    let in_dtype = |t: Tensor, d: DType| if t.dtype() == d { Ok(t) } else { t.to_dtype(d) };
    let wide = in_dtype(x.clone(), x.dtype().accumulator())?;
    let mean = wide.sum(axes.to_vec(), true)?.div(n as f64)?;
    let var = wide
        .sub(&mean)?
        .square()?
        .sum(axes.to_vec(), true)?
        .div(n as f64)?;
    Ok((in_dtype(mean, x.dtype())?, in_dtype(var, x.dtype())?))
}

/// `x` normalized over `axes` (biased variance), then `weight` and `bias` applied where given.
fn normalize(
    x: &Tensor,
    axes: Vec<isize>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    let (mean, var) = moments(x, &axes)?;
    affine(standardize(x, &mean, &var, eps)?, weight, bias)
}

/// `(x - mean) / sqrt(var + eps)`.
fn standardize(x: &Tensor, mean: &Tensor, var: &Tensor, eps: f64) -> Result<Tensor> {
    x.sub(mean)?.mul(&var.add(eps)?.rsqrt()?)
}

/// `y · weight + bias`, each where given (shaped to broadcast against `y`).
fn affine(y: Tensor, weight: Option<&Tensor>, bias: Option<&Tensor>) -> Result<Tensor> {
    let y = match weight {
        Some(w) => y.mul(w)?,
        None => y,
    };
    match bias {
        Some(b) => y.add(b),
        None => Ok(y),
    }
}

/// Per-channel affine parameters `[C]` shaped to broadcast against `[N, C, ...]` of rank `nd`.
fn per_channel(t: &Tensor, nd: usize) -> Result<Tensor> {
    let mut shape = vec![t.numel()];
    shape.extend(std::iter::repeat_n(1, nd.saturating_sub(2)));
    t.reshape(shape)
}

/// Group normalization of `x` (`[N, C, ...]`): the channels split into `groups` groups, each
/// sample's group normalized over its channels and positions (biased variance), then the
/// per-channel `weight` and `bias` (`[C]`) applied where given (PyTorch's `group_norm`).
///
/// ```
/// use strata_core::nn::functional::group_norm;
/// use strata_core::{Device, Tensor};
/// let x = Tensor::from_slice(&[1.0f64, 3.0, 10.0, 30.0], [1, 2, 2], &Device::cpu())?;
/// let y = group_norm(&x, 2, None, None, 0.0)?.to_vec::<f64>()?;
/// assert_eq!(y, vec![-1.0, 1.0, -1.0, 1.0]);
/// # Ok::<(), strata_core::Error>(())
/// ```
pub fn group_norm(
    x: &Tensor,
    groups: usize,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    let shape = x.shape().to_vec();
    if shape.len() < 2 || groups == 0 || !shape[1].is_multiple_of(groups) || !x.dtype().is_float() {
        return Err(Error::Shape(format!(
            "group_norm takes a float [N, C, ...] whose C splits into {groups} groups: got a {} \
             tensor of shape {shape:?}",
            x.dtype()
        )));
    }
    let grouped = x.reshape([shape[0], groups, x.numel() / (shape[0].max(1) * groups)])?;
    let y = normalize(&grouped, vec![2], None, None, eps)?.reshape(shape.clone())?;
    let weight = weight.map(|w| per_channel(w, shape.len())).transpose()?;
    let bias = bias.map(|b| per_channel(b, shape.len())).transpose()?;
    affine(y, weight.as_ref(), bias.as_ref())
}

/// The running statistics of [`batch_norm`], updated in place while training.
#[derive(Debug, Clone)]
pub struct RunningStats {
    /// The running mean of each channel (`[C]`).
    pub mean: Tensor,
    /// The running (unbiased) variance of each channel (`[C]`).
    pub var: Tensor,
    /// How much of each batch's statistic enters the running one (PyTorch's 0.1).
    pub momentum: f64,
}

/// Batch normalization of `x` (`[N, C, ...]`) per channel, as PyTorch's `batch_norm`: in
/// training, over the batch's samples and positions (biased variance), and `running` (where
/// given) updated in place, `r ← (1 − momentum)·r + momentum·statistic` with the unbiased
/// variance; out of training, with `running`'s statistics (required then). Then the
/// per-channel `weight` and `bias` (`[C]`) where given.
///
/// ```
/// use strata_core::nn::functional::{batch_norm, RunningStats};
/// use strata_core::{Device, DType, Tensor};
/// let dev = Device::cpu();
/// let x = Tensor::from_slice(&[1.0f64, 3.0], [2, 1], &dev)?;
/// let running = RunningStats {
///     mean: Tensor::zeros([1], DType::F64, &dev)?,
///     var: Tensor::ones([1], DType::F64, &dev)?,
///     momentum: 0.1,
/// };
/// let y = batch_norm(&x, Some(&running), None, None, true, 0.0)?;
/// assert_eq!(y.to_vec::<f64>()?, vec![-1.0, 1.0]);
/// assert_eq!(running.mean.to_vec::<f64>()?, vec![0.2]); // 0.9·0 + 0.1·2
/// # Ok::<(), strata_core::Error>(())
/// ```
pub fn batch_norm(
    x: &Tensor,
    running: Option<&RunningStats>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    eps: f64,
) -> Result<Tensor> {
    let shape = x.shape().to_vec();
    if shape.len() < 2 || !x.dtype().is_float() {
        return Err(Error::Shape(format!(
            "batch_norm takes a float [N, C, ...]: got a {} tensor of shape {shape:?}",
            x.dtype()
        )));
    }
    let nd = shape.len();
    let axes: Vec<isize> = (0..nd as isize).filter(|&a| a != 1).collect();
    if training {
        return batch_norm_training(x, running, weight, bias, eps, &axes);
    }
    let r = running.ok_or_else(|| {
        Error::Invalid("batch_norm out of training needs the running statistics".into())
    })?;
    let (mean, var) = (per_channel(&r.mean, nd)?, per_channel(&r.var, nd)?);
    let weight = weight.map(|w| per_channel(w, nd)).transpose()?;
    let bias = bias.map(|b| per_channel(b, nd)).transpose()?;
    affine(
        standardize(x, &mean, &var, eps)?,
        weight.as_ref(),
        bias.as_ref(),
    )
}

/// [`batch_norm`] in training: the batch's statistics (the mean and the biased variance: one
/// read of `x` where the backend runs [`Kernel::ChannelMoments`](crate::ir::Kernel::ChannelMoments),
/// else two per-channel reductions), `running` updated, and one node whose backward is
/// batch normalization's closed form — with `x̂ = (x − mean)·rstd`, `dβ = Σg`, `dγ = Σg·x̂`
/// and `dx = γ·rstd·(g − Σg/n − x̂·Σg·x̂/n)`: the two sums from one read of `x` and `g` where
/// the backend runs [`Kernel::ChannelGradSums`](crate::ir::Kernel::ChannelGradSums) (else two
/// per-channel reductions), and one elementwise kernel, where differentiating the composition
/// took a dozen kernels.
fn batch_norm_training(
    x: &Tensor,
    running: Option<&RunningStats>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
    axes: &[isize],
) -> Result<Tensor> {
    let shape = x.shape().to_vec();
    let nd = shape.len();
    let count = x.numel() / shape[1].max(1);
    if count < 2 {
        return Err(Error::Invalid(format!(
            "batch_norm in training needs more than one value per channel: shape {shape:?}"
        )));
    }
    let weight4 = weight.map(|w| per_channel(w, nd)).transpose()?;
    let bias4 = bias.map(|b| per_channel(b, nd)).transpose()?;
    let x = x.clone();
    let (mean, rstd, y) = crate::autograd::no_grad(|| -> Result<_> {
        let (mean, var) = match moments_kernel::channel_statistics(&x)? {
            Some(statistics) => statistics,
            None => {
                let mean = x.mean(axes.to_vec(), true)?;
                // `x − mean` written twice, not shared: each use fuses into its own kernel
                // (the variance's reduction, the output's map) instead of being stored between
                // them (the first is dropped before the running statistics' writes flush
                // pending work).
                let centered = x.sub(&mean)?;
                let var = centered.mul(&centered)?.mean(axes.to_vec(), true)?;
                (mean, var)
            }
        };
        if let Some(r) = running {
            // Each new value a tree bound alone (its intermediates dropped with it) over the
            // statistics in their own shape (a reshaped view of a pending tree would run it),
            // so its assignment is one kernel computing it into the running statistic.
            let m = r.momentum;
            let (running_mean, running_var) =
                (r.mean.reshape(mean.shape())?, r.var.reshape(var.shape())?);
            let new_mean = running_mean.mul(1.0 - m)?.add(&mean.mul(m)?)?;
            running_mean.assign(new_mean)?;
            let unbiased = count as f64 / (count - 1) as f64;
            let new_var = running_var.mul(1.0 - m)?.add(&var.mul(unbiased)?.mul(m)?)?;
            running_var.assign(new_var)?;
        }
        let rstd = var.add(eps)?.rsqrt()?;
        let y = affine(x.sub(&mean)?.mul(&rstd)?, weight4.as_ref(), bias4.as_ref())?;
        Ok((mean, rstd, y))
    })?;
    let Some((inputs, wants, dtypes)) = node_inputs(&x, weight, bias) else {
        return Ok(y);
    };
    let saved = vec![(shape.clone(), x.dtype())];
    let (has_weight, has_bias) = (weight.is_some(), bias.is_some());
    let axes = axes.to_vec();
    let channels = shape[1];
    let node_x = x.detach();
    Ok(crate::autograd::record(
        "NativeBatchNormBackward",
        &inputs,
        y,
        saved,
        move |g| {
            // `x̂` written anew for each use (see `layer_norm`'s backward).
            let xhat = || node_x.sub(&mean)?.mul(&rstd);
            let (sum_g, sum_gx) = match moments_kernel::channel_grad_sums(&node_x, g, &mean, &rstd)?
            {
                Some(sums) => sums,
                None => (
                    g.sum(axes.clone(), true)?,
                    g.mul(&xhat()?)?.sum(axes.clone(), true)?,
                ),
            };
            let mut grads = Vec::with_capacity(3);
            grads.push(match wants[0] {
                true => {
                    let n = count as f64;
                    let scale = match &weight4 {
                        Some(w) => rstd.mul(w)?,
                        None => rstd.clone(),
                    };
                    let dx = g
                        .sub(&sum_g.div(n)?)?
                        .sub(&xhat()?.mul(&sum_gx.div(n)?)?)?
                        .mul(&scale)?;
                    Some(dx)
                }
                false => None,
            });
            if has_weight {
                grads.push(wants[1].then(|| sum_gx.reshape([channels])).transpose()?);
            }
            if has_bias {
                let k = 1 + has_weight as usize;
                grads.push(wants[k].then(|| sum_g.reshape([channels])).transpose()?);
            }
            in_dtypes(grads, &dtypes)
        },
    ))
}
