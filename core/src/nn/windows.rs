//! Ops over sliding windows of `[N, C, H, W]` tensors (issue 40): `conv2d` (stride, padding,
//! dilation, groups) and `conv_transpose2d`, `max_pool2d` (with PyTorch's indices),
//! `avg_pool2d` and `adaptive_avg_pool2d`, re-exported in [`functional`](super::functional). Each is written
//! `conv2d` is one [`Kernel::Convolution`](crate::ir::Kernel::Convolution) per pass
//! ([`convolution`](super::convolution)); `conv_transpose2d` its backward-data pass, or a
//! `conv2d` of the input spread by the stride where that pass cannot give its output size. The
//! poolings are written with core's public ops over strided views: the view of the input that
//! one kernel offset `(i, j)` sees is a slice with the stride as its step (no im2col buffer),
//! a pooling an elementwise max or sum over the offsets (one fused kernel); their gradients
//! come from those ops (max pooling's is one scatter to the indices its forward pass found).

use crate::assign::Value;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::Axes;
use crate::s;
use crate::tensor::Tensor;

/// A pair of sizes along (height, width).
pub type Pair = [usize; 2];

/// The four sizes of an `[N, C, H, W]` tensor, or `Err` naming `what`.
fn nchw(t: &Tensor, what: &str) -> Result<[usize; 4]> {
    match *t.shape() {
        [n, c, h, w] => Ok([n, c, h, w]),
        _ => Err(Error::Shape(format!(
            "{what} takes a 4-D [N, C, H, W] tensor, got shape {:?}",
            t.shape()
        ))),
    }
}

/// Output length of a window walk: `(len + 2·pad − dil·(k − 1) − 1) / stride + 1`, or `Err`.
fn out_len(
    len: usize,
    k: usize,
    stride: usize,
    pad: usize,
    dil: usize,
    what: &str,
) -> Result<usize> {
    let span = dil * (k.max(1) - 1) + 1;
    if k == 0 || stride == 0 || dil == 0 || len + 2 * pad < span {
        return Err(Error::Shape(format!(
            "{what}: a window of {k} (dilation {dil}, stride {stride}) does not fit a length of \
             {len} padded by {pad} on each side"
        )));
    }
    Ok((len + 2 * pad - span) / stride + 1)
}

/// The view of `padded` (`[N, C, Hp, Wp]`) that kernel offset `(i, j)` reads for each of the
/// `out` positions: a strided slice, shape `[N, C, out_h, out_w]`.
fn offset_view(
    padded: &Tensor,
    (i, j): (usize, usize),
    stride: Pair,
    dil: Pair,
    out: Pair,
) -> Result<Tensor> {
    let (h0, w0) = (i * dil[0], j * dil[1]);
    let (h1, w1) = (
        h0 + stride[0] * (out[0] - 1) + 1,
        w0 + stride[1] * (out[1] - 1) + 1,
    );
    padded.slice(s![.., .., h0..h1; stride[0], w0..w1; stride[1]])
}

/// `t` in `dtype`: itself when it has it, else a converted copy.
fn as_dtype(t: &Tensor, dtype: DType) -> Result<Tensor> {
    match t.dtype() == dtype {
        true => Ok(t.clone()),
        false => t.to_dtype(dtype),
    }
}

/// The groups' parts joined along `axis`; one part as it is (no copy).
fn join_groups(mut parts: Vec<Tensor>, axis: isize) -> Result<Tensor> {
    match parts.len() {
        1 => Ok(parts.remove(0)),
        _ => Tensor::cat(&parts.iter().collect::<Vec<_>>(), axis),
    }
}

/// 2-D convolution (PyTorch's `conv2d`, a cross-correlation): `input` `[N, C, H, W]`,
/// `weight` `[O, C / groups, kH, kW]`, optional `bias` `[O]`; zero padding.
///
/// ```
/// use strata_core::nn::functional::conv2d;
/// use strata_core::{Device, DType, Tensor};
/// let dev = Device::cpu();
/// let x = Tensor::arange(0.0, 9.0, 1.0, DType::F32, &dev)?.reshape([1, 1, 3, 3])?;
/// let k = Tensor::ones([1, 1, 2, 2], DType::F32, &dev)?;
/// let y = conv2d(&x, &k, None, [1, 1], [0, 0], [1, 1], 1)?;
/// assert_eq!(y.to_vec::<f32>()?, vec![8.0, 12.0, 20.0, 24.0]);
/// # Ok::<(), strata_core::Error>(())
/// ```
pub fn conv2d(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    stride: Pair,
    padding: Pair,
    dilation: Pair,
    groups: usize,
) -> Result<Tensor> {
    let [_, c, h, w] = nchw(input, "conv2d")?;
    let [o, cg, kh, kw] = nchw(weight, "conv2d's weight")?;
    if groups == 0 || cg * groups != c || o % groups != 0 {
        return Err(Error::Shape(format!(
            "conv2d: {c} input channels and a weight of shape {:?} do not make {groups} groups \
             (the weight is [out, in / groups, kH, kW], out divisible by groups)",
            weight.shape()
        )));
    }
    let out = [
        out_len(h, kh, stride[0], padding[0], dilation[0], "conv2d")?,
        out_len(w, kw, stride[1], padding[1], dilation[1], "conv2d")?,
    ];
    let n = input.shape()[0];
    let with_bias = |y: Tensor| match bias {
        Some(b) => y.add(&b.reshape([o, 1, 1])?),
        None => Ok(y),
    };
    let dtype = float_dtype(input, weight, "conv2d")?;
    let geometry = crate::ir::ConvGeometry {
        stride,
        padding,
        dilation,
        groups,
    };
    let (x, k) = (as_dtype(input, dtype)?, as_dtype(weight, dtype)?);
    let y = super::convolution::run_pass(
        crate::ir::ConvPass::Forward,
        geometry,
        &x,
        &k,
        [n, o, out[0], out[1]],
    )?;
    with_bias(y)
}

/// The dtype a convolution of `a` and `b` computes in (PyTorch's promotion), which must be a
/// float one (PyTorch has no integer convolution either).
fn float_dtype(a: &Tensor, b: &Tensor, what: &str) -> Result<DType> {
    let dtype = crate::ops::promote_types(a.dtype(), b.dtype());
    if !dtype.is_float() {
        return Err(Error::DType(format!(
            "{what} takes float tensors: got {} and {} (convert with to_dtype)",
            a.dtype(),
            b.dtype()
        )));
    }
    Ok(dtype)
}

/// `x` with `stride - 1` zeros between neighbours along `axis`: length `(len - 1)·stride + 1`.
fn spread(x: &Tensor, axis: usize, stride: usize) -> Result<Tensor> {
    let len = x.shape()[axis];
    if stride == 1 || len == 0 {
        return Ok(x.clone());
    }
    let mut gap = x.shape().to_vec();
    gap.insert(axis + 1, stride - 1);
    let zeros = Tensor::zeros(gap, x.dtype(), x.device())?;
    let mut merged = x.shape().to_vec();
    merged[axis] = len * stride;
    Tensor::cat(
        &[&x.unsqueeze(axis as isize + 1)?, &zeros],
        axis as isize + 1,
    )?
    .reshape(merged)?
    .narrow(axis as isize, 0, (len - 1) * stride + 1)
}

/// Transposed 2-D convolution (PyTorch's `conv_transpose2d`, the gradient of `conv2d` with
/// respect to its input): `input` `[N, C, H, W]`, `weight` `[C, O / groups, kH, kW]`, optional
/// `bias` `[O]`. Each input pixel adds the kernel, scaled by it, into the output at
/// `stride`·position − `padding`; the output is
/// `(H − 1)·stride − 2·padding + dilation·(kH − 1) + output_padding + 1` high (so wide).
/// Written as a `conv2d` of the input spread out by the stride (zeros between pixels) with the
/// kernel flipped and its channel axes swapped.
///
/// ```
/// use strata_core::nn::functional::conv_transpose2d;
/// use strata_core::{Device, DType, Tensor};
/// let dev = Device::cpu();
/// let x = Tensor::from_slice(&[1.0f32, 2.0], [1, 1, 1, 2], &dev)?;
/// let k = Tensor::ones([1, 1, 2, 2], DType::F32, &dev)?;
/// // stride 2: each pixel stamps its own 2×2 block.
/// let y = conv_transpose2d(&x, &k, None, [2, 2], [0, 0], [0, 0], [1, 1], 1)?;
/// assert_eq!(y.shape(), &[1, 1, 2, 4]);
/// assert_eq!(y.to_vec::<f32>()?, vec![1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0]);
/// # Ok::<(), strata_core::Error>(())
/// ```
#[allow(clippy::too_many_arguments)]
pub fn conv_transpose2d(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    stride: Pair,
    padding: Pair,
    output_padding: Pair,
    dilation: Pair,
    groups: usize,
) -> Result<Tensor> {
    let [_, c, h, w] = nchw(input, "conv_transpose2d")?;
    let [wc, _, kh, kw] = nchw(weight, "conv_transpose2d's weight")?;
    if groups == 0 || wc != c || c % groups != 0 {
        return Err(Error::Shape(format!(
            "conv_transpose2d: {c} input channels and a weight of shape {:?} do not make \
             {groups} groups (the weight is [in, out / groups, kH, kW], in divisible by groups)",
            weight.shape()
        )));
    }
    let sizes = [(h, kh), (w, kw)];
    for a in 0..2 {
        let (len, k) = sizes[a];
        let span = dilation[a] * (k.max(1) - 1) + 1;
        let fits = (len.max(1) - 1) * stride[a] + span + output_padding[a] > 2 * padding[a];
        if k == 0 || len == 0 || stride[a] == 0 || dilation[a] == 0 || !fits {
            return Err(Error::Shape(format!(
                "conv_transpose2d: a window of {k} (dilation {}, stride {}, padding {}) over a \
                 length of {len} leaves no output",
                dilation[a], stride[a], padding[a]
            )));
        }
        if output_padding[a] >= stride[a].max(dilation[a]) {
            return Err(Error::Shape(format!(
                "conv_transpose2d: output_padding {output_padding:?} must be smaller than the \
                 stride {stride:?} or the dilation {dilation:?}"
            )));
        }
    }
    // The gradient pass it is (cuDNN's and PyTorch's way), when that pass's forward maps the
    // output back to the input's size (an output_padding past the stride, possible with a
    // dilation, does not).
    let dtype = float_dtype(input, weight, "conv_transpose2d")?;
    let geometry = crate::ir::ConvGeometry {
        stride,
        padding,
        dilation,
        groups,
    };
    let out = [0, 1].map(|a| {
        let (len, k) = sizes[a];
        (len - 1) * stride[a] + dilation[a] * (k - 1) + output_padding[a] + 1 - 2 * padding[a]
    });
    if geometry.out_len(0, out[0], kh) == h && geometry.out_len(1, out[1], kw) == w {
        let o = weight.shape()[1] * groups;
        let y = super::convolution::run_pass(
            crate::ir::ConvPass::BackwardData,
            geometry,
            &as_dtype(input, dtype)?,
            &as_dtype(weight, dtype)?,
            [input.shape()[0], o, out[0], out[1]],
        )?;
        return match bias {
            Some(b) => y.add(&b.reshape([o, 1, 1])?),
            None => Ok(y),
        };
    }
    let spread_input = spread(&spread(input, 2, stride[0])?, 3, stride[1])?;
    let edge = |a: usize, k: usize| (dilation[a] * (k - 1)) as isize - padding[a] as isize;
    let (eh, ew) = (edge(0, kh), edge(1, kw));
    let padded = spread_input.pad(
        &[
            (eh, eh + output_padding[0] as isize),
            (ew, ew + output_padding[1] as isize),
        ],
        0,
    )?;
    // [C, O/g, kH, kW] → [O, C/g, kH, kW], each group's channel axes swapped, kernel flipped.
    let cg = c / groups;
    let mut parts = Vec::with_capacity(groups);
    for g in 0..groups {
        parts.push(
            weight
                .narrow(0, g * cg, cg)?
                .transpose(0, 1)?
                .flip(&[2, 3])?,
        );
    }
    let flipped = join_groups(parts, 0)?;
    conv2d(&padded, &flipped, bias, [1, 1], [0, 0], dilation, groups)
}

/// Checks a pooling's window against PyTorch's rule (padding at most half the kernel).
fn pool_out(input: &Tensor, kernel: Pair, stride: Pair, padding: Pair, what: &str) -> Result<Pair> {
    let [_, _, h, w] = nchw(input, what)?;
    if padding[0] * 2 > kernel[0] || padding[1] * 2 > kernel[1] {
        return Err(Error::Shape(format!(
            "{what}: padding {padding:?} is more than half the kernel {kernel:?}"
        )));
    }
    Ok([
        out_len(h, kernel[0], stride[0], padding[0], 1, what)?,
        out_len(w, kernel[1], stride[1], padding[1], 1, what)?,
    ])
}

/// Max pooling (PyTorch's `max_pool2d` with `return_indices`): the largest value of each
/// window (implicit `-inf` padding; NaN wins, as PyTorch's), and its position, as an i64
/// index `h·W + w` into its input plane. Ties go to the first position in the window, which
/// also gets the gradient.
///
/// ```
/// use strata_core::nn::functional::max_pool2d;
/// use strata_core::{Device, Tensor};
/// let x = Tensor::from_slice(&[1.0f32, 5.0, 3.0, 2.0], [1, 1, 2, 2], &Device::cpu())?;
/// let (v, i) = max_pool2d(&x, [2, 2], [2, 2], [0, 0])?;
/// assert_eq!((v.to_vec::<f32>()?, i.to_vec::<i64>()?), (vec![5.0], vec![1]));
/// # Ok::<(), strata_core::Error>(())
/// ```
pub fn max_pool2d(
    input: &Tensor,
    kernel: Pair,
    stride: Pair,
    padding: Pair,
) -> Result<(Tensor, Tensor)> {
    let (values, index) = crate::autograd::no_grad(|| max_windows(input, kernel, stride, padding))?;
    if !crate::autograd::needed([input]) {
        return Ok((values, index));
    }
    // The gradient goes where the indices say: each output's gradient added at its window's
    // chosen position (one scatter, instead of differentiating the comparisons and views).
    let [n, c, h, w] = nchw(input, "max_pool2d")?;
    let cells = index.numel() / (n * c).max(1);
    let at = index.reshape([n, c, cells])?;
    let saved = crate::autograd::graph::Saved::new(&at, "MaxPool2dBackward");
    let described = vec![saved.describe()];
    let values =
        crate::autograd::record("MaxPool2dBackward", &[input], values, described, move |g| {
            let grad = Tensor::zeros([n, c, h * w], g.dtype(), g.device())?;
            // The forward's own indices, each inside its plane (`max_windows`), unwritten
            // since (`Saved`): no check, which would read back to the host mid-backward.
            let at = saved.get()?;
            let g = Value::Tensor(g.reshape([n, c, cells])?);
            grad.scatter_in_range(2, at, g, true, "max_pool2d's backward")?;
            Ok(vec![Some(grad.reshape([n, c, h, w])?)])
        });
    Ok((values, index))
}

/// [`max_pool2d`]'s values and indices: an elementwise max over the windows' strided views.
fn max_windows(
    input: &Tensor,
    kernel: Pair,
    stride: Pair,
    padding: Pair,
) -> Result<(Tensor, Tensor)> {
    let out = pool_out(input, kernel, stride, padding, "max_pool2d")?;
    if !input.dtype().is_float() {
        return Err(Error::DType(format!(
            "max_pool2d takes a float tensor, not {}",
            input.dtype()
        )));
    }
    let [_, _, h, w] = nchw(input, "max_pool2d")?;
    let pads = [
        (padding[0] as isize, padding[0] as isize),
        (padding[1] as isize, padding[1] as isize),
    ];
    let padded = input.pad(&pads, f64::NEG_INFINITY)?;
    let dev = input.device();
    // Each output position's window corner in the unpadded plane (may be negative).
    let rows = Tensor::arange(0, out[0] as i64, 1, DType::I64, dev)?
        .mul(stride[0] as i64)?
        .sub(padding[0] as i64)?
        .reshape([out[0], 1])?;
    let cols = Tensor::arange(0, out[1] as i64, 1, DType::I64, dev)?
        .mul(stride[1] as i64)?
        .sub(padding[1] as i64)?
        .reshape([1, out[1]])?;
    let corner = rows.mul(w as i64)?.add(&cols)?;
    // With padding, which cells of the padded plane are the input's: a padding cell never
    // wins over one of them, so a window whose values are all -inf picks its first real
    // position (as PyTorch), and every index lies in the plane (each window holds a real
    // cell: the padding is at most half the kernel).
    let inside = match padding != [0, 0] {
        true => Some(Tensor::ones([1, 1, h, w], DType::Bool, dev)?.pad(&pads, false)?),
        false => None,
    };
    let mut best: Option<(Tensor, Tensor, Option<Tensor>)> = None;
    for i in 0..kernel[0] {
        for j in 0..kernel[1] {
            let v = offset_view(&padded, (i, j), stride, [1, 1], out)?;
            let at = corner.add((i * w + j) as i64)?;
            let real = match &inside {
                Some(m) => Some(offset_view(m, (i, j), stride, [1, 1], out)?),
                None => None,
            };
            best = Some(match best {
                None => {
                    let at = at.expand(v.shape().to_vec())?;
                    (v, at, real)
                }
                Some((b, bi, b_real)) => {
                    let mut better = v.gt(&b)?.logical_or(&v.isnan()?)?;
                    let mut now_real = None;
                    if let (Some(r), Some(br)) = (&real, &b_real) {
                        better = better.logical_or(&r.logical_and(&br.logical_not()?)?)?;
                        now_real = Some(Tensor::where_cond(&better, r, br)?);
                    }
                    (
                        Tensor::where_cond(&better, &v, &b)?,
                        Tensor::where_cond(&better, &at, &bi)?,
                        now_real,
                    )
                }
            });
        }
    }
    let (values, index, _) =
        best.ok_or_else(|| Error::Shape("max_pool2d: an empty kernel".into()))?;
    Ok((values, index.contiguous()?))
}

/// Average pooling (PyTorch's `avg_pool2d` with `count_include_pad=True`): each window's
/// sum divided by the kernel's size, zero padding counted.
///
/// ```
/// use strata_core::nn::functional::avg_pool2d;
/// use strata_core::{Device, Tensor};
/// let x = Tensor::from_slice(&[1.0f32, 5.0, 3.0, 3.0], [1, 1, 2, 2], &Device::cpu())?;
/// assert_eq!(avg_pool2d(&x, [2, 2], [2, 2], [0, 0])?.to_vec::<f32>()?, vec![3.0]);
/// # Ok::<(), strata_core::Error>(())
/// ```
pub fn avg_pool2d(input: &Tensor, kernel: Pair, stride: Pair, padding: Pair) -> Result<Tensor> {
    let out = pool_out(input, kernel, stride, padding, "avg_pool2d")?;
    let pads = [
        (padding[0] as isize, padding[0] as isize),
        (padding[1] as isize, padding[1] as isize),
    ];
    let padded = input.pad(&pads, 0)?;
    let mut sum: Option<Tensor> = None;
    for i in 0..kernel[0] {
        for j in 0..kernel[1] {
            let v = offset_view(&padded, (i, j), stride, [1, 1], out)?;
            sum = Some(match sum {
                Some(s) => s.add(&v)?,
                None => v,
            });
        }
    }
    let sum = sum.ok_or_else(|| Error::Shape("avg_pool2d: an empty kernel".into()))?;
    sum.div((kernel[0] * kernel[1]) as f64)
}

/// Adaptive average pooling (PyTorch's `adaptive_avg_pool2d`): output cell `(a, b)` is the
/// mean of rows `⌊a·H/oH⌋ .. ⌈(a+1)·H/oH⌉` and the same for columns, so any output size fits
/// any input (`[1, 1]`: the global mean of each plane).
///
/// ```
/// use strata_core::nn::functional::adaptive_avg_pool2d;
/// use strata_core::{Device, DType, Tensor};
/// let x = Tensor::arange(0.0, 6.0, 1.0, DType::F32, &Device::cpu())?.reshape([1, 1, 2, 3])?;
/// assert_eq!(adaptive_avg_pool2d(&x, [1, 1])?.to_vec::<f32>()?, vec![2.5]);
/// # Ok::<(), strata_core::Error>(())
/// ```
pub fn adaptive_avg_pool2d(input: &Tensor, output: Pair) -> Result<Tensor> {
    let [_, _, h, w] = nchw(input, "adaptive_avg_pool2d")?;
    if output[0] == 0 || output[1] == 0 {
        return Err(Error::Shape(format!(
            "adaptive_avg_pool2d: an output size of {output:?}"
        )));
    }
    let span = |k: usize, len: usize, n: usize| (k * len / n, ((k + 1) * len).div_ceil(n));
    let mut rows = Vec::with_capacity(output[0]);
    for a in 0..output[0] {
        let (r0, r1) = span(a, h, output[0]);
        let mut cells = Vec::with_capacity(output[1]);
        for b in 0..output[1] {
            let (c0, c1) = span(b, w, output[1]);
            let cell = input.slice(s![.., .., r0..r1, c0..c1])?;
            cells.push(cell.mean(Axes::from(vec![2isize, 3]), true)?);
        }
        let refs: Vec<&Tensor> = cells.iter().collect();
        rows.push(Tensor::cat(&refs, 3)?);
    }
    let refs: Vec<&Tensor> = rows.iter().collect();
    Tensor::cat(&refs, 2)
}
