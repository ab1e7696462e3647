//! Lazy fusion: an elementwise op checks its operands at the call, then records its expression
//! instead of launching it. The result is a *pending* tensor whose storage has no buffer yet;
//! chains of pending tensors grow one expression tree, and the first use that needs the values
//! (a host read, a non-elementwise op, a write into a buffer the tree reads, an event, a
//! synchronize, [`Tensor::realize`], [`Device::flush`](crate::Device::flush)) runs the whole
//! tree as one `Map` kernel. Each node keeps its own dtype and rounding, so fused results equal
//! eager ones.
//!
//! The parts: `record` (an op becomes pending work, or runs now where the device does not
//! defer), `splice` (a kernel's tree assembled from the pending trees it reads), `run`
//! (realizing one tensor, or flushing a device), `reduce` (reductions that read a pending
//! tree, and maxima kept pending for a later reduction of the same rows), and `preview`
//! (what would run, for `explain`, without running anything). Every decision about what is
//! deferred and what one kernel holds is made here, from the backend's
//! [`Target`](crate::lower::target::Target).
//!
//! ```
//! use strata_core::{Device, DType, Tensor};
//! let dev = Device::cpu();
//! let a = Tensor::arange(0, 4, 1, DType::F32, &dev)?;
//! let y = (&a * 2.0)?.add(1.0)?.relu()?; // three ops, nothing has run yet
//! assert!(y.is_pending() || !dev.fusion());
//! assert_eq!(y.to_vec::<f32>()?, vec![1.0, 3.0, 5.0, 7.0]); // one kernel ran
//! assert!(!y.is_pending());
//! # Ok::<(), strata_core::Error>(())
//! ```

pub(crate) mod preview;
pub(crate) mod record;
pub(crate) mod reduce;
pub(crate) mod run;
pub(crate) mod splice;

pub(crate) use record::defer_or_launch;
pub(crate) use run::{flush, realize, RunRecord};

use crate::device::{Device, StreamHandle};
use crate::dtype::{DType, Scalar};
use crate::error::Result;
use crate::ir::Expr;
use crate::layout::Layout;
use crate::tensor::Tensor;
use reduce::DeferredReduce;
use std::panic::Location;
use std::sync::Arc;

/// The most expression nodes one fused kernel holds. Past it, the inputs are run first, so
/// every tree (and every walk of one) stays small however long a chain is.
pub const MAX_NODES: usize = 192;

/// Deferred work that fills a pending storage, with what every kind of it shares: the result's
/// layout and dtype, the stream it runs on, and the user op that made it.
pub(crate) struct Pending {
    /// What runs.
    pub(crate) work: PendingWork,
    /// The layout the result is written with (dense, offset 0).
    pub(crate) layout: Layout,
    /// The result's dtype.
    pub(crate) dtype: DType,
    /// The stream the op was issued on: the kernel runs there.
    pub(crate) stream: Arc<StreamHandle>,
    /// The user op that made it (`add`, `relu`, ...), for `explain` and the profiler.
    pub(crate) op: &'static str,
    /// Where the user called it (ops carry `#[track_caller]` down to `record`).
    pub(crate) call_site: &'static Location<'static>,
}

/// The two kinds of deferred work.
pub(crate) enum PendingWork {
    /// An elementwise tree: spliced into the trees that read it, run as one map kernel.
    Tree(Tree),
    /// A reduction (a maximum or minimum): it never splices into a tree; it runs when read,
    /// or inside the kernel of a later reduction that reads it
    /// ([`reduce::row_prologue_of`]).
    Reduce(DeferredReduce),
}

/// An elementwise tree waiting to run.
pub(crate) struct Tree {
    /// The value of each element, over `inputs` and `scalars`.
    pub(crate) expr: Expr,
    /// Views the expression reads, with the result's shape (realized or pending).
    pub(crate) inputs: Vec<Tensor>,
    /// Launch scalars.
    pub(crate) scalars: Vec<Scalar>,
    /// Expression nodes of the whole tree this node would fuse (an upper bound).
    pub(crate) nodes: usize,
    /// The distinct tensor inputs of that tree, as the kernel would bind them (a chain that
    /// reads one tensor at every step binds it once, so it grows until `MAX_NODES`); `None`:
    /// no input is spliced in, so they are `inputs` themselves.
    pub(crate) leaves: Option<splice::Leaves>,
}

impl Pending {
    /// The tree, unless this is a deferred reduction.
    pub(crate) fn tree(&self) -> Option<&Tree> {
        match &self.work {
            PendingWork::Tree(t) => Some(t),
            PendingWork::Reduce(_) => None,
        }
    }
}

/// True when `device` defers elementwise ops: fusion on and blocking mode off.
pub(crate) fn defers(device: &Device) -> bool {
    device.fusion() && !device.blocking()
}

impl Tensor {
    /// True while this tensor's value is deferred work that has not run (lazy fusion).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let a = Tensor::ones([3], DType::F32, &dev)?;
    /// assert!(!a.is_pending()); // creation runs at once
    /// let b = a.exp()?;
    /// assert_eq!(b.is_pending(), dev.fusion());
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn is_pending(&self) -> bool {
        self.storage.is_pending()
    }

    /// Runs this tensor's deferred work now (one kernel for the whole pending tree behind
    /// it); does nothing for a tensor that has run. Like every launch it is asynchronous.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let b = Tensor::ones([3], DType::F32, &dev)?.mul(3.0)?;
    /// b.realize()?;
    /// assert!(!b.is_pending());
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn realize(&self) -> Result<()> {
        self.storage.realized_buffer().map(|_| ())
    }
}
