//! The name work is recorded under while a backward function runs: its node's
//! (`MulBackward`), so the profiler and `explain` tell backward work from the user's ops.
//! A leaf below both fusion and the profiler, which read it, and autograd's engine, which
//! sets it.

use std::cell::Cell;

thread_local! {
    /// The backward node whose function runs on this thread, if one does.
    static BACKWARD_OF: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// The name work is recorded under: the backward node's while its function runs, else `op`.
pub(crate) fn op_name(op: &'static str) -> &'static str {
    BACKWARD_OF.with(Cell::get).unwrap_or(op)
}

/// The backward node whose function runs on this thread, if one does.
pub(crate) fn running_backward() -> Option<&'static str> {
    BACKWARD_OF.with(Cell::get)
}

/// Names the work of a backward function after its node until dropped.
pub(crate) struct BackwardScope {
    before: Option<&'static str>,
}

impl BackwardScope {
    /// Work recorded from now on is named `name`.
    pub(crate) fn enter(name: &'static str) -> BackwardScope {
        BackwardScope {
            before: BACKWARD_OF.with(|b| b.replace(Some(name))),
        }
    }
}

impl Drop for BackwardScope {
    fn drop(&mut self) {
        BACKWARD_OF.with(|b| b.set(self.before));
    }
}
