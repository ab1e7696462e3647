//! The kernel cache both GPU backends use: compiled kernels by the structure of what they
//! compute. A lookup hashes a signature that may borrow the launch's expression tree and
//! compares it in place, so a hit copies nothing; the owned form is made only when a kernel is
//! compiled. The hash is `rustc-hash`'s FxHash: it runs on every launch, and SipHash's
//! resistance to chosen collisions buys nothing here.
//!
//! ```
//! use strata_core::kernel_cache::KernelCache;
//! let cache: KernelCache<(u8, u32), &str> = KernelCache::default();
//! assert_eq!(cache.get(&(1u8, 7u32), |_| Ok("compiled")).unwrap(), "compiled");
//! assert_eq!(cache.get(&(1u8, 7u32), |_| Ok("again")).unwrap(), "compiled");
//! assert_eq!(cache.len(), 1);
//! ```

use crate::error::Result;
use crate::sync::LockUnpoisoned;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

/// A kernel signature as the cache sees it: looked up by reference, stored owned only when a
/// kernel is compiled. Types that own their data are their own stored form.
///
/// ```
/// use strata_core::kernel_cache::Signature;
/// assert!((3u8, true).matches(&(3u8, true)));
/// ```
pub trait Signature: Hash {
    /// The form kept in the cache.
    type Stored: Send;
    /// True when `stored` is this signature.
    fn matches(&self, stored: &Self::Stored) -> bool;
    /// The owned copy to keep.
    fn store(&self) -> Self::Stored;
}

impl<T: Hash + Eq + Clone + Send + Owned> Signature for T {
    type Stored = T;
    fn matches(&self, stored: &T) -> bool {
        self == stored
    }
    fn store(&self) -> T {
        self.clone()
    }
}

/// Marks signatures that own their data (no borrowed tree), so they are their own stored
/// form: implement it (it has no items) for a signature type of plain data.
///
/// ```
/// use strata_core::kernel_cache::{Owned, Signature};
/// #[derive(Hash, PartialEq, Eq, Clone)]
/// struct Sig(u32);
/// impl Owned for Sig {}
/// assert!(Sig(1).matches(&Sig(1)));
/// ```
pub trait Owned {}

macro_rules! owned {
    ($($t:ty),*) => {$( impl Owned for $t {} )*};
}
owned!(
    u8,
    u16,
    u32,
    u64,
    usize,
    bool,
    crate::dtype::DType,
    crate::ir::ReduceOp,
    crate::ir::IndexKind
);
impl<A: Owned, B: Owned> Owned for (A, B) {}
impl<A: Owned, B: Owned, C: Owned> Owned for (A, B, C) {}

/// Implements [`Signature`] for a signature struct `Name<'e>` whose field `trees` borrows a
/// map's trees ([`MapTrees`](crate::ir::MapTrees)) and whose other fields, listed, own their
/// data: a lookup compares it in place, and the stored form owns the trees.
///
/// ```
/// use strata_core::{ir::{Expr, MapTrees}, kernel_cache::KernelCache, DType};
/// #[derive(Debug, Clone, PartialEq, Eq, Hash)]
/// struct Sig<'e> { trees: MapTrees<'e>, rank: usize }
/// strata_core::signature_with_trees!(Sig { rank });
/// let e = Expr::input(0, DType::F32);
/// let cache: KernelCache<Sig<'static>, u32> = KernelCache::default();
/// let sig = Sig { trees: MapTrees::borrowed(&e, &[]), rank: 1 };
/// assert_eq!(cache.get(&sig, |_| Ok(7)).unwrap(), 7);
/// assert_eq!(cache.peek(&sig), Some(7));
/// ```
#[macro_export]
macro_rules! signature_with_trees {
    ($name:ident { $($field:ident),* $(,)? }) => {
        impl<'e> $crate::kernel_cache::Signature for $name<'e> {
            type Stored = $name<'static>;
            fn matches(&self, stored: &$name<'static>) -> bool {
                self == stored
            }
            fn store(&self) -> $name<'static> {
                $name {
                    trees: self.trees.to_owned(),
                    $($field: self.$field.clone(),)*
                }
            }
        }
    };
}

/// The hash of a signature (FxHash over its words).
///
/// ```
/// use strata_core::kernel_cache::structure_hash;
/// assert_eq!(structure_hash(&(1u32, 2u8)), structure_hash(&(1u32, 2u8)));
/// assert_ne!(structure_hash(&1u32), structure_hash(&2u32));
/// ```
pub fn structure_hash(key: &impl Hash) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    key.hash(&mut h);
    h.finish()
}

/// Compiled kernels `V` by stored signature `S` (see the module docs), per device.
pub struct KernelCache<S, V> {
    map: Mutex<HashMap<u64, Vec<(S, V)>>>,
}

impl<S, V> Default for KernelCache<S, V> {
    fn default() -> Self {
        KernelCache {
            map: Mutex::new(HashMap::new()),
        }
    }
}

impl<S, V: Clone> KernelCache<S, V> {
    /// The kernel for `key`, built with `build` on a miss (outside the lock, so a slow
    /// compile does not hold up other lookups).
    pub fn get<K: Signature<Stored = S>>(
        &self,
        key: &K,
        build: impl FnOnce(&K) -> Result<V>,
    ) -> Result<V> {
        if let Some(v) = self.peek(key) {
            return Ok(v);
        }
        let v = build(key)?;
        self.lock()
            .entry(structure_hash(key))
            .or_default()
            .push((key.store(), v.clone()));
        Ok(v)
    }

    /// The kernel for `key` if it is cached (nothing is built).
    ///
    /// ```
    /// use strata_core::kernel_cache::KernelCache;
    /// let cache: KernelCache<(u8, u32), &str> = KernelCache::default();
    /// assert_eq!(cache.peek(&(1u8, 7u32)), None);
    /// cache.get(&(1u8, 7u32), |_| Ok("compiled")).unwrap();
    /// assert_eq!(cache.peek(&(1u8, 7u32)), Some("compiled"));
    /// ```
    pub fn peek<K: Signature<Stored = S>>(&self, key: &K) -> Option<V> {
        self.lock()
            .get(&structure_hash(key))
            .and_then(|list| list.iter().find(|(k, _)| key.matches(k)))
            .map(|(_, v)| v.clone())
    }

    /// How many kernels are cached.
    pub fn len(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Vec<(S, V)>>> {
        // A poisoned lock only means a panic elsewhere; the map is still consistent.
        self.map.lock_unpoisoned()
    }
}
