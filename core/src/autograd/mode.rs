//! Grad mode: whether ops on this thread record gradients. Off inside [`no_grad`] (and a
//! [`NoGradGuard`]'s scope) and while a backward pass runs.

use std::cell::Cell;

thread_local! {
    /// Grad mode of this thread: off inside [`no_grad`] and during a backward pass.
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// True when ops on this thread record gradients (outside [`no_grad`]).
///
/// ```
/// assert!(strata_core::autograd::is_grad_enabled());
/// strata_core::autograd::no_grad(|| assert!(!strata_core::autograd::is_grad_enabled()));
/// ```
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(Cell::get)
}

/// Runs `f` with grad mode off (PyTorch's `torch.no_grad()`): its ops record no graph, and
/// may write in place into leaves that require a gradient (an optimizer's update).
///
/// ```
/// use strata_core::{autograd::no_grad, Device, DType, Tensor};
/// let w = Tensor::ones([2], DType::F32, &Device::cpu())?.requires_grad_(true)?;
/// let y = no_grad(|| w.mul(2.0))?;
/// assert!(!y.requires_grad());
/// # Ok::<(), strata_core::Error>(())
/// ```
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    let _off = NoGradGuard::new();
    f()
}

/// Grad mode off until the guard is dropped (a scope's worth of [`no_grad`]).
///
/// ```
/// use strata_core::autograd::{is_grad_enabled, NoGradGuard};
/// {
///     let _g = NoGradGuard::new();
///     assert!(!is_grad_enabled());
/// }
/// assert!(is_grad_enabled());
/// ```
pub struct NoGradGuard {
    before: bool,
}

impl NoGradGuard {
    /// Turns grad mode off on this thread.
    pub fn new() -> NoGradGuard {
        NoGradGuard {
            before: GRAD_ENABLED.with(|g| g.replace(false)),
        }
    }
}

impl Default for NoGradGuard {
    fn default() -> Self {
        NoGradGuard::new()
    }
}

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|g| g.set(self.before));
    }
}
