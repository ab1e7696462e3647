//! The CUDA context of one device and the user-visible streams and events on it, through the
//! driver API (loaded at run time, so a machine without CUDA builds and runs everything else).

use cudarc::driver::{sys, CudaContext};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use strata_core::sync::LockUnpoisoned;
use strata_core::{Error, EventId, Result, StreamId};

/// Turns a driver status into `Ok` or an `Err` naming the call and the CUDA error.
pub(crate) fn check(status: sys::CUresult, call: &str) -> Result<()> {
    if status == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(Error::Backend(format!(
        "{call} failed: {}",
        describe(status)
    )))
}

/// The CUDA error's name and description.
pub(crate) fn describe(status: sys::CUresult) -> String {
    let e = cudarc::driver::DriverError(status);
    let name = e.error_name().map(|c| c.to_string_lossy().into_owned());
    let text = e.error_string().map(|c| c.to_string_lossy().into_owned());
    match (name, text) {
        (Ok(n), Ok(t)) => format!("{n} ({t})"),
        _ => format!("{status:?}"),
    }
}

/// A raw stream or event handle that may cross threads (the driver allows it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Raw<T>(pub T);
// SAFETY: CUDA stream and event handles are usable from any thread with the context current.
unsafe impl<T> Send for Raw<T> {}
unsafe impl<T> Sync for Raw<T> {}

/// One device's context, its streams and events.
pub(crate) struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub ordinal: usize,
    pub sm_count: u32,
    /// Shared memory of one multiprocessor, and the most one block may opt in to (bytes).
    pub shared_per_sm: usize,
    pub shared_per_block: usize,
    pub arch: (i32, i32),
    pub name: String,
    /// The stream behind `StreamId::DEFAULT` (a real stream, not the legacy NULL stream).
    pub default_stream: Raw<sys::CUstream>,
    streams: Mutex<HashMap<StreamId, Raw<sys::CUstream>>>,
    events: Mutex<HashMap<u64, Raw<sys::CUevent>>>,
    /// The event that hands work over between one of strata's streams and another library's
    /// (DLPack): recorded and waited for under its lock, created once without timing. A wait
    /// takes the record made just before it, so reusing the event is safe, and an exchange
    /// saves creating and destroying one.
    handoff: Mutex<Option<Raw<sys::CUevent>>>,
    next_id: AtomicU64,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gpu(cuda:{} {})", self.ordinal, self.name)
    }
}

impl Gpu {
    /// Opens device `ordinal`, or says why not (no driver, no such device).
    pub(crate) fn open(ordinal: usize) -> Result<Gpu> {
        // SAFETY: only asks the loader whether the library can be opened.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::DeviceUnavailable(format!(
                "cuda:{ordinal}: no CUDA driver found (libcuda.so could not be loaded); \
                 install NVIDIA's driver, or use Device::wgpu() or Device::cpu()"
            )));
        }
        let count = CudaContext::device_count().map_err(|e| {
            Error::DeviceUnavailable(format!(
                "cuda:{ordinal}: the CUDA driver did not initialize: {}",
                describe(e.0)
            ))
        })?;
        if ordinal >= count.max(0) as usize {
            return Err(Error::DeviceUnavailable(format!(
                "cuda:{ordinal}: there are {count} CUDA devices"
            )));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| Error::DeviceUnavailable(format!("cuda:{ordinal}: {}", describe(e.0))))?;
        let attr = |a| {
            ctx.attribute(a)
                .map_err(|e| Error::Backend(format!("cuda:{ordinal}: {}", describe(e.0))))
        };
        let sm_count = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let shared_per_sm = attr(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
        )?;
        let shared_per_block =
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
        let arch = ctx
            .compute_capability()
            .map_err(|e| Error::Backend(describe(e.0)))?;
        let name = ctx.name().unwrap_or_else(|_| "CUDA device".into());
        let mut stream = std::ptr::null_mut();
        // SAFETY: the context is current (CudaContext::new binds it); `stream` is written.
        check(
            unsafe {
                sys::cuStreamCreate(
                    &mut stream,
                    sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                )
            },
            "cuStreamCreate",
        )?;
        Ok(Gpu {
            ctx,
            ordinal,
            sm_count: sm_count.max(1) as u32,
            shared_per_sm: shared_per_sm.max(0) as usize,
            shared_per_block: shared_per_block.max(0) as usize,
            arch,
            name,
            default_stream: Raw(stream),
            streams: Mutex::new(HashMap::new()),
            events: Mutex::new(HashMap::new()),
            handoff: Mutex::new(None),
            next_id: AtomicU64::new(1),
        })
    }

    /// Makes this device's context current on the calling thread.
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| Error::Backend(format!("cuda:{}: {}", self.ordinal, describe(e.0))))
    }

    /// The CUDA stream behind `id`.
    pub(crate) fn stream(&self, id: StreamId) -> Result<sys::CUstream> {
        if id == StreamId::DEFAULT {
            return Ok(self.default_stream.0);
        }
        let streams = self.streams.lock_unpoisoned();
        streams.get(&id).map(|s| s.0).ok_or_else(|| {
            Error::Invalid(format!(
                "stream {} does not exist on cuda:{} (destroyed?)",
                id.0, self.ordinal
            ))
        })
    }

    /// The stream behind `id`, or the default stream when `id` was destroyed (its work was
    /// waited for when it was).
    pub(crate) fn stream_or_default(&self, id: StreamId) -> sys::CUstream {
        self.stream(id).unwrap_or(self.default_stream.0)
    }

    pub(crate) fn new_stream(&self) -> Result<StreamId> {
        self.bind()?;
        let mut s = std::ptr::null_mut();
        // SAFETY: context bound; `s` is written.
        check(
            unsafe {
                sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
            },
            "cuStreamCreate",
        )?;
        let id = StreamId(self.next_id.fetch_add(1, Ordering::Relaxed));
        self.streams.lock_unpoisoned().insert(id, Raw(s));
        Ok(id)
    }

    pub(crate) fn destroy_stream(&self, id: StreamId) {
        let s = self.streams.lock_unpoisoned().remove(&id);
        if let Some(s) = s {
            if self.bind().is_ok() {
                // SAFETY: the handle came from cuStreamCreate and is removed from the table;
                // its work finishes first so buffers freed later on the default stream are safe.
                unsafe {
                    sys::cuStreamSynchronize(s.0);
                    sys::cuStreamDestroy_v2(s.0);
                }
            }
        }
    }

    pub(crate) fn record_event(&self, stream: StreamId) -> Result<EventId> {
        self.bind()?;
        let s = self.stream(stream)?;
        let mut e = std::ptr::null_mut();
        // SAFETY: context bound; `e` is written, then recorded on a live stream.
        unsafe {
            check(
                sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DEFAULT as u32),
                "cuEventCreate",
            )?;
            if let Err(err) = check(sys::cuEventRecord(e, s), "cuEventRecord") {
                sys::cuEventDestroy_v2(e);
                return Err(err);
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.events.lock_unpoisoned().insert(id, Raw(e));
        Ok(EventId(id))
    }

    fn event(&self, id: EventId) -> Result<sys::CUevent> {
        let events = self.events.lock_unpoisoned();
        events.get(&id.0).map(|e| e.0).ok_or_else(|| {
            Error::Invalid(format!(
                "event {} does not exist on cuda:{}",
                id.0, self.ordinal
            ))
        })
    }

    pub(crate) fn wait_event(&self, stream: StreamId, event: EventId) -> Result<()> {
        self.bind()?;
        let (s, e) = (self.stream(stream)?, self.event(event)?);
        // SAFETY: both handles are live.
        check(
            unsafe { sys::cuStreamWaitEvent(s, e, 0) },
            "cuStreamWaitEvent",
        )
    }

    /// Makes `foreign`, another library's stream in this context, wait for the work enqueued
    /// so far on `stream`.
    pub(crate) fn foreign_waits_for(&self, foreign: sys::CUstream, stream: StreamId) -> Result<()> {
        let s = self.stream(stream)?;
        self.hand_over(s, foreign)
    }

    /// Makes `stream` wait for the work enqueued so far on `foreign`, another library's
    /// stream in this context.
    pub(crate) fn wait_foreign(&self, stream: StreamId, foreign: sys::CUstream) -> Result<()> {
        let s = self.stream(stream)?;
        self.hand_over(foreign, s)
    }

    /// `to` waits for the work enqueued so far on `from` (one of them another library's: the
    /// caller vouches for its handle), through the shared hand-over event.
    fn hand_over(&self, from: sys::CUstream, to: sys::CUstream) -> Result<()> {
        self.bind()?;
        let mut slot = self.handoff.lock_unpoisoned();
        let e = match *slot {
            Some(Raw(e)) => e,
            None => {
                let mut e = std::ptr::null_mut();
                let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
                // SAFETY: context bound; `e` is written.
                check(
                    unsafe { sys::cuEventCreate(&mut e, flags) },
                    "cuEventCreate",
                )?;
                *slot = Some(Raw(e));
                e
            }
        };
        // SAFETY: a live event, recorded then waited for while its lock is held, so no other
        // hand-over records it in between; both streams are live in this context.
        unsafe {
            check(sys::cuEventRecord(e, from), "cuEventRecord (hand-over)")?;
            check(
                sys::cuStreamWaitEvent(to, e, 0),
                "cuStreamWaitEvent (hand-over)",
            )
        }
    }

    pub(crate) fn synchronize_event(&self, event: EventId) -> Result<()> {
        self.bind()?;
        let e = self.event(event)?;
        // SAFETY: the handle is live.
        check(unsafe { sys::cuEventSynchronize(e) }, "cuEventSynchronize")
    }

    pub(crate) fn elapsed_ms(&self, start: EventId, end: EventId) -> Result<f64> {
        self.bind()?;
        let (a, b) = (self.event(start)?, self.event(end)?);
        let mut ms = 0f32;
        // SAFETY: live handles; waiting for `end` first makes the timing available.
        unsafe {
            check(sys::cuEventSynchronize(b), "cuEventSynchronize")?;
            check(
                sys::cuEventElapsedTime_v2(&mut ms, a, b),
                "cuEventElapsedTime",
            )?;
        }
        Ok(ms as f64)
    }

    pub(crate) fn destroy_event(&self, event: EventId) {
        let e = self.events.lock_unpoisoned().remove(&event.0);
        if let Some(e) = e {
            if self.bind().is_ok() {
                // SAFETY: removed from the table; the driver frees it once it completes.
                unsafe { sys::cuEventDestroy_v2(e.0) };
            }
        }
    }

    pub(crate) fn synchronize_stream(&self, stream: StreamId) -> Result<()> {
        self.bind()?;
        let s = self.stream(stream)?;
        // SAFETY: live handle.
        check(
            unsafe { sys::cuStreamSynchronize(s) },
            "cuStreamSynchronize",
        )
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: context bound.
        check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
    }

    /// (free, total) device memory in bytes.
    pub(crate) fn mem_info(&self) -> (usize, usize) {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: context bound by the caller; both outputs are written.
        let ok = unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) };
        if ok != sys::CUresult::CUDA_SUCCESS {
            return (0, 0);
        }
        (free, total)
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        if self.bind().is_err() {
            return;
        }
        // SAFETY: all handles came from this context and are destroyed once.
        unsafe {
            sys::cuCtxSynchronize();
            for (_, e) in self.events.lock_unpoisoned().drain() {
                sys::cuEventDestroy_v2(e.0);
            }
            if let Some(e) = self.handoff.lock_unpoisoned().take() {
                sys::cuEventDestroy_v2(e.0);
            }
            for (_, s) in self.streams.lock_unpoisoned().drain() {
                sys::cuStreamDestroy_v2(s.0);
            }
            sys::cuStreamDestroy_v2(self.default_stream.0);
        }
    }
}
