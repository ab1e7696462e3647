//! The backward pass: from the roots' gradients, each node's backward function once all the
//! gradient reaching it has been summed (nodes in topological order, found without
//! recursion, so a chain of any length runs), gradients summed where paths meet and
//! accumulated into leaves — or, for [`grad`](super::grad), captured for the inputs asked
//! for. It runs with grad mode off: the gradients are plain tensors, and their elementwise
//! work is recorded by lazy fusion like any other.

use super::graph::{AutogradMeta, Edge, Node};
use super::mode::NoGradGuard;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::collections::HashMap;
use std::sync::Arc;

/// What the pass does with the gradients that reach leaves.
pub(crate) enum Sink<'t> {
    /// Accumulate them into the leaves' `grad` (`backward`).
    Accumulate,
    /// Capture the gradients of these tensors and accumulate nothing (`autograd::grad`).
    Capture(&'t [&'t Tensor]),
}

/// Runs the backward pass from `roots` (each a tensor and its gradient). With a `Capture`
/// sink it returns each asked-for tensor's gradient (`None` where none reached it).
pub(crate) fn run(
    roots: &[(&Tensor, Tensor)],
    retain_graph: bool,
    sink: Sink,
) -> Result<Vec<Option<Tensor>>> {
    let _off = NoGradGuard::new();
    let mut captured: Vec<Option<Tensor>> = match &sink {
        Sink::Capture(ts) => vec![None; ts.len()],
        Sink::Accumulate => Vec::new(),
    };
    // Node gradients summed so far, and how many edges into each node are still to come.
    let mut sums: HashMap<*const Node, Tensor> = HashMap::new();
    let (mut pending, mut hooked) = dependencies(roots, matches!(sink, Sink::Accumulate));
    let mut ready: Vec<Arc<Node>> = Vec::new();
    for (t, g) in roots {
        let Some(meta) = super::graph::meta(t) else {
            return Err(Error::Invalid(format!(
                "the {} tensor of shape {:?} does not require a gradient and has no grad_fn: \
                 call requires_grad_(true) on the leaves before the ops, outside no_grad",
                t.dtype(),
                t.shape()
            )));
        };
        check_gradient(
            g,
            &meta.shape_of(t),
            t.dtype(),
            "the gradient passed to backward",
        )?;
        // As PyTorch: the gradient lives where the tensor does.
        t.same_device(g, "the gradient passed to backward")?;
        match &meta.grad_fn {
            Some(node) => {
                add_into(&mut sums, node, g.clone())?;
                if pending.get(&Arc::as_ptr(node)).copied().unwrap_or(0) == 0
                    && !ready.iter().any(|n| Arc::ptr_eq(n, node))
                {
                    ready.push(node.clone());
                }
            }
            None => {
                deliver(meta, g.clone(), &sink, &mut captured)?;
                reached(&mut hooked, meta, true)?;
            }
        }
    }
    while let Some(node) = ready.pop() {
        // A node no gradient reached still passes on that its inputs get none from it.
        let Some(grad) = sums.remove(&Arc::as_ptr(&node)) else {
            for edge in &node.edges {
                match edge {
                    Edge::Node(next) => {
                        let left = pending.entry(Arc::as_ptr(next)).or_insert(1);
                        *left -= 1;
                        if *left == 0 {
                            ready.push(next.clone());
                        }
                    }
                    Edge::Leaf(meta) => reached(&mut hooked, meta, false)?,
                    Edge::None => {}
                }
            }
            continue;
        };
        if let Sink::Capture(ts) = &sink {
            for (k, t) in ts.iter().enumerate() {
                if super::graph::meta(t)
                    .and_then(|m| m.grad_fn.as_ref())
                    .is_some_and(|n| Arc::ptr_eq(n, &node))
                {
                    captured[k] = Some(grad.clone());
                }
            }
        }
        let grads = {
            let _named = crate::backward_scope::BackwardScope::enter(node.name);
            node.apply(&grad, retain_graph)?
        };
        drop(grad);
        for (edge, g) in node.edges.iter().zip(grads) {
            match edge {
                Edge::None => {}
                Edge::Leaf(meta) => {
                    let given = g.is_some();
                    if let Some(g) = g {
                        deliver(meta, g, &sink, &mut captured)?;
                    }
                    reached(&mut hooked, meta, given)?;
                }
                Edge::Node(next) => {
                    if let Some(g) = g {
                        check_gradient(&g, &next.shape, next.dtype, next.name)?;
                        add_into(&mut sums, next, g)?;
                    }
                    let left = pending.entry(Arc::as_ptr(next)).or_insert(1);
                    *left -= 1;
                    if *left == 0 {
                        ready.push(next.clone());
                    }
                }
            }
        }
    }
    Ok(captured)
}

/// Edges still to reach a hooked leaf, and whether a gradient has reached it.
type Hooked = HashMap<*const AutogradMeta, (usize, bool)>;

/// How many edges lead into each node reachable from the roots (a walk with its own stack),
/// and, with `hooks`, into each leaf with hooks (roots that are such leaves count one).
fn dependencies(roots: &[(&Tensor, Tensor)], hooks: bool) -> (HashMap<*const Node, usize>, Hooked) {
    let mut count: HashMap<*const Node, usize> = HashMap::new();
    let mut hooked = Hooked::new();
    let mut seen: HashMap<*const Node, ()> = HashMap::new();
    for (t, _) in roots {
        if let Some(meta) = super::graph::meta(t).filter(|m| hooks && m.grad_fn.is_none()) {
            if super::hooks::any(meta) {
                hooked.entry(meta as *const _).or_insert((0, false)).0 += 1;
            }
        }
    }
    let mut stack: Vec<Arc<Node>> = roots
        .iter()
        .filter_map(|(t, _)| super::graph::meta(t)?.grad_fn.clone())
        .collect();
    while let Some(node) = stack.pop() {
        if seen.insert(Arc::as_ptr(&node), ()).is_some() {
            continue;
        }
        for edge in &node.edges {
            match edge {
                Edge::Node(next) => {
                    *count.entry(Arc::as_ptr(next)).or_insert(0) += 1;
                    stack.push(next.clone());
                }
                Edge::Leaf(meta) if hooks && super::hooks::any(meta) => {
                    hooked.entry(Arc::as_ptr(meta)).or_insert((0, false)).0 += 1;
                }
                _ => {}
            }
        }
    }
    (count, hooked)
}

/// One edge into `leaf` done (`given`: it carried a gradient): after its last one, the
/// leaf's hooks run if any gradient reached it in this pass.
fn reached(hooked: &mut Hooked, leaf: &AutogradMeta, given: bool) -> Result<()> {
    let Some((left, any)) = hooked.get_mut(&(leaf as *const _)) else {
        return Ok(());
    };
    *left -= 1;
    *any |= given;
    if *left == 0 && *any {
        super::hooks::run(leaf)?;
    }
    Ok(())
}

/// Adds `g` to the gradient summed for `node`.
fn add_into(sums: &mut HashMap<*const Node, Tensor>, node: &Arc<Node>, g: Tensor) -> Result<()> {
    let key = Arc::as_ptr(node);
    let sum = match sums.remove(&key) {
        Some(earlier) => earlier.add(&g)?,
        None => g,
    };
    sums.insert(key, sum);
    Ok(())
}

/// A gradient reaching a leaf: accumulated into its `grad`, or captured.
fn deliver(
    meta: &AutogradMeta,
    g: Tensor,
    sink: &Sink,
    captured: &mut [Option<Tensor>],
) -> Result<()> {
    let g = if g.dtype() != meta.dtype {
        g.to_dtype(meta.dtype)?
    } else {
        g
    };
    check_gradient(&g, &meta.shape, meta.dtype, "a leaf")?;
    match sink {
        Sink::Accumulate => {
            let mut slot = meta.grad();
            *slot = Some(match slot.take() {
                Some(earlier) => earlier.add(&g)?,
                None => g,
            });
        }
        Sink::Capture(ts) => {
            for (k, t) in ts.iter().enumerate() {
                let is_it = super::graph::meta(t)
                    .is_some_and(|m| m.grad_fn.is_none() && std::ptr::eq(m, meta));
                if is_it {
                    captured[k] = Some(match captured[k].take() {
                        Some(earlier) => earlier.add(&g)?,
                        None => g.clone(),
                    });
                }
            }
        }
    }
    Ok(())
}

/// An `Err` unless `g` has `shape` (a backward rule that broke its contract, or a gradient
/// passed in of the wrong shape).
fn check_gradient(
    g: &Tensor,
    shape: &[usize],
    dtype: crate::dtype::DType,
    what: &str,
) -> Result<()> {
    if g.shape() != shape {
        return Err(Error::Shape(format!(
            "{what}: a gradient of shape {:?} for a {dtype} tensor of shape {shape:?}",
            g.shape()
        )));
    }
    Ok(())
}

impl AutogradMeta {
    /// The shape a gradient of `t` (whose meta this is) must have.
    fn shape_of(&self, t: &Tensor) -> Vec<usize> {
        match self.grad_fn {
            Some(_) => t.shape().to_vec(),
            None => self.shape.clone(),
        }
    }
}
