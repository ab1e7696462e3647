//! Page-locked host memory for a pinned host device (`Device::pinned_host`), and the copies
//! between it and the device: enqueued with `cuMemcpy*Async` straight from or into the
//! caller's page-locked block (no staging ring, no host wait), each followed by an event that
//! core keeps on the host tensor until the copy is done.

use crate::driver::{self, check, Gpu};
use crate::memory::CudaBuffer;
use crate::CudaBackend;
use cudarc::driver::sys;
use std::sync::Arc;
use strata_core::backend::ForeignOwner;
use strata_core::{DeviceBuffer, Error, EventId, Result, StreamId};

/// A `cuMemHostAlloc` block, freed when dropped (core drops it after the copies using it).
struct PinnedBlock {
    host: *mut std::ffi::c_void,
    gpu: Arc<Gpu>,
}

// SAFETY: a plain host address; core orders every access to the memory behind it.
unsafe impl Send for PinnedBlock {}
unsafe impl Sync for PinnedBlock {}

impl Drop for PinnedBlock {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: allocated by `allocate`, freed once; no copy is in flight (core waits).
            unsafe { sys::cuMemFreeHost(self.host) };
        }
    }
}

impl CudaBackend {
    /// `bytes` of page-locked memory mapped for this context, and its owner.
    pub(crate) fn allocate_pinned_block(&self, bytes: usize) -> Result<(u64, ForeignOwner)> {
        self.gpu.bind()?;
        let mut host = std::ptr::null_mut();
        // SAFETY: context bound; the driver writes `host`.
        let status = unsafe { sys::cuMemHostAlloc(&mut host, bytes.max(1), 0) };
        if status == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            return Err(Error::out_of_memory(bytes, 0));
        }
        check(status, "cuMemHostAlloc")?;
        let block = PinnedBlock {
            host,
            gpu: self.gpu.clone(),
        };
        Ok((host as usize as u64, Box::new(block)))
    }

    /// Enqueues a copy between page-locked host memory and a device buffer on `stream`, and
    /// records an event after it. `upload`: host to device.
    pub(crate) fn copy_pinned(
        &self,
        buffer: &dyn DeviceBuffer,
        byte_offset: usize,
        host: u64,
        len: usize,
        stream: StreamId,
        upload: bool,
    ) -> Result<EventId> {
        let buf = CudaBuffer::of(buffer)?;
        buf.range_check(byte_offset, len)?;
        self.gpu.bind()?;
        let s = self.gpu.stream(stream)?;
        // Kernels batched for this stream go first: the copy is ordered after them.
        self.runner.batches.send(&self.gpu, stream)?;
        buf.used_on(stream);
        let device = buf.device_ptr() + byte_offset as u64;
        let host = host as usize as *mut std::ffi::c_void;
        // SAFETY: range checked; core keeps the page-locked block alive and untouched by the
        // host until the event recorded below completes.
        let status = unsafe {
            if upload {
                sys::cuMemcpyHtoDAsync_v2(device, host, len, s)
            } else {
                sys::cuMemcpyDtoHAsync_v2(host, device, len, s)
            }
        };
        driver::check(status, "cuMemcpyAsync (pinned)")?;
        self.gpu.record_event(stream)
    }
}
