//! [`Device`] handles and the user-visible [`Stream`] and [`Event`] objects.
//!
//! A `Device` is an `Arc` handle: cloning is cheap, and all backend state (caches, pools,
//! streams, the current stream) lives in it. There is no process-wide state, so a notebook
//! cell that keeps a `Device` in a variable keeps its caches.

use crate::backend::{
    Backend, BackendKind, DeviceBuffer, EventId, KernelArgs, MemoryStats, StreamId,
};
use crate::cpu::CpuBackend;
use crate::error::{Error, Result};
use crate::fault::Fault;
use crate::ir::Kernel;
use crate::profile_record::{ProfileState, RecordKind};
use crate::sync::LockUnpoisoned;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// A handle to one device and its backend.
///
/// ```
/// use strata_core::Device;
/// let dev = Device::cpu();
/// let same = dev.clone();
/// assert_eq!(dev, same);
/// assert_ne!(dev, Device::cpu()); // a second CPU device has its own state...
/// assert!(dev.shares_memory_with(&Device::cpu())); // ...but its tensors mix with this one's
/// assert_eq!(dev.name(), "cpu");
/// ```
#[derive(Clone)]
pub struct Device {
    inner: Arc<DeviceInner>,
}

struct DeviceInner {
    backend: Arc<dyn Backend>,
    /// Each thread's current stream where it is not the default one (PyTorch's rule: the
    /// current stream is per thread, so threads that set their own do not trade work).
    current: Mutex<Vec<(std::thread::ThreadId, Arc<StreamHandle>)>>,
    default: Arc<StreamHandle>,
    blocking: AtomicBool,
    allow_tf32: AtomicBool,
    fusion: AtomicBool,
    /// Pending storages (lazy fusion) in the order they were recorded; `flush` runs them.
    pending: Mutex<PendingRegistry>,
    /// Verdicts the device computes (a gather's index range flag), read at its next read or
    /// synchronize, oldest first.
    checks: Mutex<Vec<DeferredCheck>>,
    /// Failures a test injected, taken by the next operation of their kind; `any_fault` says
    /// whether there are any without a lock on every launch.
    faults: Mutex<Vec<Fault>>,
    any_fault: AtomicBool,
    /// The most bytes live tensors may hold (`set_memory_limit`); 0 for no limit.
    memory_limit: std::sync::atomic::AtomicUsize,
    /// The profiler's recorder, when one records.
    profile: ProfileState,
    /// For a pinned host device: the device whose page-locked memory it holds.
    pinned_for: Option<Device>,
    /// This device's pinned host device, while one is alive (`pinned_host` hands it out
    /// again, so its tensors and their copies stay on one device).
    pinned_host: Mutex<Weak<DeviceInner>>,
}

/// Lazy fusion's registry of a device's pending storages (weak handles, oldest first), which
/// its flush runs. The device keeps it, as it keeps all state, but knows nothing of what is
/// registered: fusion registers its storages and finds them again (`dyn Any`).
pub(crate) type PendingRegistry = Vec<Weak<dyn std::any::Any + Send + Sync>>;

/// A check whose verdict a kernel left on the device (a gather's index range flag), run at the
/// device's next read or synchronize instead of waiting for the kernel where it was launched.
/// It is handed the device: what it keeps must not hold one (a `Tensor` would, and so keep the
/// device alive through its own list).
pub(crate) type DeferredCheck = Box<dyn FnOnce(&Device) -> Result<()> + Send>;

/// Owns one backend stream; destroys it when the last handle goes.
pub(crate) struct StreamHandle {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) id: StreamId,
}

impl Drop for StreamHandle {
    fn drop(&mut self) {
        if self.id != StreamId::DEFAULT {
            self.backend.destroy_stream(self.id);
        }
    }
}

impl Device {
    /// A new CPU reference device.
    ///
    /// ```
    /// assert_eq!(strata_core::Device::cpu().kind(), strata_core::BackendKind::Cpu);
    /// ```
    pub fn cpu() -> Device {
        Device::from_backend(Arc::new(CpuBackend::new()))
    }

    /// Wraps a backend (used by the backend crates). Blocking mode starts on when the
    /// environment has `STRATA_LAUNCH_BLOCKING=1`.
    ///
    /// ```
    /// use std::sync::Arc;
    /// let dev = strata_core::Device::from_backend(Arc::new(strata_core::cpu::CpuBackend::new()));
    /// assert_eq!(dev.name(), "cpu");
    /// ```
    pub fn from_backend(backend: Arc<dyn Backend>) -> Device {
        Device::with_backend(backend, None)
    }

    /// A device of `backend`; `pinned_for`: the device whose page-locked memory it holds.
    pub(crate) fn with_backend(backend: Arc<dyn Backend>, pinned_for: Option<Device>) -> Device {
        let default = Arc::new(StreamHandle {
            backend: backend.clone(),
            id: StreamId::DEFAULT,
        });
        let blocking = std::env::var("STRATA_LAUNCH_BLOCKING").is_ok_and(|v| v == "1");
        let fusion = !std::env::var("STRATA_FUSION").is_ok_and(|v| v == "0");
        let device = Device {
            inner: Arc::new(DeviceInner {
                backend,
                current: Mutex::new(Vec::new()),
                default,
                blocking: AtomicBool::new(blocking),
                allow_tf32: AtomicBool::new(false),
                fusion: AtomicBool::new(fusion),
                pending: Mutex::new(Vec::new()),
                checks: Mutex::new(Vec::new()),
                faults: Mutex::new(Vec::new()),
                any_fault: AtomicBool::new(false),
                memory_limit: std::sync::atomic::AtomicUsize::new(0),
                profile: ProfileState::default(),
                pinned_for,
                pinned_host: Mutex::new(Weak::new()),
            }),
        };
        device.resume_env_profile();
        device
    }

    /// The shared state behind this handle (for a pinned host device's weak link).
    fn inner_weak(&self) -> Weak<DeviceInner> {
        Arc::downgrade(&self.inner)
    }

    /// The device behind a live weak link from [`inner_weak`](Device::inner_weak).
    fn from_weak(weak: &Weak<DeviceInner>) -> Option<Device> {
        weak.upgrade().map(|inner| Device { inner })
    }

    /// The profiler's state.
    pub(crate) fn profile_state_ref(&self) -> &ProfileState {
        &self.inner.profile
    }

    /// The backend behind this device.
    ///
    /// ```
    /// assert_eq!(strata_core::Device::cpu().backend().name(), "cpu");
    /// ```
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// Which backend this device uses.
    ///
    /// ```
    /// assert_eq!(strata_core::Device::cpu().kind(), strata_core::BackendKind::Cpu);
    /// ```
    pub fn kind(&self) -> BackendKind {
        self.inner.backend.kind()
    }

    /// The device's name: `cpu`, `cuda:0`, `wgpu:<adapter>`.
    ///
    /// ```
    /// assert_eq!(strata_core::Device::cpu().name(), "cpu");
    /// ```
    pub fn name(&self) -> String {
        self.inner.backend.name()
    }

    /// Waits until all work queued on this device is done.
    ///
    /// ```
    /// strata_core::Device::cpu().synchronize().unwrap();
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        self.flush()?;
        self.wait_recorded(StreamId::DEFAULT, "synchronize device", || {
            self.inner.backend.synchronize()
        })
    }

    /// Whether elementwise ops are deferred and fused (lazy fusion; on unless the environment
    /// has `STRATA_FUSION=0`). Blocking mode runs every op at once whatever this says.
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// dev.set_fusion(false);
    /// assert!(!dev.fusion());
    /// ```
    pub fn fusion(&self) -> bool {
        self.inner.fusion.load(Ordering::Relaxed)
    }

    /// Turns lazy fusion on or off for this device; turning it off runs what is pending.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// dev.set_fusion(false).unwrap();
    /// assert!(!Tensor::ones([2], DType::F32, &dev)?.exp()?.is_pending());
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn set_fusion(&self, on: bool) -> Result<()> {
        self.inner.fusion.store(on, Ordering::Relaxed);
        if on {
            Ok(())
        } else {
            self.flush()
        }
    }

    /// Lazy fusion's registry of this device's pending storages, locked.
    pub(crate) fn pending_registry(&self) -> MutexGuard<'_, PendingRegistry> {
        self.inner.pending.lock_unpoisoned()
    }

    /// Makes the next allocation, kernel compile or launch on this device fail with `fault`'s
    /// error (once), for tests of the failure model.
    ///
    /// ```
    /// use strata_core::{fault::Fault, Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let t = Tensor::ones([3], DType::F32, &dev)?;
    /// dev.inject_fault(Fault::Launch);
    /// assert!(t.exp()?.realize().is_err());
    /// assert_eq!(t.exp()?.to_vec::<f32>()?.len(), 3);
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    #[doc(hidden)]
    pub fn inject_fault(&self, fault: Fault) {
        self.inner.faults.lock_unpoisoned().push(fault);
        self.inner.any_fault.store(true, Ordering::Release);
    }

    /// The injected fault among `kinds` that the next such operation takes, if any.
    fn take_fault(&self, kinds: &[Fault]) -> Option<Fault> {
        if !self.inner.any_fault.load(Ordering::Acquire) {
            return None;
        }
        let mut faults = self.inner.faults.lock_unpoisoned();
        let k = faults.iter().position(|f| kinds.contains(f))?;
        let taken = faults.remove(k);
        self.inner
            .any_fault
            .store(!faults.is_empty(), Ordering::Release);
        Some(taken)
    }

    /// Keeps `check` for the next read or synchronize (see [`DeferredCheck`]).
    pub(crate) fn defer_check(&self, check: DeferredCheck) {
        self.inner.checks.lock_unpoisoned().push(check);
    }

    /// Runs the deferred checks (each reads its verdict back; one read waits for them all),
    /// returning the oldest failure. Called after every read and synchronize: an out-of-range
    /// index found by a kernel surfaces there, as CUDA's asynchronous errors do, but the device
    /// keeps working.
    fn run_deferred_checks(&self) -> Result<()> {
        let checks = std::mem::take(&mut *self.inner.checks.lock_unpoisoned());
        let mut first = Ok(());
        for check in checks {
            let verdict = check(self);
            if first.is_ok() {
                first = verdict;
            }
        }
        first
    }

    /// `Backend::run`: every launch reaches the backend here (and is recorded while a profile
    /// records). `fused_ops`: the user ops a fused kernel holds, asked only while recording.
    pub(crate) fn run_kernel(
        &self,
        kernel: &Kernel,
        args: &KernelArgs,
        stream: StreamId,
        fused_ops: impl FnOnce() -> Option<Vec<String>>,
    ) -> Result<()> {
        if let Some(f) = self.take_fault(&[Fault::Compile, Fault::Launch]) {
            return Err(f.error(0, kernel.kind_name()));
        }
        if self.profiling() {
            return self.run_kernel_recorded(kernel, args, stream, fused_ops());
        }
        self.backend().run(kernel, args, stream)
    }

    /// `Backend::upload` (recorded while a profile records).
    pub(crate) fn upload_bytes(
        &self,
        dst: &dyn DeviceBuffer,
        byte_offset: usize,
        data: &[u8],
        stream: StreamId,
    ) -> Result<()> {
        let upload = || self.backend().upload(dst, byte_offset, data, stream);
        if !self.profiling() {
            return upload();
        }
        let name = "copy host → device";
        self.copy_recorded(RecordKind::Upload, name, data.len(), stream, upload)
    }

    /// `Backend::download` (recorded while a profile records, which prints its table in
    /// printing mode: a download waits for the device), then the deferred checks.
    pub(crate) fn download_bytes(
        &self,
        src: &dyn DeviceBuffer,
        byte_offset: usize,
        out: &mut [u8],
        stream: StreamId,
    ) -> Result<()> {
        if !self.profiling() {
            self.backend().download(src, byte_offset, out, stream)?;
            return self.run_deferred_checks();
        }
        let (name, bytes) = ("copy device → host", out.len());
        let download = || self.backend().download(src, byte_offset, out, stream);
        self.copy_recorded(RecordKind::Download, name, bytes, stream, download)?;
        self.print_profile_now()?;
        self.run_deferred_checks()
    }

    /// An asynchronous copy between this device and its pinned host memory (`upload`: host
    /// to device); `copy` enqueues it and returns its event (recorded while a profile records).
    pub(crate) fn copy_pinned(
        &self,
        upload: bool,
        bytes: usize,
        stream: StreamId,
        copy: impl FnOnce() -> Result<EventId>,
    ) -> Result<EventId> {
        if !self.profiling() {
            return copy();
        }
        let (kind, name) = if upload {
            (RecordKind::Upload, "copy pinned host → device")
        } else {
            (RecordKind::Download, "copy device → pinned host")
        };
        self.copy_recorded(kind, name, bytes, stream, copy)
    }

    /// `Backend::allocate` (recorded while a profile records).
    pub(crate) fn allocate_buffer(
        &self,
        bytes: usize,
        stream: StreamId,
    ) -> Result<Arc<dyn DeviceBuffer>> {
        if let Some(f) = self.take_fault(&[Fault::Allocation]) {
            return Err(f.error(bytes, ""));
        }
        let limit = self.inner.memory_limit.load(Ordering::Relaxed);
        if limit > 0 {
            let allocated = self.backend().memory_stats().allocated;
            if allocated.saturating_add(bytes) > limit {
                return Err(Error::out_of_memory(bytes, limit.saturating_sub(allocated)));
            }
        }
        if !self.profiling() {
            return self.backend().allocate(bytes, stream);
        }
        self.allocate_recorded(bytes, stream)
    }

    /// A host wait (`what` names it), recorded while a profile records, which prints its
    /// table in printing mode; then the deferred checks, whose verdicts the wait made ready.
    pub(crate) fn wait_recorded(
        &self,
        stream: StreamId,
        what: &str,
        wait: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        if self.profiling() {
            self.wait_recorded_now(stream, what, wait)?;
            self.print_profile_now()?;
        } else {
            wait()?;
        }
        self.run_deferred_checks()
    }

    /// The allocator's statistics.
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// assert_eq!(dev.memory_stats().allocated, 0);
    /// ```
    pub fn memory_stats(&self) -> MemoryStats {
        self.inner.backend.memory_stats()
    }

    /// Caps the bytes this device's live tensors may hold (`memory_stats().allocated`): an
    /// allocation past it is `Err(OutOfMemory)`, as when the device is full (PyTorch's
    /// `set_per_process_memory_fraction`, in bytes). `None` lifts the cap.
    ///
    /// ```
    /// use strata_core::{Device, DType, Error, Tensor};
    /// let dev = Device::cpu();
    /// dev.set_memory_limit(Some(1 << 20));
    /// let e = Tensor::zeros([1 << 20], DType::F32, &dev).unwrap_err();
    /// assert!(matches!(e, Error::OutOfMemory { requested: 4194304, .. }));
    /// dev.set_memory_limit(None);
    /// assert!(Tensor::zeros([1 << 20], DType::F32, &dev).is_ok());
    /// ```
    pub fn set_memory_limit(&self, bytes: Option<usize>) {
        let bytes = bytes.map_or(0, |b| b.max(1));
        self.inner.memory_limit.store(bytes, Ordering::Relaxed);
    }

    /// Returns cached, unused memory to the system.
    ///
    /// ```
    /// strata_core::Device::cpu().empty_cache();
    /// ```
    pub fn empty_cache(&self) {
        self.inner.backend.empty_cache()
    }

    /// Whether every op waits for its own completion (`STRATA_LAUNCH_BLOCKING=1`), so that an
    /// error surfaces at the op that caused it.
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// dev.set_blocking(true);
    /// assert!(dev.blocking());
    /// ```
    pub fn blocking(&self) -> bool {
        self.inner.blocking.load(Ordering::Relaxed)
    }

    /// True when this device defers elementwise ops (lazy fusion, `crate::fusion`): fusion
    /// on and blocking mode off.
    pub(crate) fn defers(&self) -> bool {
        self.fusion() && !self.blocking()
    }

    /// Turns blocking mode on or off for this device.
    ///
    /// ```
    /// strata_core::Device::cpu().set_blocking(false);
    /// ```
    pub fn set_blocking(&self, on: bool) {
        self.inner.blocking.store(on, Ordering::Relaxed)
    }

    /// Whether f32 matmuls may use TF32 tensor cores (10-bit mantissa products, much faster on
    /// recent NVIDIA GPUs). Off by default, like PyTorch's `allow_tf32`; backends without
    /// TF32 ignore it.
    ///
    /// ```
    /// assert!(!strata_core::Device::cpu().allow_tf32());
    /// ```
    pub fn allow_tf32(&self) -> bool {
        self.inner.allow_tf32.load(Ordering::Relaxed)
    }

    /// Lets f32 matmuls on this device use TF32 (or not).
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// dev.set_allow_tf32(true);
    /// assert!(dev.allow_tf32());
    /// ```
    pub fn set_allow_tf32(&self, on: bool) {
        self.inner.allow_tf32.store(on, Ordering::Relaxed)
    }

    /// A new stream on this device.
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// let s = dev.new_stream().unwrap();
    /// assert_ne!(s.id(), dev.default_stream().id());
    /// ```
    pub fn new_stream(&self) -> Result<Stream> {
        let id = self.inner.backend.new_stream()?;
        Ok(Stream {
            device: self.clone(),
            handle: Arc::new(StreamHandle {
                backend: self.inner.backend.clone(),
                id,
            }),
        })
    }

    /// The stream the device starts with.
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// assert_eq!(dev.default_stream().id(), strata_core::StreamId::DEFAULT);
    /// ```
    pub fn default_stream(&self) -> Stream {
        Stream {
            device: self.clone(),
            handle: self.inner.default.clone(),
        }
    }

    /// The stream new work goes to.
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// assert_eq!(dev.current_stream(), dev.default_stream());
    /// ```
    pub fn current_stream(&self) -> Stream {
        Stream {
            device: self.clone(),
            handle: self.current_handle(),
        }
    }

    /// Sends later work on this device from this thread to `stream` (the current stream is per
    /// thread, as PyTorch's: another thread's work stays on its own).
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// let s = dev.new_stream().unwrap();
    /// dev.set_stream(&s).unwrap();
    /// assert_eq!(dev.current_stream(), s);
    /// ```
    pub fn set_stream(&self, stream: &Stream) -> Result<()> {
        if stream.device != *self {
            return Err(Error::DeviceMismatch(format!(
                "stream {:?} belongs to device {}, not to {}",
                stream.id(),
                stream.device.name(),
                self.name()
            )));
        }
        self.set_current_handle(stream.handle.clone());
        Ok(())
    }

    /// Runs `f` with `stream` as the current stream, then restores the previous one.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let s = dev.new_stream().unwrap();
    /// let t = dev.with_stream(&s, || Tensor::ones([2], DType::F32, &dev)).unwrap().unwrap();
    /// assert_eq!(dev.current_stream(), dev.default_stream());
    /// assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 1.0]);
    /// ```
    pub fn with_stream<R>(&self, stream: &Stream, f: impl FnOnce() -> R) -> Result<R> {
        let previous = self.current_handle();
        self.set_stream(stream)?;
        let result = f();
        self.set_current_handle(previous);
        Ok(result)
    }

    /// The host device whose memory is page-locked for this device: tensors there
    /// ([`Tensor::pin_memory`](crate::Tensor::pin_memory)) copy to and from this device at
    /// the copy engine's speed and without the host waiting (PyTorch's `pin_memory()` and
    /// `non_blocking=True`), ordered by streams like every op. It is a CPU device: every op
    /// runs on its tensors, and a host use of one waits for the copy in flight on it, so no
    /// `synchronize` is needed for correct values. The same device while one is alive. `Err`
    /// on a device without page-locked memory (CPU, wgpu).
    ///
    /// ```
    /// let cpu = strata_core::Device::cpu();
    /// let err = cpu.pinned_host().unwrap_err();
    /// assert!(err.to_string().contains("pinned"));
    /// ```
    pub fn pinned_host(&self) -> Result<Device> {
        if self.inner.pinned_for.is_some() {
            return Ok(self.clone());
        }
        let mut slot = self.inner.pinned_host.lock_unpoisoned();
        if let Some(host) = Device::from_weak(&slot) {
            return Ok(host);
        }
        let backend = CpuBackend::pinned(self.backend().clone())?;
        let host = Device::with_backend(Arc::new(backend), Some(self.clone()));
        *slot = host.inner_weak();
        Ok(host)
    }

    /// For a [`pinned_host`](Device::pinned_host) device, the device its memory is pinned
    /// for; `None` for every other device.
    ///
    /// ```
    /// assert!(strata_core::Device::cpu().pinned_for().is_none());
    /// ```
    pub fn pinned_for(&self) -> Option<&Device> {
        self.inner.pinned_for.as_ref()
    }

    /// True when tensors of the two devices can be combined in one op: the same device, or
    /// two CPU devices (all CPU devices share host memory and run work synchronously).
    ///
    /// ```
    /// use strata_core::Device;
    /// assert!(Device::cpu().shares_memory_with(&Device::cpu()));
    /// ```
    pub fn shares_memory_with(&self, other: &Device) -> bool {
        self == other || (self.kind() == BackendKind::Cpu && other.kind() == BackendKind::Cpu)
    }

    pub(crate) fn current_handle(&self) -> Arc<StreamHandle> {
        let current = self.inner.current.lock_unpoisoned();
        // Every op asks: where no thread set a stream, no thread id is needed.
        if current.is_empty() {
            return self.inner.default.clone();
        }
        let me = std::thread::current().id();
        match current.iter().find(|(t, _)| *t == me) {
            Some((_, h)) => h.clone(),
            None => self.inner.default.clone(),
        }
    }

    /// Makes `handle` this thread's current stream (the default one is kept as no entry, so
    /// a thread that ends on it leaves nothing behind).
    fn set_current_handle(&self, handle: Arc<StreamHandle>) {
        let me = std::thread::current().id();
        let mut current = self.inner.current.lock_unpoisoned();
        current.retain(|(t, _)| *t != me);
        if !Arc::ptr_eq(&handle, &self.inner.default) {
            current.push((me, handle));
        }
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}
impl Eq for Device {}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({})", self.name())
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// An ordered queue of work on a device. Ops run on the device's current stream
/// ([`Device::set_stream`], [`Device::with_stream`]).
///
/// ```
/// let dev = strata_core::Device::cpu();
/// let s = dev.new_stream().unwrap();
/// let e = s.record_event().unwrap();
/// dev.default_stream().wait_event(&e).unwrap();
/// s.synchronize().unwrap();
/// ```
#[derive(Clone)]
pub struct Stream {
    device: Device,
    handle: Arc<StreamHandle>,
}

impl Stream {
    /// The backend's id of this stream.
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// assert_eq!(dev.default_stream().id().0, 0);
    /// ```
    pub fn id(&self) -> StreamId {
        self.handle.id
    }

    /// The device the stream belongs to.
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// assert_eq!(dev.default_stream().device(), &dev);
    /// ```
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Records an event capturing the work queued on this stream so far.
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// let e = dev.current_stream().record_event().unwrap();
    /// e.synchronize().unwrap();
    /// ```
    pub fn record_event(&self) -> Result<Event> {
        self.device.flush()?;
        let id = self.device.backend().record_event(self.id())?;
        self.device.record_marker(
            RecordKind::EventRecord,
            self.id(),
            format!("event #{}", id.0),
        );
        Ok(Event {
            device: self.device.clone(),
            id: Arc::new(EventHandle {
                backend: self.device.backend().clone(),
                id,
            }),
        })
    }

    /// Makes later work on this stream wait for `event`.
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// let a = dev.new_stream().unwrap();
    /// let b = dev.new_stream().unwrap();
    /// b.wait_event(&a.record_event().unwrap()).unwrap();
    /// ```
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        if event.device != self.device {
            return Err(Error::DeviceMismatch(format!(
                "an event of device {} cannot be waited for on a stream of device {}",
                event.device.name(),
                self.device.name()
            )));
        }
        self.device.flush()?;
        self.device.backend().wait_event(self.id(), event.id.id)?;
        self.device.record_marker(
            RecordKind::EventWait,
            self.id(),
            format!("wait for event #{}", event.id.id.0),
        );
        Ok(())
    }

    /// Blocks until all work queued on this stream is done.
    ///
    /// ```
    /// strata_core::Device::cpu().default_stream().synchronize().unwrap();
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        self.device.flush()?;
        let what = format!("synchronize stream #{}", self.id().0);
        self.device.wait_recorded(self.id(), &what, || {
            self.device.backend().synchronize_stream(self.id())
        })
    }
}

impl PartialEq for Stream {
    fn eq(&self, other: &Stream) -> bool {
        self.device == other.device && self.id() == other.id()
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stream({} #{})", self.device.name(), self.id().0)
    }
}

struct EventHandle {
    backend: Arc<dyn Backend>,
    id: EventId,
}

impl Drop for EventHandle {
    fn drop(&mut self) {
        self.backend.destroy_event(self.id);
    }
}

/// A marker in a stream: complete once the work recorded before it is done. Used to order
/// streams and to time work.
///
/// ```
/// use strata_core::{Device, DType, Tensor};
/// let dev = Device::cpu();
/// let s = dev.current_stream();
/// let start = s.record_event().unwrap();
/// let _t = Tensor::ones([1000], DType::F32, &dev).unwrap();
/// let end = s.record_event().unwrap();
/// end.synchronize().unwrap();
/// assert!(start.elapsed_ms(&end).unwrap() >= 0.0);
/// ```
#[derive(Clone)]
pub struct Event {
    device: Device,
    id: Arc<EventHandle>,
}

impl Event {
    /// Blocks until the event completes.
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// dev.current_stream().record_event().unwrap().synchronize().unwrap();
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        let what = format!("synchronize event #{}", self.id.id.0);
        self.device.wait_recorded(StreamId::DEFAULT, &what, || {
            self.device.backend().synchronize_event(self.id.id)
        })
    }

    /// Milliseconds from this event to `end` (both must be complete; synchronize `end` first).
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// let s = dev.current_stream();
    /// let (a, b) = (s.record_event().unwrap(), s.record_event().unwrap());
    /// assert!(a.elapsed_ms(&b).unwrap() >= 0.0);
    /// ```
    pub fn elapsed_ms(&self, end: &Event) -> Result<f64> {
        if end.device != self.device {
            return Err(Error::DeviceMismatch(format!(
                "events of devices {} and {} cannot be timed against each other",
                self.device.name(),
                end.device.name()
            )));
        }
        self.device.backend().elapsed_ms(self.id.id, end.id.id)
    }

    /// The device the event belongs to.
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// assert_eq!(dev.current_stream().record_event().unwrap().device(), &dev);
    /// ```
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The backend's id of this event.
    pub(crate) fn id(&self) -> EventId {
        self.id.id
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Event({} #{})", self.device.name(), self.id.id.0)
    }
}
