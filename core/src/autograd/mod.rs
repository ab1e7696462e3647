//! Autograd, with PyTorch's semantics and names, on top of lazy fusion. A leaf asks for a
//! gradient with [`Tensor::requires_grad_`]; every op on it then records a node on its
//! result (the op's name, where each input's gradient goes, what it saved), and
//! [`Tensor::backward`] runs the nodes in reverse, accumulating gradients into the leaves'
//! [`Tensor::grad`]. Backward functions are written with strata's own ops and run with grad
//! mode off, so their elementwise work is recorded by lazy fusion like any other: the
//! backward of an elementwise chain runs as one kernel, and a forward value fusion never
//! stored is computed again inside the backward kernel instead of being kept.
//!
//! ```
//! use strata_core::{Device, DType, Tensor};
//! let dev = Device::cpu();
//! let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0], [3], &dev)?.requires_grad_(true)?;
//! let y = (&x * &x)?.sum(strata_core::ops::Axes::All, false)?; // Σ x²
//! y.backward()?;
//! assert_eq!(x.grad().unwrap().to_vec::<f32>()?, vec![2.0, 4.0, 6.0]);
//! assert_eq!(y.grad_fn(), Some("SumBackward"));
//! # Ok::<(), strata_core::Error>(())
//! ```

mod derivative;
mod engine;
pub(crate) mod graph;
mod hooks;
mod mode;

pub use hooks::HookHandle;
pub use mode::{is_grad_enabled, no_grad, NoGradGuard};

use crate::error::{Error, Result};
use crate::ir::Expr;
use crate::sync::LockUnpoisoned;
use crate::tensor::Tensor;
use graph::{AutogradMeta, BackwardFn, Node, Saved};
use std::sync::Arc;

/// Runs the backward pass from `tensors` (PyTorch's `torch.autograd.backward`), each with
/// its gradient from `grad_tensors` (`None`: ones, for one-element tensors), accumulating
/// into the leaves' gradients. With `retain_graph` the graph may be run through again.
///
/// ```
/// use strata_core::{autograd, Device, DType, Tensor};
/// let x = Tensor::full([1], 3.0, DType::F32, &Device::cpu())?.requires_grad_(true)?;
/// let y = (&x * &x)?;
/// autograd::backward(&[&y], None, true)?;
/// autograd::backward(&[&y], None, false)?; // twice: gradients accumulate
/// assert_eq!(x.grad().unwrap().item::<f32>()?, 12.0);
/// assert!(y.backward().is_err()); // the graph was freed
/// # Ok::<(), strata_core::Error>(())
/// ```
pub fn backward(
    tensors: &[&Tensor],
    grad_tensors: Option<&[&Tensor]>,
    retain_graph: bool,
) -> Result<()> {
    let roots = roots(tensors, grad_tensors)?;
    let pairs: Vec<(&Tensor, Tensor)> = tensors.iter().copied().zip(roots).collect();
    engine::run(&pairs, retain_graph, engine::Sink::Accumulate).map(|_| ())
}

/// The gradients of `outputs` with respect to `inputs` (PyTorch's `torch.autograd.grad`),
/// without accumulating into any tensor's `grad`: `None` for an input no path reaches.
/// `grad_outputs` as in [`backward`].
///
/// ```
/// use strata_core::{autograd, Device, DType, Tensor};
/// let x = Tensor::full([1], 2.0, DType::F32, &Device::cpu())?.requires_grad_(true)?;
/// let y = x.exp()?;
/// let g = autograd::grad(&[&y], &[&x], None, false)?;
/// assert!((g[0].as_ref().unwrap().item::<f32>()? - 2f32.exp()).abs() < 1e-5);
/// assert!(x.grad().is_none());
/// # Ok::<(), strata_core::Error>(())
/// ```
pub fn grad(
    outputs: &[&Tensor],
    inputs: &[&Tensor],
    grad_outputs: Option<&[&Tensor]>,
    retain_graph: bool,
) -> Result<Vec<Option<Tensor>>> {
    for t in inputs {
        if !t.requires_grad() {
            return Err(Error::Invalid(format!(
                "autograd::grad: an input of shape {:?} does not require a gradient",
                t.shape()
            )));
        }
    }
    let roots = roots(outputs, grad_outputs)?;
    let pairs: Vec<(&Tensor, Tensor)> = outputs.iter().copied().zip(roots).collect();
    engine::run(&pairs, retain_graph, engine::Sink::Capture(inputs))
}

/// Ones of `t`'s shape and dtype as pending work (a map of the constant): the first backward
/// kernel computes it in place instead of a kernel filling it first.
fn ones(t: &Tensor) -> Result<Tensor> {
    let one = Expr::literal(crate::dtype::Scalar::F64(1.0).cast(t.dtype(), false));
    let layout = crate::layout::Layout::contiguous(t.shape())?;
    crate::fusion::defer_or_launch(one, layout, vec![], vec![], t.device(), "ones")
}

/// The gradient each root starts with: given, or ones for a one-element tensor.
fn roots(tensors: &[&Tensor], grads: Option<&[&Tensor]>) -> Result<Vec<Tensor>> {
    if let Some(g) = grads {
        if g.len() != tensors.len() {
            return Err(Error::Invalid(format!(
                "{} gradients for {} tensors",
                g.len(),
                tensors.len()
            )));
        }
    }
    tensors
        .iter()
        .enumerate()
        .map(|(k, t)| match grads {
            Some(g) => Ok(g[k].detach()),
            None if t.numel() == 1 => ones(t),
            None => Err(Error::Shape(format!(
                "backward() without a gradient needs a one-element tensor; this one has shape \
                 {:?}: pass its gradient (backward_with)",
                t.shape()
            ))),
        })
        .collect()
}

impl Tensor {
    /// Sets whether this leaf records a gradient (PyTorch's `requires_grad_`), returning it.
    /// Only floating-point tensors may; a non-leaf cannot be switched off (take `detach()`).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let w = Tensor::zeros([3], DType::F32, &dev)?.requires_grad_(true)?;
    /// assert!(w.requires_grad() && w.is_leaf());
    /// assert!(Tensor::zeros([3], DType::I32, &dev)?.requires_grad_(true).is_err());
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn requires_grad_(mut self, requires_grad: bool) -> Result<Tensor> {
        if let Some(meta) = graph::meta(&self) {
            if meta.grad_fn.is_some() {
                if requires_grad {
                    return Ok(self);
                }
                return Err(Error::Invalid(format!(
                    "requires_grad_(false) on a tensor computed by {}: only leaves can be \
                     switched off; use detach() for a tensor outside the graph",
                    meta.grad_fn.as_ref().map_or("an op", |n| n.name)
                )));
            }
        }
        if requires_grad && !self.dtype.is_float() {
            return Err(Error::DType(format!(
                "only floating-point tensors can require gradients, not {}",
                self.dtype
            )));
        }
        self.autograd = match (requires_grad, self.autograd.take()) {
            (true, Some(meta)) => Some(meta),
            (true, None) => Some(Arc::new(AutogradMeta::leaf(self.shape(), self.dtype))),
            (false, _) => None,
        };
        Ok(self)
    }

    /// True when ops on this tensor record gradients: a leaf that asked for one, or the
    /// result of an op on one.
    ///
    /// ```
    /// let t = strata_core::Tensor::zeros([2], strata_core::DType::F32, &strata_core::Device::cpu()).unwrap();
    /// assert!(!t.requires_grad());
    /// ```
    pub fn requires_grad(&self) -> bool {
        self.autograd.is_some()
    }

    /// A leaf's accumulated gradient (`None` before a backward pass reaches it, and for
    /// tensors that are not leaves).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let x = Tensor::ones([2], DType::F32, &Device::cpu())?.requires_grad_(true)?;
    /// assert!(x.grad().is_none());
    /// x.mul(3.0)?.sum(strata_core::ops::Axes::All, false)?.backward()?;
    /// assert_eq!(x.grad().unwrap().to_vec::<f32>()?, vec![3.0, 3.0]);
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn grad(&self) -> Option<Tensor> {
        let meta = graph::meta(self)?;
        if meta.grad_fn.is_some() {
            return None;
        }
        meta.grad().clone()
    }

    /// Replaces a leaf's gradient (`None` clears it); it must have the leaf's shape.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let x = Tensor::ones([2], DType::F32, &dev)?.requires_grad_(true)?;
    /// x.set_grad(Some(Tensor::full([2], 5.0, DType::F32, &dev)?))?;
    /// assert_eq!(x.grad().unwrap().to_vec::<f32>()?, vec![5.0, 5.0]);
    /// assert!(x.set_grad(Some(Tensor::ones([3], DType::F32, &dev)?)).is_err());
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn set_grad(&self, grad: Option<Tensor>) -> Result<()> {
        let meta = match graph::meta(self) {
            Some(m) if m.grad_fn.is_none() => m,
            _ => {
                return Err(Error::Invalid(
                    "set_grad on a tensor that is not a leaf requiring a gradient".into(),
                ))
            }
        };
        if let Some(g) = &grad {
            if g.shape() != self.shape() || g.dtype() != self.dtype() {
                return Err(Error::Shape(format!(
                    "set_grad: a {} gradient of shape {:?} for a {} tensor of shape {:?}",
                    g.dtype(),
                    g.shape(),
                    self.dtype(),
                    self.shape()
                )));
            }
            self.same_device(g, "set_grad")?;
        }
        *meta.grad() = grad.map(|g| g.detach());
        Ok(())
    }

    /// Clears a leaf's gradient (PyTorch's `zero_grad` with `set_to_none`): the next backward
    /// pass starts it afresh.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let x = Tensor::ones([1], DType::F32, &Device::cpu())?.requires_grad_(true)?;
    /// x.mul(2.0)?.backward()?;
    /// x.zero_grad();
    /// assert!(x.grad().is_none());
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn zero_grad(&self) {
        if let Some(meta) = graph::meta(self) {
            *meta.grad() = None;
        }
    }

    /// True unless an op that records gradients computed this tensor.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let x = Tensor::ones([1], DType::F32, &Device::cpu())?.requires_grad_(true)?;
    /// assert!(x.is_leaf() && !x.exp()?.is_leaf());
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn is_leaf(&self) -> bool {
        graph::meta(self).is_none_or(|m| m.grad_fn.is_none())
    }

    /// The name of the backward node of the op that computed this tensor (`MulBackward`, …).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let x = Tensor::ones([1], DType::F32, &Device::cpu())?.requires_grad_(true)?;
    /// assert_eq!(x.exp()?.grad_fn(), Some("ExpBackward"));
    /// assert_eq!(x.grad_fn(), None);
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn grad_fn(&self) -> Option<&'static str> {
        Some(graph::meta(self)?.grad_fn.as_ref()?.name)
    }

    /// What the displays add for a tensor in the graph: `grad_fn=MulBackward` for a result,
    /// `requires_grad=true` for a leaf; `None` outside the graph.
    pub(crate) fn autograd_note(&self) -> Option<String> {
        let meta = graph::meta(self)?;
        Some(match &meta.grad_fn {
            Some(node) => format!("grad_fn={}", node.name),
            None => "requires_grad=true".into(),
        })
    }

    /// The same values outside the graph: a view of the same storage that requires no
    /// gradient.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let x = Tensor::ones([1], DType::F32, &Device::cpu())?.requires_grad_(true)?;
    /// let d = x.exp()?.detach();
    /// assert!(!d.requires_grad() && d.is_leaf());
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn detach(&self) -> Tensor {
        Tensor {
            storage: self.storage.clone(),
            layout: self.layout.clone(),
            dtype: self.dtype,
            autograd: None,
        }
    }

    /// Runs the backward pass from this one-element tensor (a loss): the gradients of the
    /// leaves it depends on accumulate into their [`grad`](Tensor::grad), and the graph is
    /// freed (see [`autograd::backward`](backward) to keep it).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let x = Tensor::full([1], 2.0, DType::F32, &Device::cpu())?.requires_grad_(true)?;
    /// x.square()?.backward()?;
    /// assert_eq!(x.grad().unwrap().item::<f32>()?, 4.0);
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn backward(&self) -> Result<()> {
        backward(&[self], None, false)
    }

    /// Runs the backward pass from this tensor with `gradient` as its gradient (of its
    /// shape), as [`backward`](Tensor::backward) does from a one-element tensor.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let x = Tensor::ones([2], DType::F32, &dev)?.requires_grad_(true)?;
    /// let y = x.mul(3.0)?;
    /// y.backward_with(&Tensor::from_slice(&[1.0f32, 2.0], [2], &dev)?)?;
    /// assert_eq!(x.grad().unwrap().to_vec::<f32>()?, vec![3.0, 6.0]);
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn backward_with(&self, gradient: &Tensor) -> Result<()> {
        backward(&[self], Some(&[gradient]), false)
    }
}

/// True when an op over `inputs` records a node: grad mode on and an input requires a
/// gradient. Ops check it before saving anything.
pub(crate) fn needed<'t>(inputs: impl IntoIterator<Item = &'t Tensor>) -> bool {
    inputs.into_iter().any(|t| t.autograd.is_some()) && is_grad_enabled()
}

/// The backward node's name for the user op `op`: `mul` → `MulBackward`, `where_cond` →
/// `WhereCondBackward` (made once per op name).
pub(crate) fn backward_name(op: &'static str) -> &'static str {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static NAMES: Mutex<Option<HashMap<&'static str, &'static str>>> = Mutex::new(None);
    let mut names = NAMES.lock_unpoisoned();
    names
        .get_or_insert_with(HashMap::new)
        .entry(op)
        .or_insert_with(|| {
            let mut name: String = op
                .trim_end_matches('_')
                .split('_')
                .map(|w| {
                    let mut c = w.chars();
                    c.next()
                        .map(|f| f.to_uppercase().chain(c).collect::<String>())
                        .unwrap_or_default()
                })
                .collect();
            name.push_str("Backward");
            Box::leak(name.into_boxed_str())
        })
}

/// `output` with a node recorded for the op `name` over `inputs`, whose backward function
/// `backward` maps the output's gradient to one gradient per input (`None` where an input
/// gets none). `saved` describes what the function keeps ([`Saved::describe`], for the graph
/// picture). Nothing
/// is recorded unless [`needed`] and the output is a floating-point tensor.
pub(crate) fn record(
    name: &'static str,
    inputs: &[&Tensor],
    mut output: Tensor,
    saved: Vec<(Vec<usize>, crate::dtype::DType)>,
    backward: impl Fn(&Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync + 'static,
) -> Tensor {
    if !needed(inputs.iter().copied()) || !output.dtype.is_float() {
        return output;
    }
    let node = Node::new(
        name,
        inputs,
        &output,
        saved,
        Box::new(backward) as BackwardFn,
    );
    let meta = AutogradMeta::computed(node, output.shape(), output.dtype);
    output.autograd = Some(Arc::new(meta));
    output
}

/// The node of an elementwise op: `expr` over `inputs` (of the output's shape: broadcast
/// views) and `scalars`, differentiated once per input that requires a gradient; each
/// gradient is one map kernel over the output's gradient and the saved inputs.
pub(crate) fn record_elementwise(
    name: &'static str,
    expr: &Expr,
    inputs: &[Tensor],
    scalars: &[crate::dtype::Scalar],
    output: Tensor,
) -> Tensor {
    if !needed(inputs) || !output.dtype.is_float() {
        return output;
    }
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let wanted: Vec<bool> = inputs.iter().map(|t| t.requires_grad()).collect();
    let grads = derivative::vjp(expr, &wanted);
    // Only the inputs a gradient reads are kept (an add keeps none).
    let mut read: Vec<usize> = Vec::new();
    for e in grads.iter().flatten() {
        collect_inputs(e, &mut read);
    }
    let saved: Vec<Option<Saved>> = inputs
        .iter()
        .enumerate()
        .map(|(k, t)| read.contains(&(k + 1)).then(|| Saved::new(t, name)))
        .collect();
    let described = saved.iter().flatten().map(Saved::describe).collect();
    let scalars = scalars.to_vec();
    let shape = output.shape().to_vec();
    record(name, &refs, output, described, move |g| {
        let mut values: Vec<Tensor> = Vec::with_capacity(saved.len() + 1);
        values.push(g.clone());
        for s in &saved {
            // An input no gradient reads stands as the gradient (never bound: map_over binds
            // only what the expression reads).
            values.push(match s {
                Some(s) => s.get()?.clone(),
                None => g.clone(),
            });
        }
        grads
            .iter()
            .map(|e| match e {
                // The output's gradient itself (an add's operands): no copy.
                Some(e) if *e == Expr::input(0, g.dtype()) => Ok(Some(g.clone())),
                Some(e) => map_over(e, &shape, &values, &scalars).map(Some),
                None => Ok(None),
            })
            .collect()
    })
}

/// ReLU's node (`expr` is `relu(input 0)`): its gradient, `g` where the value is positive,
/// reads the output instead of the input, as PyTorch's `threshold_backward` does — the two
/// are positive at the same places — so a lazily fused input (a batch norm's output, say) is
/// not stored a second time for the backward pass.
pub(crate) fn record_relu(expr: &Expr, input: &Tensor, output: Tensor) -> Tensor {
    if !needed([input]) || !output.dtype.is_float() {
        return output;
    }
    let Some(Some(grad)) = derivative::vjp(expr, &[true]).into_iter().next() else {
        return output;
    };
    let kept = output.detach();
    let saved = vec![(kept.shape().to_vec(), kept.dtype())];
    let shape = output.shape().to_vec();
    record("ReluBackward", &[input], output, saved, move |g| {
        let values = [g.clone(), kept.clone()];
        Ok(vec![Some(map_over(&grad, &shape, &values, &[])?)])
    })
}

/// A new tensor of `shape` computing `expr` over those of `values` it reads (views of
/// `shape`) and `scalars`: recorded for fusion like any elementwise op.
fn map_over(
    expr: &Expr,
    shape: &[usize],
    values: &[Tensor],
    scalars: &[crate::dtype::Scalar],
) -> Result<Tensor> {
    // Only the inputs the expression reads are bound, renumbered in order.
    let mut used: Vec<usize> = Vec::new();
    collect_inputs(expr, &mut used);
    used.sort_unstable();
    used.dedup();
    let expr = renumber(expr, &used);
    let inputs: Vec<Tensor> = used.iter().map(|&k| values[k].clone()).collect();
    let device = values[0].device().clone();
    crate::fusion::defer_or_launch(
        expr,
        crate::layout::Layout::contiguous(shape)?,
        inputs,
        scalars.to_vec(),
        &device,
        crate::backward_scope::op_name("backward"),
    )
}

fn collect_inputs(e: &Expr, out: &mut Vec<usize>) {
    if let crate::ir::Node::Input(k) = e.node {
        out.push(k);
    }
    for c in e.children() {
        collect_inputs(c, out);
    }
}

fn renumber(e: &Expr, used: &[usize]) -> Expr {
    match e.node {
        crate::ir::Node::Input(k) => Expr::input(used.binary_search(&k).unwrap_or(0), e.dtype),
        _ => e.map_children(|c| renumber(c, used)),
    }
}

/// `g` summed down to `shape` (the shape it was broadcast from: leading axes and size-1 axes
/// that grew are summed over), as the gradient of a broadcast: a `[2, 3]` gradient of a
/// `[3]` tensor broadcast to `[2, 3]` is summed over axis 0.
pub(crate) fn sum_to_shape(g: &Tensor, shape: &[usize]) -> Result<Tensor> {
    if g.shape() == shape {
        return Ok(g.clone());
    }
    let lead = g.ndim().checked_sub(shape.len()).ok_or_else(|| {
        Error::Shape(format!(
            "internal error: a gradient of shape {:?} for a tensor of shape {shape:?}",
            g.shape()
        ))
    })?;
    let mut axes: Vec<isize> = (0..lead as isize).collect();
    for (k, &n) in shape.iter().enumerate() {
        if n == 1 && g.shape()[lead + k] != 1 {
            axes.push((lead + k) as isize);
        }
    }
    g.sum(axes, true)?.reshape(shape.to_vec())
}

/// An `Err` when an in-place write (`what`) would copy `source`, which requires a gradient,
/// into a tensor outside the graph: the gradient would silently stop there.
pub(crate) fn refuse_in_place_source(source: &Tensor, what: &str) -> Result<()> {
    if needed([source]) {
        return Err(Error::Invalid(format!(
            "{what} writes a value that requires a gradient in place, which autograd does not \
             record; use the out-of-place op, or detach() the value"
        )));
    }
    Ok(())
}

/// An `Err` for a write into `out`, which requires a gradient, while grad mode is on: the
/// graph would not see it (PyTorch refuses it for leaves; strata for every such tensor). In
/// [`no_grad`] it is allowed (an optimizer's update). Every op that writes into a tensor the
/// caller passes (`assign`, `fill`, `set`, the `_` and `_out` forms, the scatters, `gemm`'s
/// `c`) asks it first.
pub(crate) fn refuse_write_into(out: &Tensor) -> Result<()> {
    let Some(meta) = graph::meta(out) else {
        return Ok(());
    };
    if !is_grad_enabled() {
        return Ok(());
    }
    Err(Error::Invalid(match &meta.grad_fn {
        None => format!(
            "a leaf that requires a gradient (shape {:?}) is being written in place; write it \
             inside autograd::no_grad (an optimizer step), or write into a copy",
            out.shape()
        ),
        Some(node) => format!(
            "in-place writes into a tensor that requires a gradient (shape {:?}, computed by \
             {}) are not recorded by autograd; use the out-of-place op, or detach() first",
            out.shape(),
            node.name
        ),
    }))
}
