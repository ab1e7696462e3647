//! Locks that outlive a panic. strata's locks guard caches, pools and queues whose every
//! update leaves them whole, so a lock poisoned by a panic elsewhere (a notebook cell that
//! panicked mid-call, say) is taken as it is rather than turning every later call into a
//! panic: the one place that decision is made.

use std::sync::{Mutex, MutexGuard};

/// [`Mutex::lock`], ignoring poisoning (see the module's note).
///
/// ```
/// use strata_core::sync::LockUnpoisoned;
/// let m = std::sync::Arc::new(std::sync::Mutex::new(1));
/// let m2 = m.clone();
/// let _ = std::thread::spawn(move || {
///     let _g = m2.lock().unwrap();
///     panic!("poisons the lock");
/// })
/// .join();
/// assert!(m.lock().is_err());
/// assert_eq!(*m.lock_unpoisoned(), 1);
/// ```
pub trait LockUnpoisoned<T> {
    /// The guard, whether or not a panic poisoned the lock.
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T>;
}

impl<T> LockUnpoisoned<T> for Mutex<T> {
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|p| p.into_inner())
    }
}
