//! What every optimizer shares: the trait, the checks on its parameters and settings, and
//! [`Step`], the one kernel a step writes a parameter (and its state) with.

use crate::assign::write_values;
use crate::dtype::{DType, Scalar};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, Expr, UnaryOp};
use crate::random::Generator;
use crate::stochastic_round::stochastic_round_of;
use crate::tensor::Tensor;

/// An optimizer: it holds its parameters (sharing their storage with the caller's tensors)
/// and, at each [`step`](Optimizer::step), updates every one that has a gradient in place,
/// with one kernel per parameter that writes the parameter and its state together.
///
/// ```
/// use strata_core::nn::{Optimizer, Sgd};
/// use strata_core::{Device, DType, Tensor};
/// let w = Tensor::ones([3], DType::F32, &Device::cpu())?.requires_grad_(true)?;
/// let mut opt = Sgd::new([w.clone()], 0.1)?;
/// w.mul(2.0)?.sum(strata_core::ops::Axes::All, false)?.backward()?;
/// opt.step()?;
/// opt.set_lr(0.01);
/// assert_eq!(opt.lr(), 0.01);
/// opt.zero_grad();
/// assert!(w.grad().is_none());
/// assert_eq!(w.to_vec::<f32>()?, vec![0.8; 3]); // 1 - 0.1 · 2
/// # Ok::<(), strata_core::Error>(())
/// ```
pub trait Optimizer {
    /// Updates every parameter that has a gradient (one without is left as it is, as
    /// PyTorch does), under [`no_grad`](crate::autograd::no_grad). Asynchronous like any
    /// launch.
    fn step(&mut self) -> Result<()>;

    /// The parameters, in the order they were given.
    fn params(&self) -> &[Tensor];

    /// The learning rate.
    fn lr(&self) -> f64;

    /// Sets the learning rate (for a schedule); the next step uses it.
    fn set_lr(&mut self, lr: f64);

    /// Clears every parameter's gradient (PyTorch's `zero_grad(set_to_none=True)`).
    fn zero_grad(&self) {
        for p in self.params() {
            p.zero_grad();
        }
    }
}

/// The parameters an optimizer may hold: leaves of float dtypes, no storage given twice.
pub(super) fn check_params(params: Vec<Tensor>, what: &str) -> Result<Vec<Tensor>> {
    for (k, p) in params.iter().enumerate() {
        if !p.dtype().is_float() {
            return Err(Error::DType(format!(
                "{what}: parameter {k} is {} (shape {:?}); only float tensors can be optimized",
                p.dtype(),
                p.shape()
            )));
        }
        if let Some(f) = p.grad_fn() {
            return Err(Error::Invalid(format!(
                "{what}: parameter {k} (shape {:?}) was computed by {f}; an optimizer updates \
                 leaves (detach() it, or pass the tensor it was computed from)",
                p.shape()
            )));
        }
        if let Some(j) = params[..k].iter().position(|q| q.shares_storage(p)) {
            return Err(Error::Invalid(format!(
                "{what}: parameters {j} and {k} share one storage; each would be updated twice"
            )));
        }
    }
    Ok(params)
}

/// An `Err` naming the setting unless `ok`.
pub(super) fn check_setting(what: &str, name: &str, value: f64, ok: bool) -> Result<()> {
    if ok {
        return Ok(());
    }
    Err(Error::Invalid(format!("{what}: invalid {name} {value}")))
}

/// The kernel of one parameter's step, built as an expression: the parameter's update and
/// its state's, computed in f32 (f64 for f64 parameters) from the tensors read and the
/// settings passed as launch scalars (so every step reuses one compiled kernel), each
/// rounded once to the dtype it is stored in.
pub(super) struct Step {
    /// The dtype the step computes in.
    pub(super) compute: DType,
    inputs: Vec<Tensor>,
    scalars: Vec<Scalar>,
    rounded: Option<(Expr, usize)>,
}

impl Step {
    /// A step for a parameter of `dtype`. Launch scalars 0 and 1 are kept for the
    /// generator's key and counter (stochastic rounding's draws read them there).
    pub(super) fn new(dtype: DType) -> Step {
        Step {
            compute: if dtype == DType::F64 {
                DType::F64
            } else {
                DType::F32
            },
            inputs: Vec::new(),
            scalars: vec![Scalar::U64(0), Scalar::U64(0)],
            rounded: None,
        }
    }

    /// `t`'s element, in the compute dtype.
    pub(super) fn read(&mut self, t: &Tensor) -> Expr {
        self.inputs.push(t.clone());
        Expr::input(self.inputs.len() - 1, t.dtype()).cast(self.compute, false)
    }

    /// The setting `v` as a launch scalar of the compute dtype.
    pub(super) fn setting(&mut self, v: f64) -> Expr {
        self.scalars.push(Scalar::F64(v).cast(self.compute, false));
        Expr::scalar(self.scalars.len() - 1, self.compute)
    }

    /// The parameter's new value `value`, rounded to `param`'s dtype: stochastically when
    /// `rounding` is given and that dtype is narrower than the compute dtype (bf16, f16),
    /// to nearest otherwise.
    pub(super) fn param_value(
        &mut self,
        param: &Tensor,
        value: Expr,
        rounding: Option<&Generator>,
    ) -> Expr {
        if rounding.is_some() {
            if let Some((rounded, per_counter)) = stochastic_round_of(value.clone(), param.dtype())
            {
                self.rounded = Some((rounded.clone(), per_counter));
                return rounded;
            }
        }
        value.cast(param.dtype(), false)
    }

    /// Writes `writes[k].1` into `writes[k].0` for every `k` (the parameter first), all
    /// from the values before the step, in one kernel where the backend allows; draws the
    /// stochastic rounding's counters from `rounding`.
    pub(super) fn write(
        mut self,
        writes: &[(&Tensor, Expr)],
        rounding: Option<&mut Generator>,
    ) -> Result<()> {
        if let (Some((_, per_counter)), Some(g)) = (&self.rounded, rounding) {
            let numel = writes[0].0.numel();
            let key = g.take(numel.div_ceil(*per_counter));
            self.scalars[..2].copy_from_slice(&key);
        }
        let targets: Vec<&Tensor> = writes.iter().map(|(t, _)| *t).collect();
        let values = writes.iter().map(|(_, v)| v.clone()).collect();
        let inputs: Vec<&Tensor> = self.inputs.iter().collect();
        crate::autograd::no_grad(|| write_values(&targets, values, &inputs, self.scalars))
    }
}

/// `a op b`.
pub(super) fn bin(op: BinaryOp, a: Expr, b: Expr) -> Expr {
    Expr::binary(op, a, b)
}

/// `a + b`.
pub(super) fn add(a: Expr, b: Expr) -> Expr {
    bin(BinaryOp::Add, a, b)
}

/// `a - b`.
pub(super) fn sub(a: Expr, b: Expr) -> Expr {
    bin(BinaryOp::Sub, a, b)
}

/// `a * b`.
pub(super) fn mul(a: Expr, b: Expr) -> Expr {
    bin(BinaryOp::Mul, a, b)
}

/// `a / b`.
pub(super) fn div(a: Expr, b: Expr) -> Expr {
    bin(BinaryOp::Div, a, b)
}

/// `√a`.
pub(super) fn sqrt(a: Expr) -> Expr {
    Expr::unary(UnaryOp::Sqrt, a)
}

/// `-a`.
pub(super) fn neg(a: Expr) -> Expr {
    Expr::unary(UnaryOp::Neg, a)
}
