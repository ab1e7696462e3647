//! Stochastic gradient descent with PyTorch's `torch.optim.SGD` semantics: weight decay,
//! momentum (with dampening) and Nesterov momentum.

use super::optimizer::{add, check_params, check_setting, mul, neg, sub, Optimizer, Step};
use crate::error::Result;
use crate::random::Generator;
use crate::tensor::Tensor;

/// The settings of [`Sgd`], PyTorch's names and defaults.
///
/// ```
/// use strata_core::nn::{Sgd, SgdConfig};
/// use strata_core::{Device, DType, Tensor};
/// let w = Tensor::zeros([4], DType::F32, &Device::cpu())?.requires_grad_(true)?;
/// let config = SgdConfig { lr: 0.1, momentum: 0.9, nesterov: true, ..SgdConfig::default() };
/// let opt = Sgd::with([w], config)?;
/// assert_eq!(opt.config().momentum, 0.9);
/// # Ok::<(), strata_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdConfig {
    /// The learning rate (PyTorch's default, 0.001).
    pub lr: f64,
    /// The momentum factor; 0 (the default) keeps no state.
    pub momentum: f64,
    /// Dampening of the gradient's share of the momentum (0).
    pub dampening: f64,
    /// L2 weight decay added to the gradient (0).
    pub weight_decay: f64,
    /// Nesterov momentum (needs momentum > 0 and no dampening).
    pub nesterov: bool,
    /// Maximizes the objective instead of minimizing it.
    pub maximize: bool,
    /// bf16 and f16 parameters are rounded stochastically to their dtype from the step's f32
    /// result with draws from this generator (so updates smaller than half their spacing
    /// survive on average); `None` rounds to nearest. Other dtypes are not affected.
    pub stochastic_rounding: Option<Generator>,
}

impl Default for SgdConfig {
    fn default() -> SgdConfig {
        SgdConfig {
            lr: 1e-3,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            maximize: false,
            stochastic_rounding: None,
        }
    }
}

/// Stochastic gradient descent (`torch.optim.SGD`): with `g` the gradient (negated to
/// maximize) plus `weight_decay · p`, and with momentum `b ← momentum · b + (1 − dampening) ·
/// g` (`b ← g` at the first step), the step is `p ← p − lr · d` where `d` is `g + momentum ·
/// b` (Nesterov), `b`, or `g` without momentum. One kernel per parameter writes `p` and `b`
/// together, computing in f32 (f64 for f64 parameters) and rounding once.
///
/// ```
/// use strata_core::nn::{Optimizer, Sgd, SgdConfig};
/// use strata_core::{Device, DType, Tensor};
/// let w = Tensor::from_slice(&[1.0f32], [1], &Device::cpu())?.requires_grad_(true)?;
/// let mut opt = Sgd::with([w.clone()], SgdConfig { lr: 0.1, momentum: 0.5, ..SgdConfig::default() })?;
/// for _ in 0..2 {
///     opt.zero_grad();
///     w.mul(3.0)?.backward()?; // gradient 3
///     opt.step()?;
/// }
/// // b = 3, then 0.5·3 + 3 = 4.5: w = 1 − 0.3 − 0.45
/// assert!((w.item::<f32>()? - 0.25).abs() < 1e-6);
/// assert_eq!(opt.momentum_buffer(0).unwrap().item::<f32>()?, 4.5);
/// # Ok::<(), strata_core::Error>(())
/// ```
#[derive(Debug)]
pub struct Sgd {
    params: Vec<Tensor>,
    config: SgdConfig,
    momentum_buffers: Vec<Option<Tensor>>,
}

impl Sgd {
    /// Plain SGD over `params` with learning rate `lr`: `p ← p − lr · g`.
    ///
    /// ```
    /// use strata_core::nn::Sgd;
    /// use strata_core::{Device, DType, Tensor};
    /// let w = Tensor::zeros([2], DType::I32, &Device::cpu())?;
    /// assert!(Sgd::new([w], 0.1).is_err()); // only float tensors
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn new(params: impl IntoIterator<Item = Tensor>, lr: f64) -> Result<Sgd> {
        Sgd::with(
            params,
            SgdConfig {
                lr,
                ..SgdConfig::default()
            },
        )
    }

    /// SGD over `params` with `config`; an `Err` names a setting out of range (negative
    /// rates or decay, Nesterov without momentum or with dampening) or a parameter that is
    /// not a float leaf.
    ///
    /// ```
    /// use strata_core::nn::{Sgd, SgdConfig};
    /// use strata_core::{Device, DType, Tensor};
    /// let w = Tensor::zeros([2], DType::F32, &Device::cpu())?;
    /// let bad = SgdConfig { nesterov: true, ..SgdConfig::default() };
    /// assert!(Sgd::with([w], bad).is_err()); // Nesterov needs momentum
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn with(params: impl IntoIterator<Item = Tensor>, config: SgdConfig) -> Result<Sgd> {
        let what = "SGD";
        check_setting(what, "learning rate", config.lr, config.lr >= 0.0)?;
        check_setting(what, "momentum", config.momentum, config.momentum >= 0.0)?;
        check_setting(
            what,
            "dampening",
            config.dampening,
            config.dampening.is_finite(),
        )?;
        let wd = config.weight_decay;
        check_setting(what, "weight_decay", wd, wd >= 0.0)?;
        let nesterov_ok = !config.nesterov || (config.momentum > 0.0 && config.dampening == 0.0);
        check_setting(
            what,
            "Nesterov momentum (it needs momentum > 0 and dampening 0): momentum",
            config.momentum,
            nesterov_ok,
        )?;
        let params = check_params(params.into_iter().collect(), what)?;
        Ok(Sgd {
            momentum_buffers: vec![None; params.len()],
            params,
            config,
        })
    }

    /// The settings (the generator's state included).
    ///
    /// ```
    /// use strata_core::nn::Sgd;
    /// use strata_core::{Device, DType, Tensor};
    /// let w = Tensor::zeros([2], DType::F32, &Device::cpu())?;
    /// assert_eq!(Sgd::new([w], 0.5)?.config().lr, 0.5);
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn config(&self) -> &SgdConfig {
        &self.config
    }

    /// Parameter `k`'s momentum buffer: `None` before its first step or without momentum.
    ///
    /// ```
    /// use strata_core::nn::Sgd;
    /// use strata_core::{Device, DType, Tensor};
    /// let w = Tensor::zeros([2], DType::F32, &Device::cpu())?;
    /// assert!(Sgd::new([w], 0.5)?.momentum_buffer(0).is_none());
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn momentum_buffer(&self, k: usize) -> Option<&Tensor> {
        self.momentum_buffers.get(k)?.as_ref()
    }

    fn step_one(&mut self, k: usize, grad: &Tensor) -> Result<()> {
        let c = self.config;
        let p = &self.params[k];
        let mut s = Step::new(p.dtype());
        let x = s.read(p);
        let mut g = s.read(grad);
        if c.maximize {
            g = neg(g);
        }
        if c.weight_decay != 0.0 {
            let wd = s.setting(c.weight_decay);
            g = add(g, mul(wd, x.clone()));
        }
        let mut buffer = None;
        let mut d = g.clone();
        if c.momentum != 0.0 {
            let m = s.setting(c.momentum);
            let new_buffer = match &self.momentum_buffers[k] {
                Some(b) => {
                    let keep = s.setting(1.0 - c.dampening);
                    let old = s.read(b);
                    (b.clone(), add(mul(m.clone(), old), mul(keep, g.clone())))
                }
                None => (p.empty_like()?, g.clone()),
            };
            d = if c.nesterov {
                add(g, mul(m, new_buffer.1.clone()))
            } else {
                new_buffer.1.clone()
            };
            buffer = Some(new_buffer);
        }
        let lr = s.setting(c.lr);
        let value = s.param_value(p, sub(x, mul(lr, d)), c.stochastic_rounding.as_ref());
        let rounding = self.config.stochastic_rounding.as_mut();
        match &buffer {
            Some((b, b_value)) => s.write(&[(p, value), (b, b_value.clone())], rounding)?,
            None => s.write(&[(p, value)], rounding)?,
        }
        if let Some((b, _)) = buffer {
            self.momentum_buffers[k] = Some(b);
        }
        Ok(())
    }
}

impl Optimizer for Sgd {
    fn step(&mut self) -> Result<()> {
        for k in 0..self.params.len() {
            if let Some(grad) = self.params[k].grad() {
                self.step_one(k, &grad)?;
            }
        }
        Ok(())
    }

    fn params(&self) -> &[Tensor] {
        &self.params
    }

    fn lr(&self) -> f64 {
        self.config.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.config.lr = lr;
    }
}
