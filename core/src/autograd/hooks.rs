//! Hooks on leaves that run once a backward pass has finished accumulating into them
//! (PyTorch's `register_post_accumulate_grad_hook`): the pass counts the edges that reach
//! each hooked leaf and calls its hooks after the last one, with the accumulated gradient,
//! while the rest of the pass goes on. Data parallel uses them to start averaging a bucket
//! of gradients before the backward pass has ended.

use super::graph::{self, AutogradMeta, Hook};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// Removes a hook registered with [`Tensor::register_post_accumulate_grad_hook`]
/// (PyTorch's `RemovableHandle`). Dropping the handle keeps the hook.
#[derive(Debug)]
pub struct HookHandle {
    leaf: Weak<AutogradMeta>,
    id: u64,
}

impl HookHandle {
    /// Removes the hook (nothing happens if the leaf is gone or the hook was removed).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let w = Tensor::ones([2], DType::F32, &Device::cpu())?.requires_grad_(true)?;
    /// let handle = w.register_post_accumulate_grad_hook(|_| Ok(()))?;
    /// handle.remove();
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn remove(self) {
        if let Some(leaf) = self.leaf.upgrade() {
            leaf.hooks().retain(|(id, _)| *id != self.id);
        }
    }
}

impl Tensor {
    /// Registers `hook` to run in each backward pass once every gradient reaching this leaf
    /// has been accumulated into [`grad`](Tensor::grad) (PyTorch's
    /// `register_post_accumulate_grad_hook`): it gets the accumulated gradient, runs on the
    /// thread of the pass while later nodes are still to run, and an `Err` it returns ends the
    /// pass. Not called by `autograd::grad` (it accumulates nothing) nor in a pass that
    /// gives the leaf no gradient. `Err` unless this is a leaf that requires a gradient. A
    /// hook that holds the leaf itself keeps it alive until the hook is removed.
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use strata_core::{ops::Axes, Device, DType, Tensor};
    /// let w = Tensor::ones([2], DType::F32, &Device::cpu())?.requires_grad_(true)?;
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let log = seen.clone();
    /// let _handle = w.register_post_accumulate_grad_hook(move |g| {
    ///     log.lock().unwrap().push(g.to_vec::<f32>()?);
    ///     Ok(())
    /// })?;
    /// // w is used twice: the hook runs once, after both contributions.
    /// (&w * 2.0)?.add(&(&w * 3.0)?)?.sum(Axes::All, false)?.backward()?;
    /// assert_eq!(*seen.lock().unwrap(), vec![vec![5.0, 5.0]]);
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn register_post_accumulate_grad_hook(
        &self,
        hook: impl Fn(&Tensor) -> Result<()> + Send + Sync + 'static,
    ) -> Result<HookHandle> {
        let leaf = graph::meta_arc(self)
            .filter(|m| m.grad_fn.is_none())
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "register_post_accumulate_grad_hook on a {} tensor of shape {:?} that is \
                     not a leaf requiring a gradient",
                    self.dtype(),
                    self.shape()
                ))
            })?;
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        leaf.hooks().push((id, Arc::new(hook)));
        Ok(HookHandle {
            leaf: Arc::downgrade(&leaf),
            id,
        })
    }
}

/// Runs `leaf`'s hooks, each with the leaf's gradient as it is then (an earlier hook may have
/// replaced it with `set_grad`, as PyTorch's later hooks see the parameter's new `.grad`).
pub(crate) fn run(leaf: &AutogradMeta) -> Result<()> {
    // Copied out first: a hook may read or set this leaf's gradient or hooks.
    let hooks: Vec<Hook> = leaf.hooks().iter().map(|(_, h)| h.clone()).collect();
    for h in hooks {
        let Some(grad) = leaf.grad().clone() else {
            return Ok(());
        };
        h(&grad)?;
    }
    Ok(())
}

/// True when `leaf` has hooks (the pass counts the edges into those leaves only).
pub(crate) fn any(leaf: &AutogradMeta) -> bool {
    !leaf.hooks().is_empty()
}
