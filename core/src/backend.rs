//! The [`Backend`] trait: what a device must do for core. Designed for asynchronous GPUs:
//! `upload` and `run` only enqueue work on a stream; `download` and the `synchronize_*` calls
//! are the only ones that wait.

use crate::dtype::{DType, Scalar};
use crate::error::Result;
use crate::ir::{Expr, Kernel};
use crate::layout::Layout;
use std::any::Any;
use std::fmt::Debug;
use std::sync::Arc;

/// Which implementation a device uses.
///
/// ```
/// assert_eq!(strata_core::Device::cpu().kind(), strata_core::BackendKind::Cpu);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// The CPU reference backend.
    Cpu,
    /// NVIDIA GPUs through CUDA.
    Cuda,
    /// Vulkan, Metal or DX12 through wgpu.
    Wgpu,
}

impl std::fmt::Display for BackendKind {
    /// The name `Device::parse` takes: `cpu`, `cuda`, `wgpu`.
    ///
    /// ```
    /// assert_eq!(strata_core::BackendKind::Cpu.to_string(), "cpu");
    /// ```
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
            BackendKind::Wgpu => "wgpu",
        })
    }
}

/// A stream: an ordered queue of work on one device. `StreamId(0)` is the default stream.
///
/// ```
/// assert_eq!(strata_core::StreamId::DEFAULT, strata_core::StreamId(0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u64);

impl StreamId {
    /// The stream every device starts with.
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// assert_eq!(dev.current_stream().id(), strata_core::StreamId::DEFAULT);
    /// ```
    pub const DEFAULT: StreamId = StreamId(0);
}

/// A marker recorded on a stream; complete once the work before it is done.
///
/// ```
/// let e = strata_core::EventId(3);
/// assert_eq!(e.0, 3);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventId(pub u64);

/// Memory use of a device's allocator, in bytes.
///
/// ```
/// let dev = strata_core::Device::cpu();
/// let t = strata_core::Tensor::zeros([256], strata_core::DType::F32, &dev).unwrap();
/// assert!(dev.memory_stats().allocated >= 1024);
/// drop(t);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes held by live tensors.
    pub allocated: usize,
    /// Bytes held by the allocator, cached blocks included.
    pub reserved: usize,
    /// The highest `allocated` seen.
    pub peak: usize,
}

/// Generated source of one kernel and how it would be launched.
///
/// ```
/// let k = strata_core::backend::KernelSource {
///     language: "CUDA C".into(),
///     launch: "4096 threads".into(),
///     source: "extern \"C\" __global__ void strata_map() {}".into(),
/// };
/// assert_eq!(k.language, "CUDA C");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSource {
    /// `CUDA C` or `WGSL`.
    pub language: String,
    /// The launch shape (grid and block, or workgroups and binding windows).
    pub launch: String,
    /// The generated program.
    pub source: String,
}

/// What a backend launches for one kernel, for the profiler: the kernel function's name and
/// its launch shape.
///
/// ```
/// let d = strata_core::backend::LaunchDescription {
///     name: "strata_map".into(),
///     shape: "grid [4, 1, 1] × block [256, 1, 1]".into(),
/// };
/// assert_eq!(d.name, "strata_map");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchDescription {
    /// The kernel function (or library call) that runs.
    pub name: String,
    /// Grid and block, workgroups, or the CPU's split of the work.
    pub shape: String,
}

/// A block of device memory. Dropping the last reference returns it to its device's
/// allocator.
///
/// ```
/// let dev = strata_core::Device::cpu();
/// let buf = dev.backend().allocate(64, strata_core::StreamId::DEFAULT).unwrap();
/// assert_eq!(buf.len_bytes(), 64);
/// ```
pub trait DeviceBuffer: Any + Send + Sync + Debug {
    /// Size in bytes.
    fn len_bytes(&self) -> usize;
    /// For the owning backend to downcast to its own buffer type.
    fn as_any(&self) -> &dyn Any;
}

/// A buffer that holds no memory: the stand-in for a tensor not computed yet when a launch is
/// planned without running anything ([`Tensor::explain`](crate::Tensor::explain)). Planners
/// see it through [`BufferInfo::of`](crate::lower::pieces::BufferInfo::of), at
/// [`PlannedBuffer::ADDRESS`], aligned for any vector access; no backend runs a kernel on one.
///
/// ```
/// use strata_core::backend::{DeviceBuffer, PlannedBuffer};
/// let b = PlannedBuffer::new(64);
/// assert_eq!(b.len_bytes(), 64);
/// ```
#[derive(Debug)]
pub struct PlannedBuffer {
    bytes: usize,
}

impl PlannedBuffer {
    /// The address planners see for every planned buffer (aligned for any access).
    pub const ADDRESS: u64 = 1 << 32;

    /// A stand-in for a buffer of `bytes` bytes.
    pub fn new(bytes: usize) -> PlannedBuffer {
        PlannedBuffer { bytes }
    }
}

impl DeviceBuffer for PlannedBuffer {
    fn len_bytes(&self) -> usize {
        self.bytes
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// What owns memory that another library lent to strata (through DLPack): dropping it gives
/// the memory back (it calls the producer's deleter).
///
/// ```
/// let owner: strata_core::backend::ForeignOwner = Box::new(vec![0u8; 4]);
/// drop(owner);
/// ```
pub type ForeignOwner = Box<dyn Any + Send + Sync>;

/// The `Err` of a backend whose memory or streams other libraries cannot reach.
fn not_shareable(backend: &str, what: &str) -> crate::error::Error {
    crate::error::Error::Unsupported(format!(
        "{backend}: {what} (its buffers cannot be shared with other libraries); \
         copy the tensor to the CPU first, or let the exchange copy (copy=true)"
    ))
}

/// The host threads a copy of `len` bytes is split across: the cores present, at most 8,
/// each taking at least 2 MiB (see [`parallel_copy`]).
///
/// ```
/// assert_eq!(strata_core::backend::copy_threads(1 << 20), 1);
/// ```
pub fn copy_threads(len: usize) -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(8)
    });
    cores.min(len / (2 << 20)).max(1)
}

/// `dst.copy_from_slice(src)` split across up to 8 host threads, each taking at least 2 MiB
/// (memory bandwidth, not cores, limits past that): how backends fill and drain staging
/// memory for large host↔device copies, where one core's copy is the bottleneck.
///
/// ```
/// let src: Vec<u8> = (0..5 << 20).map(|i| (i % 251) as u8).collect();
/// let mut dst = vec![0u8; src.len()];
/// strata_core::backend::parallel_copy(&mut dst, &src);
/// assert!(dst == src);
/// ```
pub fn parallel_copy(dst: &mut [u8], src: &[u8]) {
    let threads = copy_threads(src.len());
    if threads <= 1 {
        dst.copy_from_slice(src);
        return;
    }
    let part = src.len().div_ceil(threads);
    std::thread::scope(|scope| {
        for (d, s) in dst.chunks_mut(part).zip(src.chunks(part)) {
            scope.spawn(move || d.copy_from_slice(s));
        }
    });
}

/// The `Err` of a backend without page-locked host memory.
fn no_pinned_memory(backend: &str) -> crate::error::Error {
    crate::error::Error::Unsupported(format!(
        "{backend} has no page-locked (pinned) host memory: pinned memory speeds up copies \
         between the host and a CUDA device (`Device::cuda(0)?.pinned_host()`)"
    ))
}

/// What a device implements. Core holds it as `Arc<dyn Backend>` inside a
/// [`Device`](crate::Device); all state (caches, pools, streams) lives in the implementing
/// value, never in statics.
///
/// ```
/// use strata_core::{Backend, Device, StreamId};
/// let dev = Device::cpu();
/// let b = dev.backend();
/// let buf = b.allocate(4, StreamId::DEFAULT).unwrap();
/// b.upload(buf.as_ref(), 0, &[1, 2, 3, 4], StreamId::DEFAULT).unwrap();
/// let mut out = [0u8; 2];
/// b.download(buf.as_ref(), 1, &mut out, StreamId::DEFAULT).unwrap();
/// assert_eq!(out, [2, 3]);
/// ```
pub trait Backend: Send + Sync + Debug {
    /// Which implementation this is.
    fn kind(&self) -> BackendKind;
    /// A short name for messages and display: `cpu`, `cuda:0`, `wgpu:<adapter>`.
    fn name(&self) -> String;
    /// `Err` naming the dtype, the device and what to use instead when this device cannot
    /// hold or compute `dtype`.
    fn check_dtype(&self, dtype: DType) -> Result<()>;

    /// A new buffer of `bytes` bytes with unspecified contents, or `Err(OutOfMemory)`. It is
    /// ready for use on `stream` (a stream-ordered allocator allocates there).
    fn allocate(&self, bytes: usize, stream: StreamId) -> Result<Arc<dyn DeviceBuffer>>;
    /// Enqueues a copy of `data` into `dst` at `byte_offset`.
    fn upload(
        &self,
        dst: &dyn DeviceBuffer,
        byte_offset: usize,
        data: &[u8],
        stream: StreamId,
    ) -> Result<()>;
    /// Waits for `stream`, then copies `out.len()` bytes from `byte_offset` of `src` into
    /// `out` (the caller's memory: `to_vec` reads straight into the `Vec` it returns).
    fn download(
        &self,
        src: &dyn DeviceBuffer,
        byte_offset: usize,
        out: &mut [u8],
        stream: StreamId,
    ) -> Result<()>;
    /// Enqueues `kernel` with `args` on `stream`.
    fn run(&self, kernel: &Kernel, args: &KernelArgs, stream: StreamId) -> Result<()>;
    /// What this backend is and can do, for core's planners and lazy fusion: vector widths,
    /// group sizes, binding limits, and which kernels it fuses or runs natively. One
    /// description, read wherever core decides what to build.
    ///
    /// ```
    /// use strata_core::{Backend, Device};
    /// assert!(Device::cpu().backend().target().fuses_map_into_reduce);
    /// ```
    fn target(&self) -> &crate::target::Target;
    /// The source this backend generates for the map `expr` (and the further outputs `also`)
    /// over `args`, and its launch
    /// shape, without running it (for [`Tensor::explain`](crate::Tensor::explain)); `None`
    /// for a backend that generates no source (the CPU backend evaluates the tree directly)
    /// or an empty launch.
    fn map_source(
        &self,
        expr: &Expr,
        also: &[Expr],
        args: &KernelArgs,
    ) -> Result<Option<KernelSource>> {
        let _ = (expr, also, args);
        Ok(None)
    }

    /// The kernel function and launch shape `run` uses for `kernel` over `args`, for the
    /// profiler (called only while one records); `None` where the backend does not say.
    fn describe_launch(&self, kernel: &Kernel, args: &KernelArgs) -> Option<LaunchDescription> {
        let _ = (kernel, args);
        None
    }

    /// Compiles (or loads from a cache) what `run` needs for `kernel` over `args`, so that a
    /// profiler's events around the launch time the kernel and not the compiler; true when
    /// something was compiled or loaded. Called only while a profile records.
    fn prepare(&self, kernel: &Kernel, args: &KernelArgs) -> Result<bool> {
        let _ = (kernel, args);
        Ok(false)
    }

    /// The address of `buffer`'s byte 0 as another library sees it (a host pointer on the
    /// CPU, a device pointer on CUDA), for a DLPack export; `Err` where buffers cannot be
    /// shared (wgpu).
    fn buffer_address(&self, buffer: &dyn DeviceBuffer) -> Result<u64> {
        let _ = buffer;
        Err(not_shareable(&self.name(), "no DLPack export"))
    }

    /// Facts about the hardware for the device's display, as (name, value) rows: on CUDA its
    /// index, total and free memory, and the devices it reaches peer to peer. None by default.
    fn properties(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }

    /// This device as DLPack names it (device type and ordinal), or `None` where other
    /// libraries cannot address its memory.
    fn dlpack_device(&self) -> Option<dlpark::ffi::DLDevice> {
        None
    }

    /// A buffer over `bytes` bytes at `address` that another library owns (a DLPack import).
    /// `owner` is dropped once the last view is gone and the work that used the memory is
    /// complete; the allocator never reuses or counts the memory.
    fn wrap_foreign(
        &self,
        address: u64,
        bytes: usize,
        owner: ForeignOwner,
    ) -> Result<Arc<dyn DeviceBuffer>> {
        let _ = (address, bytes, owner);
        Err(not_shareable(&self.name(), "no DLPack import"))
    }

    /// The native handle of `stream` (a `CUstream` on CUDA), which another library's
    /// `__dlpack__(stream=…)` takes, or on which another library (NCCL) enqueues work after
    /// what strata enqueued there so far.
    fn native_stream(&self, stream: StreamId) -> Result<u64> {
        let _ = stream;
        Err(not_shareable(&self.name(), "no native streams"))
    }

    /// Makes the native stream `foreign` (another library's) wait for the work enqueued on
    /// `stream` so far, without the host waiting: a DLPack export to a consumer's stream.
    fn foreign_waits_for(&self, foreign: u64, stream: StreamId) -> Result<()> {
        let _ = (foreign, stream);
        Err(not_shareable(&self.name(), "no native streams"))
    }

    /// Makes later work on `stream` wait for the work enqueued on the native stream `foreign`
    /// so far: a DLPack import from a producer's stream.
    fn wait_for_foreign(&self, stream: StreamId, foreign: u64) -> Result<()> {
        let _ = (stream, foreign);
        Err(not_shareable(&self.name(), "no native streams"))
    }

    /// Enqueues on `stream` a copy of `len` bytes at `src`, an address of `peer`'s memory
    /// (another device of this backend's kind in this process, named as DLPack names it),
    /// into `dst` at `byte_offset`: device to device without the host, peer to peer where the
    /// pair allows it. The caller orders it after the source's writes and keeps the source
    /// unwritten until it ends ([`foreign_waits_for`](Backend::foreign_waits_for) both ways).
    /// `None`: this backend cannot, and core copies through the host.
    fn copy_from_peer(
        &self,
        dst: &dyn DeviceBuffer,
        byte_offset: usize,
        src: u64,
        peer: dlpark::ffi::DLDevice,
        len: usize,
        stream: StreamId,
    ) -> Option<Result<()>> {
        let _ = (dst, byte_offset, src, peer, len, stream);
        None
    }

    /// Whether [`allocate_pinned`](Backend::allocate_pinned) gives page-locked host memory.
    fn pins_host_memory(&self) -> bool {
        false
    }

    /// `bytes` of page-locked host memory that this device copies to and from without
    /// staging (CUDA's `cuMemHostAlloc`): its address, and what frees it when dropped. The
    /// memory of a [`Device::pinned_host`](crate::Device::pinned_host) device.
    fn allocate_pinned(&self, bytes: usize) -> Result<(u64, ForeignOwner)> {
        let _ = bytes;
        Err(no_pinned_memory(&self.name()))
    }

    /// Enqueues on `stream` a copy of `len` bytes of page-locked host memory at `src` (from
    /// [`allocate_pinned`](Backend::allocate_pinned)) into `dst` at `byte_offset`, without
    /// waiting, and returns an event recorded after it. The caller keeps the host memory
    /// alive and unwritten until the event completes.
    fn upload_pinned(
        &self,
        dst: &dyn DeviceBuffer,
        byte_offset: usize,
        src: u64,
        len: usize,
        stream: StreamId,
    ) -> Result<EventId> {
        let _ = (dst, byte_offset, src, len, stream);
        Err(no_pinned_memory(&self.name()))
    }

    /// Enqueues on `stream` a copy of `len` bytes of `src` from `byte_offset` into page-locked
    /// host memory at `dst`, without waiting, and returns an event recorded after it. The
    /// caller neither reads nor frees the host memory until the event completes.
    fn download_pinned(
        &self,
        src: &dyn DeviceBuffer,
        byte_offset: usize,
        dst: u64,
        len: usize,
        stream: StreamId,
    ) -> Result<EventId> {
        let _ = (src, byte_offset, dst, len, stream);
        Err(no_pinned_memory(&self.name()))
    }

    /// The allocator's statistics.
    fn memory_stats(&self) -> MemoryStats;
    /// Returns cached, unused blocks to the system.
    fn empty_cache(&self);

    /// A new stream.
    fn new_stream(&self) -> Result<StreamId>;
    /// Releases a stream created by `new_stream` (after its work completes).
    fn destroy_stream(&self, stream: StreamId);
    /// Records an event on `stream`, capturing all work enqueued there so far.
    fn record_event(&self, stream: StreamId) -> Result<EventId>;
    /// Makes later work on `stream` wait until `event` completes.
    fn wait_event(&self, stream: StreamId, event: EventId) -> Result<()>;
    /// Blocks the host until `event` completes.
    fn synchronize_event(&self, event: EventId) -> Result<()>;
    /// Milliseconds between two completed events.
    fn elapsed_ms(&self, start: EventId, end: EventId) -> Result<f64>;
    /// Milliseconds from `base` to each of `events` (all completed): the profiler's device
    /// timeline. A backend that can read many timestamps at once overrides it.
    fn event_times_ms(&self, base: EventId, events: &[EventId]) -> Result<Vec<f64>> {
        events.iter().map(|&e| self.elapsed_ms(base, e)).collect()
    }
    /// Releases an event.
    fn destroy_event(&self, event: EventId);
    /// Blocks the host until all work on `stream` completes.
    fn synchronize_stream(&self, stream: StreamId) -> Result<()>;
    /// Blocks the host until all work on the device completes.
    fn synchronize(&self) -> Result<()>;
}

/// One tensor operand of a launch: a buffer and the view of it to use.
///
/// ```
/// use strata_core::{Device, DType, Tensor};
/// let t = Tensor::zeros([2], DType::F32, &Device::cpu()).unwrap();
/// let op = t.operand().unwrap();
/// assert_eq!(op.layout.shape(), &[2]);
/// ```
#[derive(Debug, Clone)]
pub struct Operand {
    /// The storage.
    pub buffer: Arc<dyn DeviceBuffer>,
    /// Shape, strides (in elements) and offset of the view.
    pub layout: Layout,
    /// The element type.
    pub dtype: DType,
}

/// The run-time arguments of a launch: outputs, inputs and scalar values.
///
/// ```
/// use strata_core::{backend::KernelArgs, Scalar};
/// let args = KernelArgs { outputs: vec![], inputs: vec![], scalars: vec![Scalar::F32(1.0)] };
/// assert_eq!(args.scalars.len(), 1);
/// ```
#[derive(Debug, Clone)]
pub struct KernelArgs {
    /// Tensors written: output 0, then a multi-output map's further outputs (`Kernel::Map`'s
    /// `also`), a gather's range flag, or a reduction's row prologue's result.
    pub outputs: Vec<Operand>,
    /// Tensors read.
    pub inputs: Vec<Operand>,
    /// Scalar values, each of the dtype its `Node::Scalar` node says.
    pub scalars: Vec<Scalar>,
}

#[cfg(test)]
mod tests {
    #[test]
    fn parallel_copy_copies_every_byte_at_any_split() {
        for len in [0, 1, (2 << 20) - 1, (5 << 20) + 3, 17 << 20] {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
            let mut dst = vec![0u8; len];
            super::parallel_copy(&mut dst, &src);
            assert!(dst == src, "length {len}");
        }
    }
}
