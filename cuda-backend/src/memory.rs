//! Device memory: buffers from the device's stream-ordered pool, with its release threshold
//! raised so freed memory stays cached across synchronizations (an allocation after a sync
//! costs microseconds, not a driver round trip). On top of it, a host-side cache keeps freed
//! blocks per (stream, size class), so the allocate/free pair of an op costs no driver call
//! at all (large blocks too: in the small CNN's step on an H200 the pool's allocations of its
//! activations and cuDNN's workspaces were 12% of the host's time): a block is reused only on the stream that freed it, where stream order
//! makes the reuse safe. A buffer remembers the streams that used it, so its stream-ordered
//! free waits for all of them (such blocks go back to the pool, not to the cache).

use crate::driver::{check, describe, Gpu, Raw};
use cudarc::driver::sys;
use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use strata_core::backend::ForeignOwner;
use strata_core::backend::Operand;
use strata_core::sync::LockUnpoisoned;
use strata_core::{DeviceBuffer, Error, MemoryStats, Result, StreamId};

/// The device's memory pool and the byte counts behind `memory_stats`.
pub(crate) struct Memory {
    pub gpu: Arc<Gpu>,
    pool: Raw<sys::CUmemoryPool>,
    allocated: AtomicUsize,
    peak: AtomicUsize,
    /// Freed blocks by (stream, size class): device addresses.
    cache: Mutex<std::collections::HashMap<(StreamId, usize), Vec<u64>>>,
    cached_bytes: AtomicUsize,
}

/// Blocks up to this size take power-of-two classes; larger ones multiples of
/// [`LARGE_STEP`].
const SMALL_BLOCK: usize = 8 << 20;
/// The granularity of a large block's class: a training step allocates the same large
/// activations every step, so an exact-size class finds last step's block.
const LARGE_STEP: usize = 2 << 20;
/// At most this many bytes sit in the host-side cache.
const CACHE_LIMIT: usize = 1 << 30;

/// The size class of a request: powers of two from 512 bytes up to [`SMALL_BLOCK`], then
/// multiples of [`LARGE_STEP`] (0 stays 0).
fn size_class(bytes: usize) -> usize {
    match bytes {
        0 => 0,
        b if b <= SMALL_BLOCK => b.next_power_of_two().max(512),
        b => b.next_multiple_of(LARGE_STEP),
    }
}

impl Memory {
    /// Takes the device's default pool and raises its release threshold to "never".
    pub(crate) fn new(gpu: Arc<Gpu>) -> Result<Memory> {
        let mut pool = std::ptr::null_mut();
        // SAFETY: context current (Gpu::open); the outputs are written by the driver.
        unsafe {
            let mut dev = 0;
            check(sys::cuCtxGetDevice(&mut dev), "cuCtxGetDevice")?;
            check(
                sys::cuDeviceGetDefaultMemPool(&mut pool, dev),
                "cuDeviceGetDefaultMemPool",
            )?;
            let mut threshold: u64 = u64::MAX;
            check(
                sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    &mut threshold as *mut u64 as *mut std::ffi::c_void,
                ),
                "cuMemPoolSetAttribute(RELEASE_THRESHOLD)",
            )?;
        }
        Ok(Memory {
            gpu,
            pool: Raw(pool),
            allocated: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            cache: Mutex::new(std::collections::HashMap::new()),
            cached_bytes: AtomicUsize::new(0),
        })
    }

    /// A buffer of `bytes` bytes, ready for use on `stream`. Out of memory empties the cache
    /// and retries once before returning `Err(OutOfMemory)`.
    pub(crate) fn allocate(self: &Arc<Self>, bytes: usize, stream: StreamId) -> Result<CudaBuffer> {
        self.gpu.bind()?;
        let s = self.gpu.stream(stream)?;
        let class = size_class(bytes);
        let mut ptr = 0;
        let reused = match class {
            0 => None,
            _ => self.take_cached(stream, class),
        };
        if let Some(p) = reused {
            ptr = p;
        } else if class > 0 {
            let mut status = self.alloc_raw(&mut ptr, class, s);
            if status == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                self.empty_cache();
                status = self.alloc_raw(&mut ptr, class, s);
            }
            if status != sys::CUresult::CUDA_SUCCESS {
                let (free, total) = self.gpu.mem_info();
                let too_big = total > 0 && bytes > total;
                if status == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY || too_big {
                    return Err(Error::out_of_memory(bytes, free));
                }
            }
            check(status, "cuMemAllocFromPoolAsync")?;
        }
        let now = self.allocated.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
        Ok(CudaBuffer {
            ptr,
            bytes,
            class,
            home: stream,
            others: Mutex::new(Vec::new()),
            memory: self.clone(),
            foreign: None,
        })
    }

    /// A buffer over `bytes` bytes at `ptr` that another library owns (a DLPack import),
    /// first used on `stream`. It is not counted in `memory_stats`; its drop waits for the
    /// streams that used it, then drops `owner`.
    pub(crate) fn foreign(
        self: &Arc<Self>,
        ptr: u64,
        bytes: usize,
        stream: StreamId,
        owner: ForeignOwner,
    ) -> CudaBuffer {
        CudaBuffer {
            ptr,
            bytes,
            class: 0,
            home: stream,
            others: Mutex::new(Vec::new()),
            memory: self.clone(),
            foreign: Some(owner),
        }
    }

    fn take_cached(&self, stream: StreamId, class: usize) -> Option<u64> {
        let mut cache = self.cache.lock_unpoisoned();
        let p = cache.get_mut(&(stream, class))?.pop()?;
        self.cached_bytes.fetch_sub(class, Ordering::Relaxed);
        Some(p)
    }

    /// Keeps a freed block for reuse on `stream`; `false` when the cache is full.
    fn keep(&self, stream: StreamId, class: usize, ptr: u64) -> bool {
        if class == 0 {
            return false;
        }
        if self.cached_bytes.fetch_add(class, Ordering::Relaxed) + class > CACHE_LIMIT {
            self.cached_bytes.fetch_sub(class, Ordering::Relaxed);
            return false;
        }
        let mut cache = self.cache.lock_unpoisoned();
        cache.entry((stream, class)).or_default().push(ptr);
        true
    }

    fn alloc_raw(&self, ptr: &mut u64, bytes: usize, s: sys::CUstream) -> sys::CUresult {
        // SAFETY: the pool and stream are live; `ptr` is written on success.
        unsafe { sys::cuMemAllocFromPoolAsync(ptr, bytes, self.pool.0, s) }
    }

    pub(crate) fn stats(&self) -> MemoryStats {
        let mut reserved: u64 = 0;
        // SAFETY: the attribute is a u64 the driver writes.
        unsafe {
            sys::cuMemPoolGetAttribute(
                self.pool.0,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                &mut reserved as *mut u64 as *mut std::ffi::c_void,
            );
        }
        MemoryStats {
            allocated: self.allocated.load(Ordering::Relaxed),
            reserved: reserved as usize,
            peak: self.peak.load(Ordering::Relaxed),
        }
    }

    /// Waits for pending frees, then returns every cached block to the driver.
    pub(crate) fn empty_cache(&self) {
        let blocks: Vec<((StreamId, usize), Vec<u64>)> =
            self.cache.lock_unpoisoned().drain().collect();
        if self.gpu.bind().is_ok() {
            for ((stream, class), ptrs) in blocks {
                let s = self.gpu.stream_or_default(stream);
                for p in ptrs {
                    self.cached_bytes.fetch_sub(class, Ordering::Relaxed);
                    // SAFETY: a cached block of this pool, freed once, in its stream's order.
                    unsafe { sys::cuMemFreeAsync(p, s) };
                }
            }
        }
        if self.gpu.synchronize().is_ok() {
            // SAFETY: the pool is live.
            unsafe { sys::cuMemPoolTrimTo(self.pool.0, 0) };
        }
    }
}

/// A block of device memory. Dropping it frees it in stream order after every stream that
/// used it.
///
/// ```
/// use strata_core::{DType, Tensor};
/// if let Ok(dev) = strata_cuda::open(0) {
///     let t = Tensor::zeros([4], DType::F32, &dev).unwrap();
///     let buf = t.operand().unwrap().buffer;
///     let cuda = buf.as_any().downcast_ref::<strata_cuda::CudaBuffer>().unwrap();
///     assert_ne!(cuda.device_ptr(), 0);
/// }
/// ```
pub struct CudaBuffer {
    ptr: u64,
    bytes: usize,
    /// The size actually reserved (its size class).
    class: usize,
    /// The stream it was allocated on, where it is freed.
    home: StreamId,
    /// Other streams that used it.
    others: Mutex<Vec<StreamId>>,
    memory: Arc<Memory>,
    /// For memory another library lent: what gives it back.
    foreign: Option<ForeignOwner>,
}

impl std::fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBuffer({} bytes at {:#x})", self.bytes, self.ptr)
    }
}

impl CudaBuffer {
    /// The device address of byte 0 (0 for an empty buffer).
    ///
    /// ```
    /// # use strata_core::{DType, Tensor};
    /// if let Ok(dev) = strata_cuda::open(0) {
    ///     let t = Tensor::zeros([0], DType::U8, &dev).unwrap();
    ///     let buf = t.operand().unwrap().buffer;
    ///     let cuda = buf.as_any().downcast_ref::<strata_cuda::CudaBuffer>().unwrap();
    ///     assert_eq!(cuda.device_ptr(), 0);
    /// }
    /// ```
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The buffer behind a `DeviceBuffer`, or `Err` for another backend's.
    pub(crate) fn of(b: &dyn DeviceBuffer) -> Result<&CudaBuffer> {
        b.as_any().downcast_ref::<CudaBuffer>().ok_or_else(|| {
            Error::DeviceMismatch(format!(
                "a buffer of another backend ({b:?}) was passed to the CUDA backend"
            ))
        })
    }

    /// Notes that work on `stream` uses this buffer, so freeing it waits for that work.
    pub(crate) fn used_on(&self, stream: StreamId) {
        if stream != self.home {
            let mut others = self.others.lock_unpoisoned();
            if !others.contains(&stream) {
                others.push(stream);
            }
        }
    }

    pub(crate) fn range_check(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.bytes) {
            return Err(Error::Index(format!(
                "bytes {offset}..{} are outside a buffer of {} bytes",
                offset.saturating_add(len),
                self.bytes
            )));
        }
        Ok(())
    }
}

impl DeviceBuffer for CudaBuffer {
    fn len_bytes(&self) -> usize {
        self.bytes
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        if let Some(owner) = self.foreign.take() {
            // The owner may free or reuse the memory at once: strata's work on it ends first.
            let gpu = &self.memory.gpu;
            if gpu.bind().is_ok() {
                let others = self.others.get_mut().unwrap_or_else(|p| p.into_inner());
                for s in std::iter::once(self.home).chain(others.drain(..)) {
                    // SAFETY: a live stream handle (a destroyed one was synchronized then).
                    unsafe { sys::cuStreamSynchronize(gpu.stream_or_default(s)) };
                }
            }
            drop(owner);
            return;
        }
        self.memory
            .allocated
            .fetch_sub(self.bytes, Ordering::Relaxed);
        if self.ptr == 0 {
            return;
        }
        let gpu = &self.memory.gpu;
        if gpu.bind().is_err() {
            return;
        }
        let others = std::mem::take(self.others.get_mut().unwrap_or_else(|p| p.into_inner()));
        // Used on its own stream only: later work on that stream may reuse it at once.
        if others.is_empty()
            && gpu.stream(self.home).is_ok()
            && self.memory.keep(self.home, self.class, self.ptr)
        {
            return;
        }
        let home = gpu.stream_or_default(self.home);
        // SAFETY: every handle is live; the free is ordered after the work of every stream
        // that used the buffer through events recorded on those streams.
        unsafe {
            for s in others {
                let Ok(other) = gpu.stream(s) else { continue };
                let mut e = std::ptr::null_mut();
                let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
                if sys::cuEventCreate(&mut e, flags) == sys::CUresult::CUDA_SUCCESS {
                    sys::cuEventRecord(e, other);
                    sys::cuStreamWaitEvent(home, e, 0);
                    sys::cuEventDestroy_v2(e);
                } else {
                    sys::cuStreamSynchronize(other);
                }
            }
            let status = sys::cuMemFreeAsync(self.ptr, home);
            if status != sys::CUresult::CUDA_SUCCESS && std::env::var_os("STRATA_DEBUG").is_some() {
                eprintln!("strata: cuMemFreeAsync failed: {}", describe(status));
            }
        }
    }
}

/// The device address of an operand's first element (buffer base plus its view's offset), as
/// [`buffer_info`] sees the buffer.
pub(crate) fn element_address(op: &Operand) -> Result<u64> {
    Ok(buffer_info(op)?.address + (op.layout.offset() * op.dtype.itemsize()) as u64)
}

/// An operand's buffer as core's planners see it: its device address and size, or a
/// stand-in's (a launch planned before anything runs, for `explain`).
pub(crate) fn buffer_info(op: &Operand) -> Result<strata_core::lower::pieces::BufferInfo> {
    strata_core::lower::pieces::BufferInfo::of(op.buffer.as_ref(), |b| {
        Ok(strata_core::lower::pieces::BufferInfo {
            address: CudaBuffer::of(b)?.device_ptr(),
            bytes: b.len_bytes() as u64,
        })
    })
}
