//! Host memory blocks for the CPU backend: a caching allocator with size classes. Freed blocks
//! wait in a cache for the next allocation of their class (no system call, no zeroing), up to
//! a limit; `empty_cache` returns them to the system.

use crate::backend::{DeviceBuffer, ForeignOwner, MemoryStats};
use crate::error::{Error, Result};
use crate::sync::LockUnpoisoned;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::any::Any;
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Alignment of every block: enough for any dtype and for vector loads.
const ALIGN: usize = 64;
/// The cache keeps at most this many bytes of free blocks.
const CACHE_LIMIT: usize = 1 << 30;

/// The size class of a request: powers of two up to 1 MiB, then multiples of 1 MiB.
fn size_class(len: usize) -> usize {
    const MIB: usize = 1 << 20;
    if len <= MIB {
        len.max(ALIGN).next_power_of_two()
    } else {
        len.div_ceil(MIB).saturating_mul(MIB)
    }
}

/// A raw block owned by the pool's cache.
struct Block(NonNull<u8>);
// SAFETY: a block is plain memory that no one else references while cached.
unsafe impl Send for Block {}

/// Allocation state shared by a CPU device and its buffers.
#[derive(Default)]
pub(crate) struct Pool {
    allocated: AtomicUsize,
    reserved: AtomicUsize,
    peak: AtomicUsize,
    cache: Mutex<HashMap<usize, Vec<Block>>>,
    /// Free page-locked blocks of a pinned host device by size class: their addresses and
    /// what frees them (allocating page-locked memory costs a driver call and page faults).
    pinned: Mutex<HashMap<usize, Vec<(Block, ForeignOwner)>>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pool({:?})", self.stats())
    }
}

impl Pool {
    pub(crate) fn stats(&self) -> MemoryStats {
        MemoryStats {
            allocated: self.allocated.load(Ordering::Relaxed),
            reserved: self.reserved.load(Ordering::Relaxed),
            peak: self.peak.load(Ordering::Relaxed),
        }
    }

    fn layout(class: usize) -> Result<Layout> {
        Layout::from_size_align(class, ALIGN).map_err(|_| Error::out_of_memory(class, 0))
    }

    fn cached_bytes(cache: &HashMap<usize, Vec<Block>>) -> usize {
        cache.iter().map(|(class, v)| class * v.len()).sum()
    }

    /// A page-locked block of `class` bytes: a cached one, else a fresh (zeroed) one from
    /// `allocate`.
    fn take_pinned(
        &self,
        class: usize,
        allocate: impl FnOnce(usize) -> Result<(u64, ForeignOwner)>,
    ) -> Result<(NonNull<u8>, ForeignOwner)> {
        let cached = self
            .pinned
            .lock_unpoisoned()
            .get_mut(&class)
            .and_then(Vec::pop);
        if let Some((block, owner)) = cached {
            return Ok((block.0, owner));
        }
        let (address, owner) = allocate(class)?;
        let ptr = NonNull::new(address as usize as *mut u8)
            .ok_or_else(|| Error::Invalid(format!("a null pinned block of {class} bytes")))?;
        // SAFETY: the allocator handed out `class` writable bytes at `ptr`, used by no one
        // yet. Zeroed, so no read of an `empty` tensor sees uninitialized bytes.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, class) };
        self.reserved.fetch_add(class, Ordering::Relaxed);
        Ok((ptr, owner))
    }

    /// Keeps a free page-locked block for the next request of its class, or frees it past
    /// the cache limit.
    fn give_back_pinned(&self, class: usize, block: (Block, ForeignOwner)) {
        let mut cache = self.pinned.lock_unpoisoned();
        let cached: usize = cache.iter().map(|(c, v)| c * v.len()).sum();
        if cached + class <= CACHE_LIMIT {
            cache.entry(class).or_default().push(block);
            return;
        }
        drop(cache);
        drop(block);
        self.reserved.fetch_sub(class, Ordering::Relaxed);
    }

    /// Returns every cached block to the system.
    pub(crate) fn empty_cache(&self) {
        let pinned: Vec<_> = self.pinned.lock_unpoisoned().drain().collect();
        for (class, blocks) in pinned {
            self.reserved
                .fetch_sub(class * blocks.len(), Ordering::Relaxed);
        }
        let mut cache = self.cache.lock_unpoisoned();
        for (class, blocks) in cache.drain() {
            for b in blocks {
                // SAFETY: allocated with this class's layout, which was valid then.
                unsafe { dealloc(b.0.as_ptr(), Self::layout(class).expect("valid class")) };
                self.reserved.fetch_sub(class, Ordering::Relaxed);
            }
        }
    }

    fn take(&self, class: usize) -> Result<NonNull<u8>> {
        let cached = self
            .cache
            .lock_unpoisoned()
            .get_mut(&class)
            .and_then(Vec::pop);
        if let Some(b) = cached {
            return Ok(b.0);
        }
        let layout = Self::layout(class)?;
        // SAFETY: the layout has a non-zero size. Fresh memory is zeroed so that no read of
        // an `empty` tensor ever sees uninitialized bytes.
        let fresh = NonNull::new(unsafe { alloc_zeroed(layout) });
        let ptr = match fresh {
            Some(p) => p,
            None => {
                // Out of memory: give the cache back and try once more.
                self.empty_cache();
                NonNull::new(unsafe { alloc_zeroed(layout) })
                    .ok_or(Error::out_of_memory(class, 0))?
            }
        };
        self.reserved.fetch_add(class, Ordering::Relaxed);
        Ok(ptr)
    }

    fn give_back(&self, class: usize, ptr: NonNull<u8>) {
        let mut cache = self.cache.lock_unpoisoned();
        if Self::cached_bytes(&cache) + class <= CACHE_LIMIT {
            cache.entry(class).or_default().push(Block(ptr));
            return;
        }
        drop(cache);
        // SAFETY: allocated in `take` with this class's layout.
        unsafe { dealloc(ptr.as_ptr(), Self::layout(class).expect("valid class")) };
        self.reserved.fetch_sub(class, Ordering::Relaxed);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.empty_cache();
    }
}

/// One 64-byte-aligned block of host memory, taken from and returned to its device's cache.
///
/// ```
/// use strata_core::{cpu::CpuBuffer, Device, StreamId};
/// let dev = Device::cpu();
/// let buf = dev.backend().allocate(100, StreamId::DEFAULT).unwrap();
/// assert!(buf.as_any().downcast_ref::<CpuBuffer>().is_some());
/// assert!(dev.memory_stats().reserved >= 100);
/// ```
pub struct CpuBuffer {
    ptr: NonNull<u8>,
    len: usize,
    home: Home,
}

/// Where a buffer's memory goes back to.
enum Home {
    /// A block of `class` bytes from the backend's pool.
    Pool { class: usize, pool: Arc<Pool> },
    /// Memory another library lent (a DLPack import): dropping the owner returns it.
    Foreign(#[allow(dead_code)] ForeignOwner),
    /// A page-locked block of `class` bytes a GPU backend allocated (`owner` frees it),
    /// returned to `pool`'s pinned cache.
    Pinned {
        class: usize,
        owner: Option<ForeignOwner>,
        pool: Arc<Pool>,
    },
}

impl std::fmt::Debug for CpuBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let whose = match self.home {
            Home::Pool { .. } => "",
            Home::Foreign(_) => ", foreign",
            Home::Pinned { .. } => ", pinned",
        };
        write!(f, "CpuBuffer({} bytes at {:p}{whose})", self.len, self.ptr)
    }
}

// SAFETY: the block is plain memory; the backend orders accesses (writes of one kernel go to
// disjoint elements, and kernels run one after another).
unsafe impl Send for CpuBuffer {}
unsafe impl Sync for CpuBuffer {}

impl CpuBuffer {
    pub(crate) fn new(len: usize, pool: Arc<Pool>) -> Result<CpuBuffer> {
        let class = size_class(len);
        let ptr = pool.take(class)?;
        let now = pool.allocated.fetch_add(class, Ordering::Relaxed) + class;
        pool.peak.fetch_max(now, Ordering::Relaxed);
        Ok(CpuBuffer {
            ptr,
            len,
            home: Home::Pool { class, pool },
        })
    }

    /// A buffer over `len` bytes at `address` that `owner` keeps alive (a DLPack import).
    pub(crate) fn foreign(address: u64, len: usize, owner: ForeignOwner) -> Result<CpuBuffer> {
        // An empty import may carry a null pointer: any non-null dangling one serves.
        let ptr = NonNull::new(address as usize as *mut u8)
            .or(if len == 0 {
                Some(NonNull::dangling())
            } else {
                None
            })
            .ok_or_else(|| Error::Invalid(format!("a null data pointer for {len} bytes")))?;
        Ok(CpuBuffer {
            ptr,
            len,
            home: Home::Foreign(owner),
        })
    }

    /// A buffer of `len` bytes of page-locked memory from `pool`'s pinned cache, or from
    /// `allocate` (a GPU backend's `allocate_pinned`).
    pub(crate) fn pinned(
        len: usize,
        pool: Arc<Pool>,
        allocate: impl FnOnce(usize) -> Result<(u64, ForeignOwner)>,
    ) -> Result<CpuBuffer> {
        let class = size_class(len);
        let (ptr, owner) = pool.take_pinned(class, allocate)?;
        let now = pool.allocated.fetch_add(class, Ordering::Relaxed) + class;
        pool.peak.fetch_max(now, Ordering::Relaxed);
        Ok(CpuBuffer {
            ptr,
            len,
            home: Home::Pinned {
                class,
                owner: Some(owner),
                pool,
            },
        })
    }

    /// The buffer behind a `DeviceBuffer`, or an `Err` when it belongs to another backend.
    pub(crate) fn of(buf: &dyn DeviceBuffer) -> Result<&CpuBuffer> {
        buf.as_any().downcast_ref::<CpuBuffer>().ok_or_else(|| {
            Error::DeviceMismatch(format!(
                "a buffer of another backend ({buf:?}) reached the CPU backend"
            ))
        })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The bytes `offset..offset + len`, or an `Err` naming the range.
    pub(crate) fn range_check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::Index(format!(
                "byte range {offset}..{} is outside a buffer of {} bytes",
                offset.saturating_add(len),
                self.len
            ))),
        }
    }
}

impl Drop for CpuBuffer {
    fn drop(&mut self) {
        // A foreign owner is dropped with the buffer: the CPU backend's work is complete by
        // the time a view can be dropped.
        match &mut self.home {
            Home::Pool { class, pool } => {
                pool.allocated.fetch_sub(*class, Ordering::Relaxed);
                pool.give_back(*class, self.ptr);
            }
            Home::Pinned { class, owner, pool } => {
                pool.allocated.fetch_sub(*class, Ordering::Relaxed);
                if let Some(owner) = owner.take() {
                    pool.give_back_pinned(*class, (Block(self.ptr), owner));
                }
            }
            Home::Foreign(_) => {}
        }
    }
}

impl DeviceBuffer for CpuBuffer {
    fn len_bytes(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
