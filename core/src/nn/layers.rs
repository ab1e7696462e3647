//! A small layer API over [`functional`](super::functional) (issue 40; candle-nn's size, not
//! PyTorch's): the [`Module`] trait (`forward`, `parameters`, `train`), [`Linear`],
//! [`Conv2d`], [`BatchNorm2d`], [`LayerNorm`], [`Dropout`], [`Relu`], [`MaxPool2d`],
//! [`AvgPool2d`], [`Flatten`] and [`Sequential`], with PyTorch's default initializations drawn from a seeded
//! [`Generator`]. Parameters are leaves that require a gradient; give `parameters()` to an
//! optimizer.
//!
//! ```
//! use strata_core::nn::{Linear, Module, Relu, Sequential};
//! use strata_core::{random::Generator, Device, DType, Tensor};
//! let (dev, mut g) = (Device::cpu(), Generator::new(0));
//! let net = Sequential::new()
//!     .layer(Linear::new(4, 8, true, DType::F32, &mut g, &dev)?)
//!     .layer(Relu)
//!     .layer(Linear::new(8, 2, true, DType::F32, &mut g, &dev)?);
//! let y = net.forward(&Tensor::ones([3, 4], DType::F32, &dev)?)?;
//! assert_eq!(y.shape(), &[3, 2]);
//! assert_eq!(net.parameters().len(), 4);
//! # Ok::<(), strata_core::Error>(())
//! ```

use super::functional::{self, Pair, RunningStats};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::random::Generator;
use crate::sync::LockUnpoisoned;
use crate::tensor::Tensor;
use std::sync::Mutex;

/// A layer: a forward pass over its parameters.
pub trait Module: Send + Sync {
    /// The layer applied to `x`.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;
    /// Its parameters (leaves requiring a gradient), for an optimizer; none by default.
    fn parameters(&self) -> Vec<Tensor> {
        Vec::new()
    }
    /// Training (`true`, the default) or evaluation behaviour, for the layers that differ
    /// (dropout, batch normalization); others ignore it.
    fn train(&mut self, training: bool) {
        let _ = training;
    }
}

/// Values uniform in `[-bound, bound)`, a leaf requiring a gradient.
fn uniform(
    shape: &[usize],
    bound: f64,
    dtype: DType,
    gen: &mut Generator,
    dev: &Device,
) -> Result<Tensor> {
    Tensor::rand(shape.to_vec(), dtype, gen, dev)?
        .mul(2.0 * bound)?
        .sub(bound)?
        .requires_grad_(true)
}

/// `x · weightᵀ + bias`, PyTorch's `nn.Linear`: weight `[out, in]` and bias `[out]` uniform in
/// `±1/√in`.
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out, in]`.
    pub weight: Tensor,
    /// `[out]`, where the layer has one.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// A layer from `inputs` to `outputs` features, initialized as PyTorch's.
    pub fn new(
        inputs: usize,
        outputs: usize,
        bias: bool,
        dtype: DType,
        gen: &mut Generator,
        dev: &Device,
    ) -> Result<Linear> {
        let bound = 1.0 / (inputs.max(1) as f64).sqrt();
        Ok(Linear {
            weight: uniform(&[outputs, inputs], bound, dtype, gen, dev)?,
            bias: if bias {
                Some(uniform(&[outputs], bound, dtype, gen, dev)?)
            } else {
                None
            },
        })
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        functional::linear(x, &self.weight, self.bias.as_ref())
    }
    fn parameters(&self) -> Vec<Tensor> {
        std::iter::once(self.weight.clone())
            .chain(self.bias.clone())
            .collect()
    }
}

/// PyTorch's `nn.Conv2d`: weight `[out, in / groups, kH, kW]` and bias `[out]` uniform in
/// `±1/√(in / groups · kH · kW)`.
#[derive(Debug, Clone)]
pub struct Conv2d {
    /// `[out, in / groups, kH, kW]`.
    pub weight: Tensor,
    /// `[out]`, where the layer has one.
    pub bias: Option<Tensor>,
    /// Step between windows.
    pub stride: Pair,
    /// Zeros around the input.
    pub padding: Pair,
    /// Spacing of the kernel's taps.
    pub dilation: Pair,
    /// Channel groups.
    pub groups: usize,
}

impl Conv2d {
    /// A convolution from `inputs` to `outputs` channels with a `kernel`, stride and
    /// padding (dilation 1, one group), initialized as PyTorch's.
    ///
    /// ```
    /// use strata_core::nn::{Conv2d, Module};
    /// use strata_core::{random::Generator, Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let conv = Conv2d::new(3, 8, [3, 3], [1, 1], [1, 1], DType::F32, &mut Generator::new(0), &dev)?;
    /// let y = conv.forward(&Tensor::ones([2, 3, 5, 5], DType::F32, &dev)?)?;
    /// assert_eq!(y.shape(), &[2, 8, 5, 5]);
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        inputs: usize,
        outputs: usize,
        kernel: Pair,
        stride: Pair,
        padding: Pair,
        dtype: DType,
        gen: &mut Generator,
        dev: &Device,
    ) -> Result<Conv2d> {
        let fan_in = inputs * kernel[0] * kernel[1];
        let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
        Ok(Conv2d {
            weight: uniform(
                &[outputs, inputs, kernel[0], kernel[1]],
                bound,
                dtype,
                gen,
                dev,
            )?,
            bias: Some(uniform(&[outputs], bound, dtype, gen, dev)?),
            stride,
            padding,
            dilation: [1, 1],
            groups: 1,
        })
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        functional::conv2d(
            x,
            &self.weight,
            self.bias.as_ref(),
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
        )
    }
    fn parameters(&self) -> Vec<Tensor> {
        std::iter::once(self.weight.clone())
            .chain(self.bias.clone())
            .collect()
    }
}

/// PyTorch's `nn.BatchNorm2d`: per-channel weight (ones) and bias (zeros), running
/// statistics (zeros and ones, momentum 0.1) updated while training, used in evaluation.
#[derive(Debug, Clone)]
pub struct BatchNorm2d {
    /// `[C]`, ones at first.
    pub weight: Tensor,
    /// `[C]`, zeros at first.
    pub bias: Tensor,
    /// The running mean and variance.
    pub running: RunningStats,
    /// Added to the variance (1e-5).
    pub eps: f64,
    /// Training (batch statistics) or evaluation (running statistics).
    pub training: bool,
}

impl BatchNorm2d {
    /// A batch normalization of `channels` channels.
    ///
    /// ```
    /// use strata_core::nn::{BatchNorm2d, Module};
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let mut bn = BatchNorm2d::new(2, DType::F32, &dev)?;
    /// bn.forward(&Tensor::ones([4, 2, 3, 3], DType::F32, &dev)?)?;
    /// assert_eq!(bn.running.mean.to_vec::<f32>()?, vec![0.1, 0.1]);
    /// bn.train(false); // evaluation: the running statistics
    /// assert!(!bn.training);
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn new(channels: usize, dtype: DType, dev: &Device) -> Result<BatchNorm2d> {
        Ok(BatchNorm2d {
            weight: Tensor::ones([channels], dtype, dev)?.requires_grad_(true)?,
            bias: Tensor::zeros([channels], dtype, dev)?.requires_grad_(true)?,
            running: RunningStats {
                mean: Tensor::zeros([channels], dtype, dev)?,
                var: Tensor::ones([channels], dtype, dev)?,
                momentum: 0.1,
            },
            eps: 1e-5,
            training: true,
        })
    }
}

impl Module for BatchNorm2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        functional::batch_norm(
            x,
            Some(&self.running),
            Some(&self.weight),
            Some(&self.bias),
            self.training,
            self.eps,
        )
    }
    fn parameters(&self) -> Vec<Tensor> {
        vec![self.weight.clone(), self.bias.clone()]
    }
    fn train(&mut self, training: bool) {
        self.training = training;
    }
}

/// PyTorch's `nn.LayerNorm` over the last `normalized` axes of shape `shape`: weight (ones)
/// and bias (zeros) of that shape.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    /// Ones at first.
    pub weight: Tensor,
    /// Zeros at first.
    pub bias: Tensor,
    /// Added to the variance (1e-5).
    pub eps: f64,
}

impl LayerNorm {
    /// A layer normalization over trailing axes of `shape`.
    ///
    /// ```
    /// use strata_core::nn::{LayerNorm, Module};
    /// use strata_core::{Device, Tensor};
    /// let dev = Device::cpu();
    /// let ln = LayerNorm::new(&[2], strata_core::DType::F64, &dev)?;
    /// let x = Tensor::from_slice(&[1.0f64, 3.0], [1, 2], &dev)?;
    /// let y = ln.forward(&x)?.to_vec::<f64>()?;
    /// assert!((y[0] + 1.0).abs() < 1e-4 && (y[1] - 1.0).abs() < 1e-4);
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn new(shape: &[usize], dtype: DType, dev: &Device) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: Tensor::ones(shape.to_vec(), dtype, dev)?.requires_grad_(true)?,
            bias: Tensor::zeros(shape.to_vec(), dtype, dev)?.requires_grad_(true)?,
            eps: 1e-5,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        functional::layer_norm(
            x,
            self.weight.ndim(),
            Some(&self.weight),
            Some(&self.bias),
            self.eps,
        )
    }
    fn parameters(&self) -> Vec<Tensor> {
        vec![self.weight.clone(), self.bias.clone()]
    }
}

/// PyTorch's `nn.Dropout`, drawing its masks from its own generator.
#[derive(Debug)]
pub struct Dropout {
    /// The probability of zeroing an element.
    pub p: f64,
    /// Dropping (training) or passing through (evaluation).
    pub training: bool,
    gen: Mutex<Generator>,
}

impl Dropout {
    /// A dropout of probability `p`, its masks from `gen`.
    ///
    /// ```
    /// use strata_core::nn::{Dropout, Module};
    /// use strata_core::{random::Generator, Device, DType, Tensor};
    /// let mut d = Dropout::new(0.5, Generator::new(1));
    /// let x = Tensor::ones([8], DType::F32, &Device::cpu())?;
    /// assert!(d.forward(&x)?.to_vec::<f32>()?.iter().all(|&v| v == 0.0 || v == 2.0));
    /// d.train(false);
    /// assert_eq!(d.forward(&x)?.to_vec::<f32>()?, vec![1.0; 8]);
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn new(p: f64, gen: Generator) -> Dropout {
        Dropout {
            p,
            training: true,
            gen: Mutex::new(gen),
        }
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        functional::dropout(x, self.p, self.training, &mut self.gen.lock_unpoisoned())
    }
    fn train(&mut self, training: bool) {
        self.training = training;
    }
}

/// `max(x, 0)`.
#[derive(Debug, Clone, Copy)]
pub struct Relu;

impl Module for Relu {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.relu()
    }
}

/// Every axis after the first folded into one (`[N, ...] → [N, rest]`), between a
/// convolution and a linear layer.
///
/// ```
/// use strata_core::nn::{Flatten, Module};
/// use strata_core::{Device, DType, Tensor};
/// let x = Tensor::ones([2, 3, 4], DType::F32, &Device::cpu())?;
/// assert_eq!(Flatten.forward(&x)?.shape(), &[2, 12]);
/// # Ok::<(), strata_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Flatten;

impl Module for Flatten {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let n = x.shape().first().copied().unwrap_or(1);
        x.reshape([n, x.numel() / n.max(1)])
    }
}

/// Max pooling (PyTorch's `nn.MaxPool2d`): the largest value of each `kernel` window, the
/// windows `stride` apart, with `padding` (implicit `-inf`); the values of
/// [`functional::max_pool2d`](super::functional::max_pool2d).
///
/// ```
/// use strata_core::nn::{MaxPool2d, Module};
/// use strata_core::{Device, DType, Tensor};
/// let x = Tensor::arange(0.0, 16.0, 1.0, DType::F32, &Device::cpu())?.reshape([1, 1, 4, 4])?;
/// assert_eq!(MaxPool2d::new([2, 2]).forward(&x)?.to_vec::<f32>()?, vec![5.0, 7.0, 13.0, 15.0]);
/// let overlapping = MaxPool2d { stride: [1, 1], ..MaxPool2d::new([3, 3]) };
/// assert_eq!(overlapping.forward(&x)?.shape(), &[1, 1, 2, 2]);
/// # Ok::<(), strata_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxPool2d {
    /// The window's (height, width).
    pub kernel: Pair,
    /// The distance between windows.
    pub stride: Pair,
    /// Added on each side, at most half the kernel.
    pub padding: Pair,
}

impl MaxPool2d {
    /// Windows of `kernel`, as far apart as they are large, no padding (PyTorch's defaults).
    ///
    /// ```
    /// let p = strata_core::nn::MaxPool2d::new([2, 3]);
    /// assert_eq!((p.stride, p.padding), ([2, 3], [0, 0]));
    /// ```
    pub fn new(kernel: Pair) -> MaxPool2d {
        MaxPool2d {
            kernel,
            stride: kernel,
            padding: [0, 0],
        }
    }
}

impl Module for MaxPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(functional::max_pool2d(x, self.kernel, self.stride, self.padding)?.0)
    }
}

/// Average pooling (PyTorch's `nn.AvgPool2d`, padding counted in the mean): the mean of each
/// `kernel` window, the windows `stride` apart, with zero `padding`;
/// [`functional::avg_pool2d`](super::functional::avg_pool2d).
///
/// ```
/// use strata_core::nn::{AvgPool2d, Module};
/// use strata_core::{Device, DType, Tensor};
/// let x = Tensor::arange(0.0, 16.0, 1.0, DType::F32, &Device::cpu())?.reshape([1, 1, 4, 4])?;
/// assert_eq!(AvgPool2d::new([2, 2]).forward(&x)?.to_vec::<f32>()?, vec![2.5, 4.5, 10.5, 12.5]);
/// # Ok::<(), strata_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AvgPool2d {
    /// The window's (height, width).
    pub kernel: Pair,
    /// The distance between windows.
    pub stride: Pair,
    /// Zeros added on each side, at most half the kernel.
    pub padding: Pair,
}

impl AvgPool2d {
    /// Windows of `kernel`, as far apart as they are large, no padding (PyTorch's defaults).
    ///
    /// ```
    /// let p = strata_core::nn::AvgPool2d::new([2, 2]);
    /// assert_eq!((p.stride, p.padding), ([2, 2], [0, 0]));
    /// ```
    pub fn new(kernel: Pair) -> AvgPool2d {
        AvgPool2d {
            kernel,
            stride: kernel,
            padding: [0, 0],
        }
    }
}

impl Module for AvgPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        functional::avg_pool2d(x, self.kernel, self.stride, self.padding)
    }
}

/// Layers applied in order.
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    /// No layers yet.
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// This sequence with `layer` after the others.
    pub fn layer(mut self, layer: impl Module + 'static) -> Sequential {
        self.layers.push(Box::new(layer));
        self
    }

    /// How many layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// True without layers.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut y = x.clone();
        for layer in &self.layers {
            y = layer.forward(&y)?;
        }
        Ok(y)
    }
    fn parameters(&self) -> Vec<Tensor> {
        self.layers.iter().flat_map(|l| l.parameters()).collect()
    }
    fn train(&mut self, training: bool) {
        for layer in &mut self.layers {
            layer.train(training);
        }
    }
}
