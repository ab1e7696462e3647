//! `conv2d` as one [`Kernel::Convolution`] per pass (cuDNN on CUDA, or strata's own
//! implicit-GEMM kernel where cuDNN is absent; implicit GEMM on wgpu; direct loops on the CPU).
//! `conv_transpose2d` is the backward-data pass. The three passes are bilinear and each one's
//! gradients are the other two:
//!
//! | pass (inputs → output) | gradient of its first input | of its second |
//! |---|---|---|
//! | forward (`x`, `w` → `y`) | backward data (`g`, `w`) | backward filter (`x`, `g`) |
//! | backward data (`dy`, `w` → `dx`) | forward (`g`, `w`) | backward filter (`g`, `dy`) |
//! | backward filter (`x`, `dy` → `dw`) | backward data (`dy`, `g`) | forward (`x`, `g`) |

use crate::error::{Error, Result};
use crate::ir::{ConvGeometry, ConvPass, Kernel};
use crate::tensor::{launch, Tensor};

/// `pass` over `a` and `b` (one float dtype, `[N, C, H, W]`-shaped, any strides) into a new
/// tensor of shape `out`, with its backward node when either input requires a gradient.
pub(super) fn run_pass(
    pass: ConvPass,
    geometry: ConvGeometry,
    a: &Tensor,
    b: &Tensor,
    out: [usize; 4],
) -> Result<Tensor> {
    if crate::autograd::needed([a, b]) {
        let y = crate::autograd::no_grad(|| run_pass(pass, geometry, a, b, out))?;
        return Ok(record(pass, geometry, a, b, y));
    }
    if a.dtype() != b.dtype() || !a.dtype().is_float() {
        return Err(Error::DType(format!(
            "internal error: a {} of {} and {} (one float dtype expected)",
            pass.name(),
            a.dtype(),
            b.dtype()
        )));
    }
    // A sum over no terms (an empty operand) is zero.
    if a.numel() == 0 || b.numel() == 0 {
        return Tensor::zeros(out, a.dtype(), a.device());
    }
    if let Some(y) = pointwise(pass, &geometry, a, b, out)? {
        return Ok(y);
    }
    let (a, b) = (a.contiguous()?, b.contiguous()?);
    let y = Tensor::alloc(&out, a.dtype(), a.device())?;
    let tf32 = a.dtype() == crate::dtype::DType::F32 && a.device().allow_tf32();
    let kernel = Kernel::Convolution {
        pass,
        geometry,
        tf32,
    };
    launch(kernel, &y, &[&a, &b], Vec::new())?;
    Ok(y)
}

/// A 1×1 window that steps one pixel, unpadded and in one group, reads each pixel once: its
/// forward pass is the weight `[O, C]` times each sample's `[C, H·W]` pixels and its
/// backward-data pass the weight's transpose times each sample's `[O, H·W]` gradient, one
/// batched matmul each (cuBLAS on CUDA, measured faster than cuDNN's forward on an H200).
/// `None` for other shapes and the backward-filter pass. Matmul promotes mixed dtypes and
/// records its own gradients.
pub(super) fn pointwise(
    pass: ConvPass,
    g: &ConvGeometry,
    a: &Tensor,
    b: &Tensor,
    [n, o, h, w]: [usize; 4],
) -> Result<Option<Tensor>> {
    let k = b.shape();
    if k[2..] != [1, 1] || g.stride != [1, 1] || g.padding != [0, 0] || g.groups != 1 {
        return Ok(None);
    }
    let (ko, kc) = (k[0], k[1]);
    // Contiguous, as cuBLAS takes them (a gradient may come broadcast: `sum`'s, all strides 0).
    let a = a.contiguous()?;
    Ok(Some(match pass {
        ConvPass::Forward => b
            .reshape([ko, kc])?
            .matmul(&a.reshape([n, kc, h * w])?)?
            .reshape([n, o, h, w])?,
        ConvPass::BackwardData => b
            .reshape([ko, kc])?
            .t()?
            .matmul(&a.reshape([n, ko, h * w])?)?
            .reshape([n, o, h, w])?,
        ConvPass::BackwardFilter => return Ok(None),
    }))
}

/// `y = pass(a, b)` with its backward node (see the module's table).
fn record(pass: ConvPass, geometry: ConvGeometry, a: &Tensor, b: &Tensor, y: Tensor) -> Tensor {
    use crate::autograd::graph::Saved;
    let name = match pass {
        ConvPass::Forward => "ConvolutionBackward",
        ConvPass::BackwardData => "ConvolutionBackwardDataBackward",
        ConvPass::BackwardFilter => "ConvolutionBackwardFilterBackward",
    };
    let (sa, sb) = (Saved::new(a, pass.name()), Saved::new(b, pass.name()));
    let described = vec![sa.describe(), sb.describe()];
    let (need_a, need_b) = (a.requires_grad(), b.requires_grad());
    crate::autograd::record(name, &[a, b], y, described, move |g| {
        let (a, b) = (sa.get()?, sb.get()?);
        let shape = |t: &Tensor| -> [usize; 4] {
            let s = t.shape();
            [s[0], s[1], s[2], s[3]]
        };
        let g = &match g.dtype() == a.dtype() {
            true => g.clone(),
            false => g.to_dtype(a.dtype())?,
        };
        let (ga, gb) = match pass {
            ConvPass::Forward => (
                (ConvPass::BackwardData, g, b),
                (ConvPass::BackwardFilter, a, g),
            ),
            ConvPass::BackwardData => ((ConvPass::Forward, g, b), (ConvPass::BackwardFilter, g, a)),
            ConvPass::BackwardFilter => ((ConvPass::BackwardData, b, g), (ConvPass::Forward, a, g)),
        };
        let ga = match need_a {
            true => Some(run_pass(ga.0, geometry, ga.1, ga.2, shape(a))?),
            false => None,
        };
        let gb = match need_b {
            true => Some(run_pass(gb.0, geometry, gb.1, gb.2, shape(b))?),
            false => None,
        };
        Ok(vec![ga, gb])
    })
}
