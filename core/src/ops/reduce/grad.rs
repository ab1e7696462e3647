//! The backward rules of reductions. A reduction's gradient is its output's gradient spread
//! back over the reduced axes (a broadcast view: no copy), then an elementwise rule that lazy
//! fusion records like any other op: `sum` passes it on, `mean` divides it, `max`/`min` give
//! it to the maxima (ties share it evenly, as PyTorch's `amax`), `prod` to each element as
//! the product of the others (zeros included, as PyTorch), `var`/`std`, `logsumexp` and
//! `softmax`/`log_softmax` their closed forms.

use super::Axes;
use crate::autograd::graph::Saved;
use crate::dtype::DType;
use crate::error::Result;
use crate::ir::ReduceOp;
use crate::tensor::Tensor;

/// The reduction a rule differentiates: the input's shape and dtype, the reduced axes, and
/// the saved input and output where the rule reads them.
struct Reduced {
    shape: Vec<usize>,
    dtype: DType,
    reduced: Vec<usize>,
    x: Option<Saved>,
    y: Option<Saved>,
}

impl Reduced {
    /// The saved input.
    fn x(&self) -> Result<&Tensor> {
        saved(&self.x)
    }

    /// The saved output.
    fn y(&self) -> Result<&Tensor> {
        saved(&self.y)
    }

    /// `t`, of the output's shape (`keepdim` or not), as a view of the input's shape: its
    /// values repeated over the reduced axes, in the input's dtype.
    fn spread(&self, t: &Tensor) -> Result<Tensor> {
        to(t.clone(), self.dtype)?
            .reshape(self.kept_shape())?
            .broadcast_to(self.shape.clone())
    }

    /// The input's shape with the reduced axes of size 1.
    fn kept_shape(&self) -> Vec<usize> {
        (0..self.shape.len())
            .map(|a| {
                if self.reduced.contains(&a) {
                    1
                } else {
                    self.shape[a]
                }
            })
            .collect()
    }

    /// The reduced axes, as a reduction of the gradient takes them.
    fn axes(&self) -> Axes {
        Axes::List(self.reduced.iter().map(|&a| a as isize).collect())
    }

    /// Elements reduced into each output.
    fn count(&self) -> usize {
        self.reduced.iter().map(|&a| self.shape[a]).product()
    }
}

fn saved(s: &Option<Saved>) -> Result<&Tensor> {
    s.as_ref().map_or_else(
        || {
            Err(crate::error::Error::Backend(
                "internal error: a reduction's rule read what it did not save".into(),
            ))
        },
        Saved::get,
    )
}

/// `out`, a reduction of `x` over `reduced`, with the node `name` whose rule maps the
/// output's gradient to `x`'s; it saves `x` and `out` where `saves` says.
fn record_rule(
    name: &'static str,
    x: &Tensor,
    out: Tensor,
    reduced: &[usize],
    saves: (bool, bool),
    rule: impl Fn(&Reduced, &Tensor) -> Result<Tensor> + Send + Sync + 'static,
) -> Tensor {
    if !crate::autograd::needed([x]) {
        return out;
    }
    let r = Reduced {
        shape: x.shape().to_vec(),
        dtype: x.dtype(),
        reduced: reduced.to_vec(),
        x: saves.0.then(|| Saved::new(x, name)),
        y: saves.1.then(|| Saved::new(&out, name)),
    };
    let described = r.x.iter().chain(&r.y).map(Saved::describe).collect();
    crate::autograd::record(name, &[x], out, described, move |g| {
        Ok(vec![Some(to(rule(&r, g)?, r.dtype)?)])
    })
}

/// `out`, the reduction `op` of `x` over `reduced`, with its backward node.
pub(super) fn record_reduction(op: ReduceOp, x: &Tensor, out: Tensor, reduced: &[usize]) -> Tensor {
    match op {
        ReduceOp::Sum => record_rule("SumBackward", x, out, reduced, (false, false), |r, g| {
            r.spread(g)
        }),
        ReduceOp::Prod => record_rule("ProdBackward", x, out, reduced, (true, true), |r, g| {
            let (x, g, y) = (r.x()?, r.spread(g)?, r.spread(r.y()?)?);
            let is_zero = x.eq(0.0)?;
            let zeros = is_zero.to_dtype(x.dtype())?.sum(r.axes(), true)?;
            let others = Tensor::where_cond(&is_zero, 1.0, x)?.prod(r.axes(), true)?;
            let (zeros, others) = (
                zeros.broadcast_to(r.shape.clone())?,
                others.broadcast_to(r.shape.clone())?,
            );
            // No zero: g·y/x. One zero: the zero gets g·(the product of the others), the
            // rest 0. More: 0 everywhere.
            let lone_zero = zeros.eq(1.0)?.logical_and(&is_zero)?;
            let at_zero = Tensor::where_cond(&lone_zero, &g.mul(&others)?, 0.0)?;
            Tensor::where_cond(&zeros.eq(0.0)?, &g.mul(&y)?.div(x)?, &at_zero)
        }),
        ReduceOp::Max | ReduceOp::Min => {
            let name = if op == ReduceOp::Max {
                "MaxBackward"
            } else {
                "MinBackward"
            };
            record_rule(name, x, out, reduced, (true, true), |r, g| {
                let (x, y) = (r.x()?, r.spread(r.y()?)?);
                // The gradient goes to every element equal to the result (NaN to NaN), in
                // equal shares.
                let hit = x
                    .eq(&y)?
                    .logical_or(&x.isnan()?.logical_and(&y.isnan()?)?)?;
                let count = hit.to_dtype(x.dtype())?.sum(r.axes(), true)?;
                let share = to(g.clone(), r.dtype)?
                    .reshape(r.kept_shape())?
                    .div(&count)?;
                Tensor::where_cond(&hit, &share.broadcast_to(r.shape.clone())?, 0.0)
            })
        }
        _ => out,
    }
}

/// `out`, the mean of `x` over `reduced`, with its backward node: the gradient over `n`.
pub(super) fn record_mean(x: &Tensor, out: Tensor, reduced: &[usize]) -> Tensor {
    record_rule("MeanBackward", x, out, reduced, (false, false), |r, g| {
        r.spread(&g.div(r.count() as f64)?)
    })
}

/// `out`, the variance (or with `std` the standard deviation) of `x` over `reduced` with
/// `correction`, with its backward node: `2(x - mean)/(n - c)` (over `2·std` for `std`).
pub(super) fn record_var(
    x: &Tensor,
    out: Tensor,
    reduced: &[usize],
    correction: usize,
    std: bool,
) -> Tensor {
    let name = if std { "StdBackward" } else { "VarBackward" };
    record_rule(name, x, out, reduced, (true, std), move |r, g| {
        let dof = (r.count() as f64 - correction as f64).max(0.0);
        let x = r.x()?;
        let centered = x.sub(&x.mean(r.axes(), true)?)?;
        let g = r.spread(g)?;
        if std {
            g.mul(&centered)?.div(&r.spread(r.y()?)?.mul(dof)?)
        } else {
            g.mul(&centered)?.mul(2.0 / dof)
        }
    })
}

/// `out`, `logsumexp` of `x` over `reduced`, with its backward node: the gradient times
/// `exp(x - out)` (the softmax over the reduced axes).
pub(super) fn record_logsumexp(x: &Tensor, out: Tensor, reduced: &[usize]) -> Tensor {
    record_rule(
        "LogsumexpBackward",
        x,
        out,
        reduced,
        (true, true),
        |r, g| {
            let weights = r.x()?.sub(&r.spread(r.y()?)?)?.exp()?;
            r.spread(g)?.mul(&weights)
        },
    )
}

/// `out`, `softmax` (or with `log` `log_softmax`) of `x` along `axis`, with its backward
/// node: `y·(g - Σ g·y)`, or `g - exp(y)·Σ g`.
pub(super) fn record_softmax(x: &Tensor, out: Tensor, axis: isize, log: bool) -> Tensor {
    let name = if log {
        "LogSoftmaxBackward"
    } else {
        "SoftmaxBackward"
    };
    // No axis is reduced: the rule works along `axis` on tensors of the input's shape.
    record_rule(name, x, out, &[], (false, true), move |r, g| {
        let y = r.y()?;
        if log {
            g.sub(&y.exp()?.mul(&g.sum(axis, true)?)?)
        } else {
            y.mul(&g.sub(&g.mul(y)?.sum(axis, true)?)?)
        }
    })
}

/// `t` in `dtype` (itself when it has it).
fn to(t: Tensor, dtype: DType) -> Result<Tensor> {
    if t.dtype() == dtype {
        Ok(t)
    } else {
        t.to_dtype(dtype)
    }
}
