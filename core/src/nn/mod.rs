//! The layer above the ops for training (re-exported as `strata::nn`): optimizers that update
//! parameters from their gradients, losses and the functional ops of training
//! ([`functional`]), a small layer API over them ([`Module`], [`Sequential`], …), data to
//! train on ([`data`]: the UCI digits, a seeded split and batch iterator), and
//! data-parallel training over several devices. Everything here is written with core's ops and
//! launches; the backends know only the convolution kernel `conv2d` launches where they run one.
//!
//! ```
//! use strata_core::nn::{Optimizer, Sgd};
//! use strata_core::{Device, DType, Tensor};
//! let dev = Device::cpu();
//! let w = Tensor::from_slice(&[1.0f32, -2.0], [2], &dev)?.requires_grad_(true)?;
//! let mut opt = Sgd::new([w.clone()], 0.5)?;
//! w.mul(&w)?.sum(strata_core::ops::Axes::All, false)?.backward()?; // d/dw Σw² = 2w
//! opt.step()?;
//! opt.zero_grad();
//! assert_eq!(w.to_vec::<f32>()?, vec![0.0, 0.0]); // w - 0.5 · 2w
//! # Ok::<(), strata_core::Error>(())
//! ```

mod adam;
mod convolution;
pub mod data;
mod data_parallel;
pub mod functional;
mod layer_norm_kernel;
mod layers;
mod moments_kernel;
mod optimizer;
mod saving;
mod sgd;
mod windows;

pub use adam::{Adam, AdamConfig, AdamW};
pub use data_parallel::DataParallel;
pub use layers::{
    AvgPool2d, BatchNorm2d, Conv2d, Dropout, Flatten, LayerNorm, Linear, MaxPool2d, Module, Relu,
    Sequential,
};
pub use optimizer::Optimizer;
pub use saving::{load_parameters, load_tensors, save_parameters, save_tensors};
pub use sgd::{Sgd, SgdConfig};
