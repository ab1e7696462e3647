//! The backward graph, as results keep it. A tensor that requires a gradient holds an
//! [`AutogradMeta`]: a leaf's accumulated gradient, or the [`Node`] of the op that computed
//! it. A node holds its op's name, one [`Edge`] per input (where that input's gradient goes)
//! and its backward function, which owns what the op saved. Nothing is global: a graph nobody
//! references is freed with its last tensor, and saved tensors are detached (they hold no
//! node), so no cycle keeps a graph alive.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::sync::LockUnpoisoned;
use crate::tensor::Tensor;
use std::sync::{Arc, Mutex, MutexGuard};

/// What a tensor that requires a gradient carries.
pub(crate) struct AutogradMeta {
    /// The node of the op that computed the tensor; `None` for a leaf.
    pub(crate) grad_fn: Option<Arc<Node>>,
    /// A leaf's accumulated gradient.
    grad: Mutex<Option<Tensor>>,
    /// The leaf's shape and dtype, which its gradient must have.
    pub(crate) shape: Vec<usize>,
    pub(crate) dtype: DType,
    /// A leaf's post-accumulate hooks ([`super::hooks`]), with their ids.
    hooks: Mutex<Vec<(u64, Hook)>>,
}

/// A post-accumulate hook: called with the leaf's gradient after a backward pass's last
/// contribution to it.
pub(crate) type Hook = Arc<dyn Fn(&Tensor) -> Result<()> + Send + Sync>;

/// `t`'s autograd metadata, if it requires a gradient.
pub(crate) fn meta(t: &Tensor) -> Option<&AutogradMeta> {
    t.autograd.as_ref()?.downcast_ref()
}

/// `t`'s autograd metadata, shared, if it requires a gradient.
pub(crate) fn meta_arc(t: &Tensor) -> Option<Arc<AutogradMeta>> {
    t.autograd.clone()?.downcast().ok()
}

impl AutogradMeta {
    /// A leaf of `shape` and `dtype` with no gradient yet.
    pub(crate) fn leaf(shape: &[usize], dtype: DType) -> AutogradMeta {
        AutogradMeta {
            grad_fn: None,
            grad: Mutex::new(None),
            shape: shape.to_vec(),
            dtype,
            hooks: Mutex::new(Vec::new()),
        }
    }

    /// The result of the op `node` records, of `shape` and `dtype`.
    pub(crate) fn computed(node: Node, shape: &[usize], dtype: DType) -> AutogradMeta {
        AutogradMeta {
            grad_fn: Some(Arc::new(node)),
            ..AutogradMeta::leaf(shape, dtype)
        }
    }

    /// The leaf's hooks, with their ids.
    pub(crate) fn hooks(&self) -> MutexGuard<'_, Vec<(u64, Hook)>> {
        self.hooks.lock_unpoisoned()
    }

    /// The leaf's gradient slot.
    pub(crate) fn grad(&self) -> MutexGuard<'_, Option<Tensor>> {
        // A poisoned lock only means a panic elsewhere; the slot holds a whole value.
        self.grad.lock_unpoisoned()
    }
}

/// Where one input's gradient goes.
pub(crate) enum Edge {
    /// The input needs no gradient.
    None,
    /// A leaf that requires one: it is accumulated there.
    Leaf(Arc<AutogradMeta>),
    /// The node of the op that computed the input.
    Node(Arc<Node>),
}

impl Edge {
    /// The edge to `t`'s gradient.
    pub(crate) fn of(t: &Tensor) -> Edge {
        match meta_arc(t) {
            None => Edge::None,
            Some(meta) => match &meta.grad_fn {
                Some(node) => Edge::Node(node.clone()),
                None => Edge::Leaf(meta),
            },
        }
    }
}

/// A backward function: the gradient of the op's output in, one gradient per input out
/// (`None` where an input gets none). It runs with grad mode off.
pub(crate) type BackwardFn = Box<dyn Fn(&Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync>;

/// One recorded op.
pub(crate) struct Node {
    /// `MulBackward`, `SumBackward`, …: what `grad_fn()` says.
    pub(crate) name: &'static str,
    /// Per input of the op, in order.
    pub(crate) edges: Vec<Edge>,
    /// `None` once freed (after a backward pass without `retain_graph`).
    backward: Mutex<Option<BackwardFn>>,
    /// The output's shape and dtype, which its gradient must have.
    pub(crate) shape: Vec<usize>,
    pub(crate) dtype: DType,
    /// The shapes and dtypes of what the backward function saved (for the graph picture).
    pub(crate) saved: Vec<(Vec<usize>, DType)>,
    /// The fused kernel that computed the output, once one has (shared with the output's
    /// storage, so the graph picture knows it after the storage is freed).
    pub(crate) computed_in: Arc<std::sync::OnceLock<u64>>,
}

impl Node {
    /// A node for an op whose output is `output`, over `inputs`.
    pub(crate) fn new(
        name: &'static str,
        inputs: &[&Tensor],
        output: &Tensor,
        saved: Vec<(Vec<usize>, DType)>,
        backward: BackwardFn,
    ) -> Node {
        Node {
            name,
            edges: inputs.iter().map(|t| Edge::of(t)).collect(),
            backward: Mutex::new(Some(backward)),
            shape: output.shape().to_vec(),
            dtype: output.dtype(),
            saved,
            computed_in: output.storage.computed_in.clone(),
        }
    }

    /// Runs the backward function on `grad`; frees it afterwards unless `retain`.
    pub(crate) fn apply(&self, grad: &Tensor, retain: bool) -> Result<Vec<Option<Tensor>>> {
        let mut slot = self.backward.lock_unpoisoned();
        let grads = match slot.as_ref() {
            Some(f) => f(grad)?,
            None => {
                return Err(Error::Invalid(format!(
                    "backward through {} a second time: its saved tensors were freed after the \
                     first backward pass; pass retain_graph = true (autograd::backward) to \
                     backward through a graph twice",
                    self.name
                )))
            }
        };
        if !retain {
            *slot = None;
        }
        if grads.len() != self.edges.len() {
            return Err(Error::Backend(format!(
                "internal error: {} returned {} gradients for {} inputs",
                self.name,
                grads.len(),
                self.edges.len()
            )));
        }
        Ok(grads)
    }

    /// True while the backward function (and what it saved) is held.
    pub(crate) fn is_retained(&self) -> bool {
        self.backward.lock_unpoisoned().is_some()
    }
}

/// A graph is a chain as long as the program that built it: dropping it node by node from
/// a stack, rather than each node dropping the next, keeps a chain of any length from
/// overflowing the thread's stack.
impl Drop for Node {
    fn drop(&mut self) {
        let mut stack: Vec<Arc<Node>> = Vec::new();
        take_nodes(&mut self.edges, &mut stack);
        while let Some(node) = stack.pop() {
            if let Ok(mut last) = Arc::try_unwrap(node) {
                take_nodes(&mut last.edges, &mut stack);
            }
        }
    }
}

/// Moves the nodes `edges` hold onto `stack`.
fn take_nodes(edges: &mut Vec<Edge>, stack: &mut Vec<Arc<Node>>) {
    for edge in edges.drain(..) {
        if let Edge::Node(n) = edge {
            stack.push(n);
        }
    }
}

/// A tensor an op saved for its backward function: detached, with the version of its
/// storage when saved, so that an in-place write since is caught instead of silently giving
/// a wrong gradient.
pub(crate) struct Saved {
    tensor: Tensor,
    version: u64,
    /// The op that saved it, for the error.
    op: &'static str,
}

impl Saved {
    /// Saves `t` for `op`'s backward function.
    pub(crate) fn new(t: &Tensor, op: &'static str) -> Saved {
        Saved {
            tensor: t.detach(),
            version: t.storage.version(),
            op,
        }
    }

    /// The saved tensor, or an `Err` if its storage was written since it was saved.
    pub(crate) fn get(&self) -> Result<&Tensor> {
        let now = self.tensor.storage.version();
        if now != self.version {
            return Err(Error::Invalid(format!(
                "one of the tensors needed for gradient computation has been modified by an \
                 in-place operation: the {} tensor of shape {:?} that {} saved is at version \
                 {now}; expected version {} instead. Write into a copy (t.copy()) instead, or \
                 make the write before the op that reads it",
                self.tensor.dtype(),
                self.tensor.shape(),
                self.op,
                self.version
            )));
        }
        Ok(&self.tensor)
    }

    /// The saved tensor's shape and dtype (for the graph picture).
    pub(crate) fn describe(&self) -> (Vec<usize>, DType) {
        (self.tensor.shape().to_vec(), self.tensor.dtype())
    }
}
