//! Large host↔device copies through pinned staging memory.
//!
//! The driver copies pageable memory through a small internal buffer with one host thread
//! (≈ 6.5 GB/s for 1 GiB on an H100 host, and a user's fresh `Vec` pays its page faults inside
//! that one thread). Here a copy of at least [`STAGED_FROM`] bytes passes through a ring of
//! pinned chunks instead: host threads fill (or drain) one chunk in parallel while the copy
//! engine moves another, so the link, not one core, sets the rate. Each chunk's event says when
//! the copy engine is done with it; a chunk is reused only after that event.

use crate::driver::{check, Gpu};
use cudarc::driver::sys;
use std::sync::{Arc, Mutex};
use strata_core::backend::parallel_copy;
use strata_core::sync::LockUnpoisoned;
use strata_core::{Error, Result};

/// Copies below this size go through the driver's own path (its staging is fast for them).
pub(crate) const STAGED_FROM: usize = 4 << 20;
/// Bytes per pinned chunk.
const CHUNK: usize = 16 << 20;
/// Chunks in the ring: enough for host copies and DMA to overlap with slack for jitter.
const SLOTS: usize = 4;

/// One pinned chunk and the event recorded after the last copy that used it.
struct Slot {
    host: *mut u8,
    event: sys::CUevent,
    pending: bool,
}

impl Slot {
    /// Waits until the copy engine no longer reads or writes this chunk.
    fn wait(&mut self) -> Result<()> {
        if self.pending {
            // SAFETY: a live event of this context.
            check(
                unsafe { sys::cuEventSynchronize(self.event) },
                "cuEventSynchronize",
            )?;
            self.pending = false;
        }
        Ok(())
    }

    /// Records this chunk's event on `s`, after the copy just enqueued there.
    fn record(&mut self, s: sys::CUstream) -> Result<()> {
        // SAFETY: a live event and stream of this context.
        check(
            unsafe { sys::cuEventRecord(self.event, s) },
            "cuEventRecord",
        )?;
        self.pending = true;
        Ok(())
    }

    /// The chunk's first `len` bytes.
    ///
    /// SAFETY: the caller has waited for the chunk and holds the ring's lock.
    unsafe fn bytes(&mut self, len: usize) -> &mut [u8] {
        std::slice::from_raw_parts_mut(self.host, len.min(CHUNK))
    }
}

/// The pinned ring of one device, allocated on its first large copy.
pub(crate) struct Staging {
    gpu: Arc<Gpu>,
    ring: Mutex<Option<Vec<Slot>>>,
}

// SAFETY: the raw pinned pointers and events are only touched under the ring's lock.
unsafe impl Send for Staging {}
unsafe impl Sync for Staging {}

impl Staging {
    pub(crate) fn new(gpu: Arc<Gpu>) -> Staging {
        Staging {
            gpu,
            ring: Mutex::new(None),
        }
    }

    /// The ring, allocated on first use; `None` when pinned memory cannot be had (the caller
    /// then takes the driver's path).
    fn with_ring<R>(&self, f: impl FnOnce(&mut [Slot]) -> Result<R>) -> Option<Result<R>> {
        let mut ring = self.ring.lock_unpoisoned();
        if ring.is_none() {
            *ring = Some(allocate_ring().ok()?);
        }
        ring.as_mut().map(|slots| f(slots))
    }

    /// Copies `data` to device address `dst` in order on stream `s`; returns once every byte
    /// is in pinned memory (the source may then be freed). `None`: no pinned memory.
    pub(crate) fn upload(&self, dst: u64, data: &[u8], s: sys::CUstream) -> Option<Result<()>> {
        self.gpu.bind().ok()?;
        self.with_ring(|slots| {
            for (i, piece) in data.chunks(CHUNK).enumerate() {
                let slot = &mut slots[i % SLOTS];
                slot.wait()?;
                // SAFETY: waited for above; the lock is held.
                parallel_copy(unsafe { slot.bytes(piece.len()) }, piece);
                // SAFETY: the pinned chunk holds `piece.len()` bytes; the caller checked the
                // destination range.
                check(
                    unsafe {
                        sys::cuMemcpyHtoDAsync_v2(
                            dst + (i * CHUNK) as u64,
                            slot.host as *const std::ffi::c_void,
                            piece.len(),
                            s,
                        )
                    },
                    "cuMemcpyHtoDAsync",
                )?;
                slot.record(s)?;
            }
            Ok(())
        })
    }

    /// Copies `out.len()` bytes from device address `src`, after the work enqueued on `s`, into
    /// `out`; returns when `out` holds them. `None`: no pinned memory.
    pub(crate) fn download(
        &self,
        src: u64,
        out: &mut [u8],
        s: sys::CUstream,
    ) -> Option<Result<()>> {
        self.gpu.bind().ok()?;
        let total = out.len();
        let chunks = total.div_ceil(CHUNK);
        self.with_ring(|slots| {
            let enqueue = |i: usize, slot: &mut Slot| -> Result<()> {
                let len = (total - i * CHUNK).min(CHUNK);
                // SAFETY: the chunk is free (waited for) and holds `len` bytes; the caller
                // checked the source range.
                check(
                    unsafe {
                        sys::cuMemcpyDtoHAsync_v2(
                            slot.host as *mut std::ffi::c_void,
                            src + (i * CHUNK) as u64,
                            len,
                            s,
                        )
                    },
                    "cuMemcpyDtoHAsync",
                )?;
                slot.record(s)
            };
            for (i, slot) in slots.iter_mut().enumerate().take(chunks) {
                slot.wait()?;
                enqueue(i, slot)?;
            }
            for (i, piece) in out.chunks_mut(CHUNK).enumerate() {
                let slot = &mut slots[i % SLOTS];
                slot.wait()?;
                // SAFETY: the copy into this chunk has finished (waited for); the lock is held.
                parallel_copy(piece, unsafe { slot.bytes(piece.len()) });
                if i + SLOTS < chunks {
                    enqueue(i + SLOTS, slot)?;
                }
            }
            Ok(())
        })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let ring = self.ring.get_mut().unwrap_or_else(|p| p.into_inner());
        if let (Some(slots), Ok(())) = (ring.take(), self.gpu.bind()) {
            for mut slot in slots {
                let _ = slot.wait();
                // SAFETY: allocated by allocate_ring, freed once, no copy in flight.
                unsafe {
                    sys::cuMemFreeHost(slot.host as *mut std::ffi::c_void);
                    sys::cuEventDestroy_v2(slot.event);
                }
            }
        }
    }
}

/// `SLOTS` pinned chunks with their events (the context is current).
fn allocate_ring() -> Result<Vec<Slot>> {
    let mut slots = Vec::with_capacity(SLOTS);
    for _ in 0..SLOTS {
        let mut host = std::ptr::null_mut();
        // SAFETY: plain allocation calls; the results are checked before use.
        unsafe {
            check(sys::cuMemHostAlloc(&mut host, CHUNK, 0), "cuMemHostAlloc")?;
            let mut event = std::ptr::null_mut();
            let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
            if let Err(e) = check(sys::cuEventCreate(&mut event, flags), "cuEventCreate") {
                sys::cuMemFreeHost(host);
                return Err(e);
            }
            slots.push(Slot {
                host: host as *mut u8,
                event,
                pending: false,
            });
        }
    }
    if slots.len() < SLOTS {
        return Err(Error::Backend("pinned staging ring incomplete".into()));
    }
    Ok(slots)
}
