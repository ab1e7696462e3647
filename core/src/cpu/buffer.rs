//! Host memory blocks for the CPU backend, with allocation statistics.

use crate::backend::{DeviceBuffer, MemoryStats};
use crate::error::{Error, Result};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::any::Any;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Alignment of every block: enough for any dtype and for vector loads.
const ALIGN: usize = 64;

/// Allocation counters shared by a CPU device and its buffers.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    allocated: AtomicUsize,
    peak: AtomicUsize,
}

impl Counters {
    pub(crate) fn stats(&self) -> MemoryStats {
        let allocated = self.allocated.load(Ordering::Relaxed);
        MemoryStats {
            allocated,
            // The CPU backend caches nothing: every byte reserved is allocated.
            reserved: allocated,
            peak: self.peak.load(Ordering::Relaxed),
        }
    }
}

/// One zero-initialized, 64-byte-aligned block of host memory.
#[derive(Debug)]
pub struct CpuBuffer {
    ptr: NonNull<u8>,
    len: usize,
    counters: Arc<Counters>,
}

// SAFETY: the block is plain memory; the backend orders accesses (writes of one kernel go to
// disjoint elements, and kernels run one after another).
unsafe impl Send for CpuBuffer {}
unsafe impl Sync for CpuBuffer {}

impl CpuBuffer {
    pub(crate) fn new(len: usize, counters: Arc<Counters>) -> Result<CpuBuffer> {
        let layout = Self::layout(len)?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).ok_or(Error::OutOfMemory {
            requested: len,
            free: 0,
        })?;
        let now = counters.allocated.fetch_add(len, Ordering::Relaxed) + len;
        counters.peak.fetch_max(now, Ordering::Relaxed);
        Ok(CpuBuffer { ptr, len, counters })
    }

    fn layout(len: usize) -> Result<Layout> {
        Layout::from_size_align(len.max(1), ALIGN).map_err(|_| Error::OutOfMemory {
            requested: len,
            free: 0,
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
        self.counters
            .allocated
            .fetch_sub(self.len, Ordering::Relaxed);
        // SAFETY: allocated in `new` with this layout (which was valid then).
        unsafe {
            dealloc(
                self.ptr.as_ptr(),
                Self::layout(self.len).expect("valid at allocation"),
            )
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
