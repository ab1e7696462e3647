//! The backward rules of reductions. A reduction's gradient is its output's gradient spread
//! back over the reduced axes (a broadcast view: no copy), then an elementwise rule that lazy
//! fusion records like any other op: `sum` passes it on, `mean` divides it, `max`/`min` give
//! it to the maxima (ties share it evenly, as PyTorch's `amax`), `prod` to each element as
//! the product of the others (zeros included, as PyTorch), `var`/`std`, `logsumexp` and
//! `softmax`/`log_softmax` their closed forms.

use crate::autograd::graph::Saved;
use crate::dtype::DType;
use crate::error::Result;
use crate::ir::ReduceOp;
use crate::ops::Axes;
use crate::tensor::Tensor;

/// `x`'s shape with the `reduced` axes of size 1.
fn kept_shape(x: &[usize], reduced: &[usize]) -> Vec<usize> {
    (0..x.len())
        .map(|a| if reduced.contains(&a) { 1 } else { x[a] })
        .collect()
}

/// A tensor of the reduction's output shape (`keepdim` or not) as a view of `shape`: its
/// values repeated over the reduced axes.
fn spread(t: &Tensor, shape: &[usize], reduced: &[usize]) -> Result<Tensor> {
    t.reshape(kept_shape(shape, reduced))?
        .broadcast_to(shape.to_vec())
}

/// The reduced axes, as a reduction of the gradient takes them.
fn axes(reduced: &[usize]) -> Axes {
    Axes::List(reduced.iter().map(|&a| a as isize).collect())
}

/// `out`, the reduction `op` of `x` over `reduced`, with its backward node.
pub(super) fn record_reduction(
    op: ReduceOp,
    x: &Tensor,
    out: Tensor,
    reduced: &[usize],
    _keepdim: bool,
) -> Result<Tensor> {
    let shape = x.shape().to_vec();
    let reduced = reduced.to_vec();
    let dtype = x.dtype();
    Ok(match op {
        ReduceOp::Sum => crate::autograd::record("SumBackward", &[x], out, Vec::new(), move |g| {
            Ok(vec![Some(to(spread(g, &shape, &reduced)?, dtype)?)])
        }),
        ReduceOp::Prod => {
            let (xs, ys) = (Saved::new(x, "prod"), Saved::new(&out, "prod"));
            let described = vec![xs.describe(), ys.describe()];
            crate::autograd::record("ProdBackward", &[x], out.clone(), described, move |g| {
                let (x, y) = (xs.get()?, ys.get()?);
                let g = spread(&to(g.clone(), x.dtype())?, &shape, &reduced)?;
                let y = spread(&to(y.clone(), x.dtype())?, &shape, &reduced)?;
                let is_zero = x.eq(0.0)?;
                let zeros = is_zero.to_dtype(x.dtype())?.sum(axes(&reduced), true)?;
                let others = Tensor::where_cond(&is_zero, 1.0, x)?.prod(axes(&reduced), true)?;
                let (zeros, others) = (
                    zeros.broadcast_to(shape.clone())?,
                    others.broadcast_to(shape.clone())?,
                );
                // No zero: g·y/x. One zero: the zero gets g·(the product of the others),
                // the rest 0. More: 0 everywhere.
                let lone_zero = zeros.eq(1.0)?.logical_and(&is_zero)?;
                let at_zero = Tensor::where_cond(&lone_zero, &g.mul(&others)?, 0.0)?;
                let gx = Tensor::where_cond(&zeros.eq(0.0)?, &g.mul(&y)?.div(x)?, &at_zero)?;
                Ok(vec![Some(gx)])
            })
        }
        ReduceOp::Max | ReduceOp::Min => {
            let (xs, ys) = (Saved::new(x, "max"), Saved::new(&out, "max"));
            let name = if op == ReduceOp::Max {
                "MaxBackward"
            } else {
                "MinBackward"
            };
            let described = vec![xs.describe(), ys.describe()];
            crate::autograd::record(name, &[x], out.clone(), described, move |g| {
                let (x, y) = (xs.get()?, ys.get()?);
                let y = spread(y, &shape, &reduced)?;
                // The gradient goes to every element equal to the result (NaN to NaN), in
                // equal shares.
                let hit = x
                    .eq(&y)?
                    .logical_or(&x.isnan()?.logical_and(&y.isnan()?)?)?;
                let count = hit.to_dtype(x.dtype())?.sum(axes(&reduced), true)?;
                let share = g.reshape(kept_shape(&shape, &reduced))?.div(&count)?;
                let gx = Tensor::where_cond(&hit, &share.broadcast_to(shape.clone())?, 0.0)?;
                Ok(vec![Some(gx)])
            })
        }
        _ => out,
    })
}

/// `out`, the mean of `x` over `reduced`, with its backward node: the gradient over `n`.
pub(super) fn record_mean(
    x: &Tensor,
    out: Tensor,
    reduced: &[usize],
    _keepdim: bool,
) -> Result<Tensor> {
    let shape = x.shape().to_vec();
    let reduced = reduced.to_vec();
    let n: usize = reduced.iter().map(|&a| shape[a]).product();
    let dtype = x.dtype();
    Ok(crate::autograd::record(
        "MeanBackward",
        &[x],
        out,
        Vec::new(),
        move |g| {
            let gx = to(g.div(n as f64)?, dtype)?;
            Ok(vec![Some(spread(&gx, &shape, &reduced)?)])
        },
    ))
}

/// `out`, the variance (or with `std` the standard deviation) of `x` over `reduced` with
/// `correction`, with its backward node: `2(x - mean)/(n - c)` (over `2·std` for `std`).
pub(super) fn record_var(
    x: &Tensor,
    out: Tensor,
    reduced: &[usize],
    correction: usize,
    _keepdim: bool,
    std: bool,
) -> Result<Tensor> {
    let shape = x.shape().to_vec();
    let reduced = reduced.to_vec();
    let n: usize = reduced.iter().map(|&a| shape[a]).product();
    let dof = (n as f64 - correction as f64).max(0.0);
    let xs = Saved::new(x, if std { "std" } else { "var" });
    let ys = Saved::new(&out, if std { "std" } else { "var" });
    let described = vec![xs.describe(), ys.describe()];
    let name = if std { "StdBackward" } else { "VarBackward" };
    Ok(crate::autograd::record(
        name,
        &[x],
        out.clone(),
        described,
        move |g| {
            let x = xs.get()?;
            let centered = x.sub(&x.mean(axes(&reduced), true)?)?;
            let g = spread(&to(g.clone(), x.dtype())?, &shape, &reduced)?;
            let gx = if std {
                let s = spread(&to(ys.get()?.clone(), x.dtype())?, &shape, &reduced)?;
                g.mul(&centered)?.div(&s.mul(dof)?)?
            } else {
                g.mul(&centered)?.mul(2.0 / dof)?
            };
            Ok(vec![Some(gx)])
        },
    ))
}

/// `out`, `logsumexp` of `x` over `reduced`, with its backward node: the gradient times
/// `exp(x - out)` (the softmax over the reduced axes).
pub(super) fn record_logsumexp(
    x: &Tensor,
    out: Tensor,
    reduced: &[usize],
    _keepdim: bool,
) -> Result<Tensor> {
    let shape = x.shape().to_vec();
    let reduced = reduced.to_vec();
    let (xs, ys) = (Saved::new(x, "logsumexp"), Saved::new(&out, "logsumexp"));
    let described = vec![xs.describe(), ys.describe()];
    Ok(crate::autograd::record(
        "LogsumexpBackward",
        &[x],
        out.clone(),
        described,
        move |g| {
            let (x, y) = (xs.get()?, ys.get()?);
            let weights = x.sub(&spread(y, &shape, &reduced)?)?.exp()?;
            let gx = spread(g, &shape, &reduced)?.mul(&weights)?;
            Ok(vec![Some(to(gx, x.dtype())?)])
        },
    ))
}

/// `out`, `softmax` (or with `log` `log_softmax`) of `x` along `axis`, with its backward
/// node: `y·(g - Σ g·y)`, or `g - exp(y)·Σ g`.
pub(super) fn record_softmax(x: &Tensor, out: Tensor, axis: isize, log: bool) -> Result<Tensor> {
    let name = if log {
        "LogSoftmaxBackward"
    } else {
        "SoftmaxBackward"
    };
    let ys = Saved::new(&out, if log { "log_softmax" } else { "softmax" });
    let described = vec![ys.describe()];
    let dtype = x.dtype();
    Ok(crate::autograd::record(
        name,
        &[x],
        out.clone(),
        described,
        move |g| {
            let y = ys.get()?;
            let gx = if log {
                g.sub(&y.exp()?.mul(&g.sum(axis, true)?)?)?
            } else {
                y.mul(&g.sub(&g.mul(y)?.sum(axis, true)?)?)?
            };
            Ok(vec![Some(to(gx, dtype)?)])
        },
    ))
}

/// `t` in `dtype` (itself when it has it).
fn to(t: Tensor, dtype: DType) -> Result<Tensor> {
    if t.dtype() == dtype {
        Ok(t)
    } else {
        t.to_dtype(dtype)
    }
}
