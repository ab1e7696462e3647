//! Adam and AdamW with PyTorch's `torch.optim.Adam` / `AdamW` semantics (bias-corrected
//! moments; L2 weight decay added to the gradient for Adam, decoupled decay of the parameter
//! for AdamW).

use super::optimizer::{
    add, check_params, check_setting, div, mul, neg, sqrt, sub, Optimizer, Step,
};
use crate::error::Result;
use crate::random::Generator;
use crate::tensor::Tensor;

/// The settings of [`Adam`] and [`AdamW`], PyTorch's names; `default()` is Adam's defaults,
/// [`adamw`](AdamConfig::adamw) AdamW's (weight decay 0.01).
///
/// ```
/// use strata_core::nn::AdamConfig;
/// assert_eq!(AdamConfig::default().weight_decay, 0.0);
/// assert_eq!(AdamConfig::adamw().weight_decay, 0.01);
/// assert_eq!(AdamConfig::default().betas, (0.9, 0.999));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamConfig {
    /// The learning rate (0.001).
    pub lr: f64,
    /// The decay rates of the first and second moment estimates (0.9, 0.999).
    pub betas: (f64, f64),
    /// Added to the denominator's square root (1e-8).
    pub eps: f64,
    /// Weight decay: added to the gradient as L2 (Adam) or applied to the parameter before
    /// the update, `p ← p · (1 − lr · weight_decay)` (AdamW).
    pub weight_decay: f64,
    /// Maximizes the objective instead of minimizing it.
    pub maximize: bool,
    /// bf16 and f16 parameters are rounded stochastically to their dtype from the step's f32
    /// result with draws from this generator; `None` rounds to nearest (see
    /// [`SgdConfig::stochastic_rounding`](super::SgdConfig::stochastic_rounding)).
    pub stochastic_rounding: Option<Generator>,
}

impl Default for AdamConfig {
    fn default() -> AdamConfig {
        AdamConfig {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            maximize: false,
            stochastic_rounding: None,
        }
    }
}

impl AdamConfig {
    /// AdamW's defaults: Adam's with weight decay 0.01.
    ///
    /// ```
    /// assert_eq!(strata_core::nn::AdamConfig::adamw().lr, 1e-3);
    /// ```
    pub fn adamw() -> AdamConfig {
        AdamConfig {
            weight_decay: 0.01,
            ..AdamConfig::default()
        }
    }
}

/// What Adam and AdamW share: parameters, settings and the moments, created at a
/// parameter's first step.
#[derive(Debug)]
struct Moments {
    params: Vec<Tensor>,
    config: AdamConfig,
    decoupled: bool,
    exp_avg: Vec<Option<Tensor>>,
    exp_avg_sq: Vec<Option<Tensor>>,
    steps: Vec<u64>,
}

impl Moments {
    fn new(
        params: impl IntoIterator<Item = Tensor>,
        config: AdamConfig,
        decoupled: bool,
    ) -> Result<Moments> {
        let what = if decoupled { "AdamW" } else { "Adam" };
        let (b1, b2) = config.betas;
        check_setting(what, "learning rate", config.lr, config.lr >= 0.0)?;
        check_setting(what, "beta1", b1, (0.0..1.0).contains(&b1))?;
        check_setting(what, "beta2", b2, (0.0..1.0).contains(&b2))?;
        check_setting(what, "eps", config.eps, config.eps >= 0.0)?;
        let wd = config.weight_decay;
        check_setting(what, "weight_decay", wd, wd >= 0.0)?;
        let params = check_params(params.into_iter().collect(), what)?;
        let n = params.len();
        Ok(Moments {
            params,
            config,
            decoupled,
            exp_avg: vec![None; n],
            exp_avg_sq: vec![None; n],
            steps: vec![0; n],
        })
    }

    fn step(&mut self) -> Result<()> {
        for k in 0..self.params.len() {
            if let Some(grad) = self.params[k].grad() {
                self.step_one(k, &grad)?;
            }
        }
        Ok(())
    }

    /// One kernel: `m ← m + (1 − β1)(g − m)`, `v ← β2 v + (1 − β2) g²`, and `p ← p − (lr /
    /// (1 − β1^t)) · m / (√v / √(1 − β2^t) + eps)` (PyTorch's order of operations), with the
    /// decay first. At the first step the moments are read as zeros without being read.
    fn step_one(&mut self, k: usize, grad: &Tensor) -> Result<()> {
        let c = self.config;
        let (b1, b2) = c.betas;
        self.steps[k] += 1;
        let t = self.steps[k] as i32;
        let p = &self.params[k];
        let mut s = Step::new(p.dtype());
        let mut x = s.read(p);
        let mut g = s.read(grad);
        if c.maximize {
            g = neg(g);
        }
        if c.weight_decay != 0.0 {
            if self.decoupled {
                let keep = s.setting(1.0 - c.lr * c.weight_decay);
                x = mul(x, keep);
            } else {
                let wd = s.setting(c.weight_decay);
                g = add(g, mul(wd, x.clone()));
            }
        }
        let w1 = s.setting(1.0 - b1);
        let w2 = s.setting(1.0 - b2);
        let (m_old, v_old) = (&self.exp_avg[k], &self.exp_avg_sq[k]);
        let (m, m_value, v, v_value) = match (m_old, v_old) {
            (Some(m), Some(v)) => {
                let (mr, vr) = (s.read(m), s.read(v));
                let b2e = s.setting(b2);
                let m_value = add(mr.clone(), mul(w1, sub(g.clone(), mr)));
                let v_value = add(mul(vr, b2e), mul(w2, mul(g.clone(), g)));
                (m.clone(), m_value, v.clone(), v_value)
            }
            _ => {
                let m_value = mul(w1, g.clone());
                let v_value = mul(w2, mul(g.clone(), g));
                (p.empty_like()?, m_value, p.empty_like()?, v_value)
            }
        };
        let step_size = s.setting(c.lr / (1.0 - b1.powi(t)));
        let correction = s.setting((1.0 - b2.powi(t)).sqrt());
        let eps = s.setting(c.eps);
        let denom = add(div(sqrt(v_value.clone()), correction), eps);
        let update = mul(step_size, div(m_value.clone(), denom));
        let value = s.param_value(p, sub(x, update), c.stochastic_rounding.as_ref());
        let rounding = self.config.stochastic_rounding.as_mut();
        s.write(&[(p, value), (&m, m_value), (&v, v_value)], rounding)?;
        self.exp_avg[k] = Some(m);
        self.exp_avg_sq[k] = Some(v);
        Ok(())
    }
}

macro_rules! adam_type {
    ($name:ident, $decoupled:expr, $config:expr, $doc:literal, $example:literal) => {
        #[doc = $doc]
        ///
        /// ```
        #[doc = $example]
        /// ```
        #[derive(Debug)]
        pub struct $name(Moments);

        impl $name {
            /// The optimizer over `params` with learning rate `lr` and the other settings
            /// at their defaults.
            ///
            /// ```
            /// use strata_core::{nn::*, Device, DType, Tensor};
            /// let w = Tensor::zeros([2], DType::F32, &Device::cpu())?;
            #[doc = concat!("assert_eq!(", stringify!($name), "::new([w], 0.01)?.lr(), 0.01);")]
            /// # Ok::<(), strata_core::Error>(())
            /// ```
            pub fn new(params: impl IntoIterator<Item = Tensor>, lr: f64) -> Result<$name> {
                $name::with(params, AdamConfig { lr, ..$config })
            }

            /// The optimizer over `params` with `config`; an `Err` names a setting out of
            /// range (betas outside [0, 1), negative rates) or a parameter that is not a float
            /// leaf.
            ///
            /// ```
            /// use strata_core::{nn::*, Device, DType, Tensor};
            /// let w = Tensor::zeros([2], DType::F32, &Device::cpu())?;
            /// let bad = AdamConfig { betas: (0.9, 1.0), ..AdamConfig::default() };
            #[doc = concat!("assert!(", stringify!($name), "::with([w], bad).is_err());")]
            /// # Ok::<(), strata_core::Error>(())
            /// ```
            pub fn with(params: impl IntoIterator<Item = Tensor>, config: AdamConfig) -> Result<$name> {
                Ok($name(Moments::new(params, config, $decoupled)?))
            }

            /// The settings (the generator's state included).
            ///
            /// ```
            /// use strata_core::{nn::*, Device, DType, Tensor};
            /// let w = Tensor::zeros([2], DType::F32, &Device::cpu())?;
            #[doc = concat!("assert_eq!(", stringify!($name), "::new([w], 0.01)?.config().eps, 1e-8);")]
            /// # Ok::<(), strata_core::Error>(())
            /// ```
            pub fn config(&self) -> &AdamConfig {
                &self.0.config
            }

            /// Parameter `k`'s first moment estimate (`exp_avg`), `None` before its first
            /// step.
            ///
            /// ```
            /// use strata_core::{nn::*, Device, DType, Tensor};
            /// let w = Tensor::zeros([2], DType::F32, &Device::cpu())?;
            #[doc = concat!("assert!(", stringify!($name), "::new([w], 0.01)?.exp_avg(0).is_none());")]
            /// # Ok::<(), strata_core::Error>(())
            /// ```
            pub fn exp_avg(&self, k: usize) -> Option<&Tensor> {
                self.0.exp_avg.get(k)?.as_ref()
            }

            /// Parameter `k`'s second moment estimate (`exp_avg_sq`), `None` before its
            /// first step.
            ///
            /// ```
            /// use strata_core::{nn::*, Device, DType, Tensor};
            /// let w = Tensor::zeros([2], DType::F32, &Device::cpu())?;
            #[doc = concat!("assert!(", stringify!($name), "::new([w], 0.01)?.exp_avg_sq(0).is_none());")]
            /// # Ok::<(), strata_core::Error>(())
            /// ```
            pub fn exp_avg_sq(&self, k: usize) -> Option<&Tensor> {
                self.0.exp_avg_sq.get(k)?.as_ref()
            }

            /// How many steps parameter `k` has taken (PyTorch's `state['step']`).
            ///
            /// ```
            /// use strata_core::{nn::*, Device, DType, Tensor};
            /// let w = Tensor::zeros([2], DType::F32, &Device::cpu())?;
            #[doc = concat!("assert_eq!(", stringify!($name), "::new([w], 0.01)?.steps(0), 0);")]
            /// # Ok::<(), strata_core::Error>(())
            /// ```
            pub fn steps(&self, k: usize) -> u64 {
                self.0.steps.get(k).copied().unwrap_or(0)
            }
        }

        impl Optimizer for $name {
            fn step(&mut self) -> Result<()> {
                self.0.step()
            }

            fn params(&self) -> &[Tensor] {
                &self.0.params
            }

            fn lr(&self) -> f64 {
                self.0.config.lr
            }

            fn set_lr(&mut self, lr: f64) {
                self.0.config.lr = lr;
            }
        }
    };
}

adam_type!(
    Adam,
    false,
    AdamConfig::default(),
    "Adam (`torch.optim.Adam`): bias-corrected first and second moment estimates of the \
     gradient, weight decay as L2 added to the gradient. One kernel per parameter writes \
     the parameter and both moments, computing in f32 (f64 for f64 parameters).",
    "use strata_core::{nn::*, Device, DType, Tensor};
let w = Tensor::from_slice(&[1.0f32, -1.0], [2], &Device::cpu())?.requires_grad_(true)?;
let mut opt = Adam::new([w.clone()], 0.1)?;
w.mul(&w)?.sum(strata_core::ops::Axes::All, false)?.backward()?;
opt.step()?;
// The first step moves each weight by lr against its gradient's sign (m̂/√v̂ = ±1).
let v = w.to_vec::<f32>()?;
assert!((v[0] - 0.9).abs() < 1e-6 && (v[1] + 0.9).abs() < 1e-6);
assert_eq!(opt.steps(0), 1);
# Ok::<(), strata_core::Error>(())"
);

adam_type!(
    AdamW,
    true,
    AdamConfig::adamw(),
    "AdamW (`torch.optim.AdamW`): Adam with decoupled weight decay, `p ← p · (1 − lr · \
     weight_decay)` before the moment update (weight decay 0.01 by default). One kernel per \
     parameter writes the parameter and both moments.",
    "use strata_core::{nn::*, Device, DType, Tensor};
let w = Tensor::from_slice(&[2.0f32], [1], &Device::cpu())?.requires_grad_(true)?;
let mut opt = AdamW::with([w.clone()], AdamConfig { lr: 0.1, weight_decay: 0.5, ..AdamConfig::adamw() })?;
w.mul(0.0)?.sum(strata_core::ops::Axes::All, false)?.backward()?; // gradient 0: decay only
opt.step()?;
assert!((w.item::<f32>()? - 2.0 * (1.0 - 0.1 * 0.5)).abs() < 1e-6);
# Ok::<(), strata_core::Error>(())"
);
