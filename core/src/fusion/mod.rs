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
//! (realizing one tensor, or flushing a device), `siblings` (at a flush, trees over the same
//! elements that share an input or intermediate run in one kernel), `reduce` (reductions that read a pending
//! tree, and maxima kept pending for a later reduction of the same rows), and `preview`
//! (what would run, for `explain`, without running anything). Every decision about what is
//! deferred and what one kernel holds is made here, from the backend's
//! [`Target`](crate::target::Target). The state it leaves on a storage (the pending
//! work, what a fused kernel ran) is data beside `Storage` in `tensor.rs`, which it
//! references.
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
pub(crate) mod siblings;
pub(crate) mod splice;

pub(crate) use record::{defer_or_launch, place, tree_as_map};

pub use splice::MAX_NODES;

use crate::error::Result;
use crate::tensor::Tensor;

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
