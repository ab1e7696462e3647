//! The small ResNet-style CNN of issue 40's training-step benchmark, the same network as
//! `scripts/bench_cnn_torch.py` builds in PyTorch: 32×32 RGB inputs, three stages of
//! 3×3 conv (no bias) → batch norm → ReLU with 64, 128 and 256 channels, a 2×2 max-pool after
//! the second and third, a residual block (two more conv-BN-ReLU, added to their input) after
//! each pool, then a global average pool and a linear layer to 10 classes; cross-entropy.
//!
//! `bench_gpu cnn` times one AdamW step of it on one device; `bench_gpu dp` the same step
//! data-parallel over several GPUs (each its shard of the batch, gradients averaged by NCCL).

use strata::nn::functional::{adaptive_avg_pool2d, cross_entropy, Reduction};
use strata::nn::{BatchNorm2d, Conv2d, Linear, MaxPool2d, Module};
use strata::prelude::*;
use strata::random::Generator;

/// 3×3 convolution (padding 1, no bias: the batch norm's shift replaces it), batch norm, ReLU.
struct ConvBnRelu {
    conv: Conv2d,
    bn: BatchNorm2d,
}

impl ConvBnRelu {
    fn new(inputs: usize, outputs: usize, g: &mut Generator, dev: &Device) -> Result<Self> {
        let mut conv = Conv2d::new(inputs, outputs, [3, 3], [1, 1], [1, 1], DType::F32, g, dev)?;
        conv.bias = None;
        let bn = BatchNorm2d::new(outputs, DType::F32, dev)?;
        Ok(ConvBnRelu { conv, bn })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.bn.forward(&self.conv.forward(x)?)?.relu()
    }

    fn parameters(&self) -> Vec<Tensor> {
        let mut p = self.conv.parameters();
        p.extend(self.bn.parameters());
        p
    }
}

/// (in, out, side) of each conv-BN-ReLU block, in order: the first stage, the second stage,
/// its residual block's two, the third stage, its residual block's two.
const BLOCKS: [(usize, usize, usize); 7] = [
    (3, 64, 32),
    (64, 128, 32),
    (128, 128, 16),
    (128, 128, 16),
    (128, 256, 16),
    (256, 256, 8),
    (256, 256, 8),
];

/// The network; its parameters in a fixed order (the same on every replica).
pub struct Cnn {
    blocks: Vec<ConvBnRelu>,
    head: Linear,
}

impl Cnn {
    /// PyTorch's default initializations from generator `seed`, f32, on `dev`.
    pub fn new(seed: u64, dev: &Device) -> Result<Cnn> {
        let g = &mut Generator::new(seed);
        let blocks = BLOCKS
            .iter()
            .map(|&(i, o, _)| ConvBnRelu::new(i, o, g, dev))
            .collect::<Result<_>>()?;
        let head = Linear::new(256, 10, true, DType::F32, g, dev)?;
        Ok(Cnn { blocks, head })
    }

    /// Every parameter, in the order of the layers.
    pub fn parameters(&self) -> Vec<Tensor> {
        let mut p: Vec<Tensor> = self.blocks.iter().flat_map(|b| b.parameters()).collect();
        p.extend(self.head.parameters());
        p
    }

    /// The same network over `params` (a replica's copies, in [`parameters`](Self::parameters)'
    /// order) instead of its own.
    pub fn with_parameters(mut self, params: &[Tensor]) -> Result<Cnn> {
        let mut it = params.iter().cloned();
        let mut next = || {
            it.next()
                .ok_or_else(|| Error::Invalid("Cnn::with_parameters: too few tensors".into()))
        };
        for b in &mut self.blocks {
            b.conv.weight = next()?;
            b.bn.weight = next()?;
            b.bn.bias = next()?;
        }
        self.head.weight = next()?;
        self.head.bias = Some(next()?);
        Ok(self)
    }

    /// The mean cross-entropy of `x` `[N, 3, 32, 32]` against classes `y` `[N]`.
    pub fn loss(&self, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        let pool = MaxPool2d::new([2, 2]);
        let b = &self.blocks;
        let h = b[0].forward(x)?;
        let h = pool.forward(&b[1].forward(&h)?)?;
        let h = h.add(&b[3].forward(&b[2].forward(&h)?)?)?;
        let h = pool.forward(&b[4].forward(&h)?)?;
        let h = h.add(&b[6].forward(&b[5].forward(&h)?)?)?;
        let features = adaptive_avg_pool2d(&h, [1, 1])?.reshape([h.shape()[0], 256])?;
        cross_entropy(&self.head.forward(&features)?, y, 0.0, Reduction::Mean)
    }

    /// Multiply-adds ×2 of one forward pass over a batch of `n` (the convolutions and the
    /// linear layer).
    pub fn forward_flops(n: usize) -> f64 {
        let conv: usize = BLOCKS.iter().map(|(i, o, s)| 2 * i * 9 * o * s * s).sum();
        (n * (conv + 2 * 256 * 10)) as f64
    }
}

/// Host microseconds of the pieces of one conv-BN-ReLU block at the second stage's shapes
/// (`[batch, 64, 32, 32]` in, 128 channels out), each realized, with gradients recorded:
/// where the step's host time goes. Each the median of 20, the device idle at the start.
pub fn host_breakdown(dev: &Device, batch: usize) -> Result<Vec<(&'static str, f64)>> {
    use std::time::Instant;
    use strata::nn::functional::max_pool2d;
    let g = &mut Generator::new(3);
    let block = ConvBnRelu::new(64, 128, g, dev)?;
    let x = Tensor::randn([batch, 64, 32, 32], DType::F32, g, dev)?.requires_grad_(true)?;
    let y = block.conv.forward(&x)?;
    y.realize()?;
    let mut rows = Vec::new();
    let mut measure = |name: &'static str, f: &mut dyn FnMut() -> Result<()>| -> Result<()> {
        let mut runs = Vec::new();
        for k in 0..23 {
            dev.synchronize()?;
            let t = Instant::now();
            f()?;
            if k >= 3 {
                runs.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        dev.synchronize()?;
        rows.push((name, crate::median(runs)));
        Ok(())
    };
    measure("conv2d forward", &mut || block.conv.forward(&x)?.realize())?;
    measure("batch_norm forward", &mut || {
        block.bn.forward(&y)?.realize()
    })?;
    measure("relu", &mut || y.relu()?.realize())?;
    measure("max_pool2d forward", &mut || {
        max_pool2d(&y, [2, 2], [2, 2], [0, 0])?.0.realize()
    })?;
    measure("block forward", &mut || block.forward(&x)?.realize())?;
    measure("block forward + backward", &mut || {
        block
            .forward(&x)?
            .sum(strata::ops::Axes::All, false)?
            .backward()?;
        x.zero_grad();
        for p in block.parameters() {
            p.zero_grad();
        }
        Ok(())
    })?;
    measure("conv2d forward + backward", &mut || {
        block
            .conv
            .forward(&x)?
            .sum(strata::ops::Axes::All, false)?
            .backward()?;
        x.zero_grad();
        block.conv.weight.zero_grad();
        Ok(())
    })?;
    measure("batch_norm forward + backward", &mut || {
        let y = y.detach().requires_grad_(true)?;
        block
            .bn
            .forward(&y)?
            .sum(strata::ops::Axes::All, false)?
            .backward()?;
        block.bn.weight.zero_grad();
        block.bn.bias.zero_grad();
        Ok(())
    })?;
    Ok(rows)
}
