//! The [`Tensor`] type: a view (layout + dtype) of shared device storage, its introspection,
//! and the one path by which core launches kernels.

use crate::backend::DeviceBuffer;
use crate::backend::EventId;
use crate::backend::{KernelArgs, Operand};
use crate::device::{Device, StreamHandle};
use crate::dtype::{DType, Scalar};
use crate::error::{Error, Result};
use crate::ir::ReduceOp;
use crate::ir::{Expr, Kernel};
use crate::layout::Layout;
use crate::lower::map_plan::iteration_order;
use crate::sync::LockUnpoisoned;
use std::panic::Location;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

/// Device memory shared by every view of it, with the streams that touched it last. Its
/// buffer exists once the storage is realized: a pending storage (lazy fusion) holds the
/// expression that will fill it instead.
pub(crate) struct Storage {
    buffer: OnceLock<Arc<dyn DeviceBuffer>>,
    /// The deferred work that fills this storage, until it runs (see [`Storage::pending`]).
    pending: Mutex<Option<Pending>>,
    /// Pending storages whose expressions read this one: they run before it is written (two
    /// inline: a link of a chain has one reader, and recording it allocates nothing here).
    readers: Mutex<smallvec::SmallVec<[Weak<Storage>; 2]>>,
    /// Size in bytes (known before a pending storage has its buffer).
    pub(crate) bytes: usize,
    /// The fused kernel that computed it, for `explain` (boxed: set once a kernel runs, and
    /// a large value inline would be copied with every storage a recorded op makes).
    pub(crate) ran: OnceLock<Box<RunRecord>>,
    /// The thread (its [`thread_token`]) recording the kernel that fills this storage, from
    /// the moment the buffer is set until that kernel is enqueued; 0 when none. Another
    /// thread's use waits for it, or its kernel would be enqueued before the write.
    filling: AtomicU64,
    /// Why the launch of its pending work failed (its buffer then holds nothing valid): the
    /// error itself, returned again at every use.
    failed: OnceLock<Error>,
    pub(crate) device: Device,
    /// Memory another library lent read-only (DLPack): no kernel may write it.
    pub(crate) read_only: bool,
    access: Mutex<Access>,
    /// An asynchronous copy to or from this (pinned host) storage is in flight: the host
    /// waits for it before any use of the buffer, and before freeing it.
    fenced: AtomicBool,
    /// Bumped by every write into the storage after it was created: autograd checks that
    /// what a backward function saved was not overwritten since.
    version: AtomicU64,
    /// The fused kernel that computed its value (stored, or spliced into that kernel and
    /// never stored): the graph picture groups the ops one kernel ran.
    pub(crate) computed_in: Arc<OnceLock<u64>>,
}

/// A number for the calling thread, never 0: a hash of its `ThreadId`, kept per thread. (Not a
/// counter of our own: a notebook kernel links a copy of strata into every cell's library,
/// each with its own statics, while `ThreadId` comes from the one std all cells share; each
/// copy's cache holds the same hash.)
fn thread_token() -> u64 {
    thread_local! {
        static TOKEN: u64 = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            std::thread::current().id().hash(&mut h);
            h.finish().max(1)
        };
    }
    TOKEN.with(|t| *t)
}

impl Drop for Storage {
    fn drop(&mut self) {
        // Page-locked memory goes back only once the copy that uses it is done.
        if *self.fenced.get_mut() {
            let _ = self.wait_for_copy();
        }
    }
}

/// The stream of the last write, and the other streams that read since: what a new read
/// (the write) or a new write (all of them) must be ordered after.
struct Access {
    last_write: Arc<StreamHandle>,
    readers: Vec<Arc<StreamHandle>>,
    /// The asynchronous copy in flight on a pinned host storage.
    copy: Option<Fence>,
}

impl Storage {
    fn new(buffer: Arc<dyn DeviceBuffer>, device: Device, stream: Arc<StreamHandle>) -> Storage {
        let bytes = buffer.len_bytes();
        Storage::with(OnceLock::from(buffer), None, bytes, device, stream)
    }

    /// A storage of `bytes` bytes whose contents `pending` computes when first needed.
    pub(crate) fn new_pending(pending: Pending, bytes: usize, device: Device) -> Storage {
        let stream = pending.stream.clone();
        Storage::with(OnceLock::new(), Some(pending), bytes, device, stream)
    }

    fn with(
        buffer: OnceLock<Arc<dyn DeviceBuffer>>,
        pending: Option<Pending>,
        bytes: usize,
        device: Device,
        stream: Arc<StreamHandle>,
    ) -> Storage {
        Storage {
            buffer,
            pending: Mutex::new(pending),
            readers: Mutex::new(smallvec::SmallVec::new()),
            bytes,
            ran: OnceLock::new(),
            failed: OnceLock::new(),
            device,
            read_only: false,
            access: Mutex::new(Access {
                last_write: stream,
                readers: Vec::new(),
                copy: None,
            }),
            fenced: AtomicBool::new(false),
            version: AtomicU64::new(0),
            computed_in: Arc::new(OnceLock::new()),
            filling: AtomicU64::new(0),
        }
    }

    /// How many writes the storage has had since it was created.
    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Notes an asynchronous copy in flight on this pinned host storage: every later use of
    /// its buffer on the host, and its release, waits for `fence` first.
    pub(crate) fn set_copy_fence(&self, fence: Fence) -> Result<()> {
        let earlier = self.access().copy.replace(fence);
        self.fenced.store(true, Ordering::Release);
        earlier.map_or(Ok(()), |f| f.wait())
    }

    /// Waits for the asynchronous copy in flight on this storage, if there is one.
    fn wait_for_copy(&self) -> Result<()> {
        let fence = self.access().copy.take();
        self.fenced.store(false, Ordering::Release);
        fence.map_or(Ok(()), |f| f.wait())
    }

    /// The deferred work that fills this storage, locked (`None` once it has run or for a
    /// storage that never had any).
    pub(crate) fn pending(&self) -> MutexGuard<'_, Option<Pending>> {
        // A poisoned lock only means a panic elsewhere; the work inside is still whole.
        self.pending.lock_unpoisoned()
    }

    /// [`pending`](Self::pending) unless another thread holds it now: a flush that takes
    /// trees beside its own (`fusion::siblings`) skips a busy one rather than wait, since
    /// waiting across trees, not from a tree to its inputs, could deadlock.
    pub(crate) fn try_pending(&self) -> Option<MutexGuard<'_, Option<Pending>>> {
        match self.pending.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// The buffer, once it exists: a realized storage's, without running or waiting for
    /// anything (for planning a launch, not for reading it).
    pub(crate) fn buffer_if_realized(&self) -> Option<Arc<dyn DeviceBuffer>> {
        self.buffer.get().cloned()
    }

    /// The buffer, running the pending work first if there is any (the fused kernel that
    /// fills it), and waiting for an asynchronous copy in flight on it.
    pub(crate) fn realized_buffer(self: &Arc<Storage>) -> Result<Arc<dyn DeviceBuffer>> {
        if let Some(why) = self.failed.get() {
            return Err(why.clone());
        }
        if let Some(b) = self.buffer.get() {
            self.wait_until_filled();
            if self.fenced.load(Ordering::Acquire) {
                self.wait_for_copy()?;
            }
            return Ok(b.clone());
        }
        self.run_pending_work()?;
        self.buffer.get().cloned().ok_or_else(|| {
            Error::Invalid("a pending tensor's work could not run (see the earlier error)".into())
        })
    }

    /// Sets the buffer of a pending storage as its work is launched; other threads wait to use
    /// it until [`filled`](Storage::filled) says the kernel that writes it is enqueued.
    pub(crate) fn set_buffer(&self, buffer: Arc<dyn DeviceBuffer>) {
        self.filling.store(thread_token(), Ordering::Release);
        let _ = self.buffer.set(buffer);
    }

    /// Notes the end of the launch that fills this storage: its error if it failed (every
    /// later use returns it; the buffer holds nothing valid), and that the buffer is
    /// everyone's to use.
    pub(crate) fn filled(&self, launch: &Result<()>) {
        if let Err(e) = launch {
            let _ = self.failed.set(e.clone());
        }
        self.filling.store(0, Ordering::Release);
    }

    /// Waits while another thread records the kernel that fills this storage (microseconds;
    /// a first launch's compile at most).
    fn wait_until_filled(&self) {
        let filler = self.filling.load(Ordering::Acquire);
        if filler == 0 || filler == thread_token() {
            return;
        }
        let mut spins = 0u32;
        while self.filling.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins < 1000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
    }

    /// True while the storage's work is deferred.
    pub(crate) fn is_pending(&self) -> bool {
        self.buffer.get().is_none()
    }

    /// Notes that the pending storage `reader` reads this one.
    pub(crate) fn add_reader(&self, reader: &Arc<Storage>) {
        let mut readers = self.readers.lock_unpoisoned();
        // Amortized pruning keeps a tensor read by many (dropped or realized) trees small.
        if readers.len() >= 16 && readers.len().is_power_of_two() {
            readers.retain(|w| w.upgrade().is_some_and(|r| r.is_pending()));
        }
        readers.push(Arc::downgrade(reader));
    }

    /// The pending trees that read this storage, each once (a tree that reads it twice,
    /// `x * x`, noted itself twice), oldest first.
    pub(crate) fn live_readers(&self) -> Vec<Arc<Storage>> {
        let readers = self.readers.lock_unpoisoned();
        let mut live: Vec<Arc<Storage>> = Vec::with_capacity(readers.len());
        for r in readers.iter().filter_map(Weak::upgrade) {
            if r.is_pending() && !live.iter().any(|l| Arc::ptr_eq(l, &r)) {
                live.push(r);
            }
        }
        live
    }

    /// Runs every pending tree that reads this storage, before a write to it: the device's
    /// whole flush when there is one (so each tree fuses what only it holds), then any reader
    /// still pending.
    pub(crate) fn run_pending_readers(&self) -> Result<()> {
        if self.live_readers().is_empty() {
            return Ok(());
        }
        self.device.flush()?;
        for r in self.live_readers() {
            r.realized_buffer()?;
        }
        Ok(())
    }

    fn access(&self) -> std::sync::MutexGuard<'_, Access> {
        self.access.lock_unpoisoned()
    }

    fn last_write(&self) -> Arc<StreamHandle> {
        self.access().last_write.clone()
    }

    /// The streams a new access on `current` must wait for: the last writer, and for a write
    /// also the readers since, when they are other streams of the same backend.
    fn to_wait_for(&self, current: &Arc<StreamHandle>, write: bool) -> Vec<Arc<StreamHandle>> {
        let access = self.access();
        let readers = if write { &access.readers[..] } else { &[] };
        std::iter::once(&access.last_write)
            .chain(readers)
            // Another device here can only be another CPU device, which runs synchronously.
            .filter(|s| s.id != current.id && Arc::ptr_eq(&s.backend, &current.backend))
            .cloned()
            .collect()
    }

    pub(crate) fn note_read(&self, stream: &Arc<StreamHandle>) {
        let mut access = self.access();
        if access.last_write.id != stream.id && !access.readers.iter().any(|r| r.id == stream.id) {
            access.readers.push(stream.clone());
        }
    }

    pub(crate) fn note_write(&self, stream: &Arc<StreamHandle>) {
        let mut access = self.access();
        access.last_write = stream.clone();
        access.readers.clear();
    }
}

/// The pending state of a storage (lazy fusion, `crate::fusion`, which decides and runs it):
/// kept here beside `Storage`, since a pending tree holds the tensors it reads.
/// Deferred work that fills a pending storage, with what every kind of it shares: the result's
/// layout and dtype, the stream it runs on, and the user op that made it.
pub(crate) struct Pending {
    /// What runs.
    pub(crate) work: PendingWork,
    /// The layout the result is written with (dense, offset 0).
    pub(crate) layout: Layout,
    /// The result's dtype.
    pub(crate) dtype: DType,
    /// The stream the op was issued on: the kernel runs there.
    pub(crate) stream: Arc<StreamHandle>,
    /// The user op that made it (`add`, `relu`, ...), for `explain` and the profiler.
    pub(crate) op: &'static str,
    /// Where the user called it (ops carry `#[track_caller]` down to `record`).
    pub(crate) call_site: &'static Location<'static>,
}

/// The two kinds of deferred work.
pub(crate) enum PendingWork {
    /// An elementwise tree: spliced into the trees that read it, run as one map kernel.
    Tree(Tree),
    /// A reduction: it never splices into a tree; it runs when read, inside the kernel of a
    /// later reduction that reads it (a maximum or minimum: `fusion::reduce::row_prologue_of`),
    /// or with elementwise work over its rows that reads it (a reduction of a pending tree:
    /// `fusion::reduce::epilogue_of`).
    Reduce(DeferredReduce),
}

/// An elementwise tree waiting to run.
pub(crate) struct Tree {
    /// The value of each element, over `inputs` and `scalars`.
    pub(crate) expr: Expr,
    /// Views the expression reads, with the result's shape (realized or pending).
    pub(crate) inputs: Vec<Tensor>,
    /// Launch scalars.
    pub(crate) scalars: Vec<Scalar>,
    /// Expression nodes of the whole tree this node would fuse (an upper bound).
    pub(crate) nodes: usize,
    /// The distinct tensor inputs of that tree, as the kernel would bind them (a chain that
    /// reads one tensor at every step binds it once, so it grows until `MAX_NODES`); `None`:
    /// no input is spliced in, so they are `inputs` themselves.
    pub(crate) leaves: Option<Leaves>,
}

impl Pending {
    /// The tree, unless this is a deferred reduction.
    pub(crate) fn tree(&self) -> Option<&Tree> {
        match &self.work {
            PendingWork::Tree(t) => Some(t),
            PendingWork::Reduce(_) => None,
        }
    }
}

/// A reduction whose launch waits for its first use: a later reduction over the same rows
/// that reads it one value per output computes both in one kernel
/// ([`RowPrologue`](crate::ir::RowPrologue)), and elementwise work over the rows that reads
/// it runs in its kernel ([`RowEpilogue`](crate::ir::RowEpilogue)), reading the rows once.
pub(crate) struct DeferredReduce {
    /// What it combines: an order-free op over a realized `source` (the fused kernel computes
    /// the eager value), or any but an arg op over a pending tree (`defer_map_reduce`).
    pub(crate) op: ReduceOp,
    /// Trailing axes of `source` reduced.
    pub(crate) reduced_axes: usize,
    /// The accumulation dtype.
    pub(crate) acc: DType,
    /// The input, its axes permuted as the reduction reads them (kept, then reduced); a
    /// pending tree (its axes in order) is read by the kernel directly (map→reduce).
    pub(crate) source: Tensor,
    /// The order the kernel reads `source`'s axes in (kept, then the last `reduced_axes`):
    /// the identity, but for a reduction of a pending tree over other axes, kept for a kernel
    /// that also stores the tree (`Kernel::Reduce { stores_map }`; a bias gradient's column
    /// sum).
    pub(crate) order: Vec<usize>,
}

/// What a fused kernel that ran was made of, kept on the tensors it wrote for `explain`.
#[derive(Debug, Clone)]
pub(crate) struct RunRecord {
    pub(crate) expr: Expr,
    pub(crate) ops: Vec<&'static str>,
    pub(crate) call_sites: Vec<&'static Location<'static>>,
    pub(crate) inputs: Vec<(Layout, DType)>,
    pub(crate) output: (Layout, DType),
    /// The intermediates it stored as well: expression, layout, dtype.
    pub(crate) also: Vec<(Expr, Layout, DType)>,
    pub(crate) scalars: usize,
}

/// A tensor input of a fused kernel: its storage (by address), view and dtype, as fusion
/// tells inputs apart.
pub(crate) type Leaf = (usize, Layout, DType);

/// The distinct leaves of a tree, as many as the backend binds beside one output
/// ([`Target::max_bindings`](crate::target::Target::max_bindings); past that the
/// inputs run first); shared with a child whose leaves
/// are all of them (a chain reading the same tensors copies none).
pub(crate) type Leaves = Arc<Vec<Leaf>>;

/// An asynchronous copy in flight on a pinned host storage: the event `device` recorded
/// after it.
pub(crate) struct Fence {
    device: Device,
    event: EventId,
}

impl Fence {
    /// The copy that `device` finishes at `event`.
    pub(crate) fn new(device: Device, event: EventId) -> Fence {
        Fence { device, event }
    }

    /// Blocks the host until the copy is done.
    pub(crate) fn wait(self) -> Result<()> {
        let backend = self.device.backend();
        let done = backend.synchronize_event(self.event);
        backend.destroy_event(self.event);
        done
    }
}

/// An n-dimensional array on a [`Device`]: shared storage seen through a [`Layout`] with a
/// [`DType`]. `clone()` is cheap and shares storage, like every view.
///
/// Ops are asynchronous on GPU backends: they enqueue work and return. Reading on the host
/// (`to_vec`, `item`, `Display`) waits for exactly the work the tensor needs.
///
/// ```
/// use strata_core::{s, Device, DType, Tensor};
/// let dev = Device::cpu();
/// let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3], &dev).unwrap();
/// let col = t.slice(s![.., 1]).unwrap();
/// assert_eq!(col.to_vec::<f32>().unwrap(), vec![2.0, 5.0]);
/// col.fill(0.0).unwrap(); // writes through to t
/// assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 0.0, 3.0, 4.0, 0.0, 6.0]);
/// ```
#[derive(Clone)]
pub struct Tensor {
    pub(crate) storage: Arc<Storage>,
    pub(crate) layout: Layout,
    pub(crate) dtype: DType,
    /// Its place in the backward graph, when it requires a gradient: `crate::autograd`'s
    /// metadata, opaque here (autograd builds on tensors, so tensors name none of its types).
    pub(crate) autograd: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

/// A tensor's memory, layout and last writer without its device handle, for what a device
/// keeps about its own tensors (a [`Tensor`] there would keep the device alive through itself).
pub(crate) struct DeviceFree {
    operand: Operand,
    writer: Arc<StreamHandle>,
}

impl DeviceFree {
    /// The tensor again, on `device` (the one it came from), ordered after its last writer.
    pub(crate) fn on(self, device: &Device) -> Tensor {
        let Operand {
            buffer,
            layout,
            dtype,
        } = self.operand;
        Tensor {
            storage: Arc::new(Storage::new(buffer, device.clone(), self.writer)),
            layout,
            dtype,
            autograd: None,
        }
    }
}

impl Tensor {
    /// A new tensor with unspecified contents (like `torch.empty`): do not read it before
    /// writing it. On the CPU backend the memory happens to be zeroed.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::empty([2, 3], DType::U8, &Device::cpu()).unwrap();
    /// assert_eq!(t.nbytes(), 6);
    /// ```
    pub fn empty(
        dims: impl crate::layout::IntoDims,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let shape = crate::layout::shape_arg(dims)?;
        Tensor::alloc(&shape, dtype, device)
    }

    pub(crate) fn alloc(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::alloc_with_layout(Layout::contiguous(shape)?, dtype, device)
    }

    /// A new tensor with `layout`, which must be dense with offset 0 (a permutation of a
    /// contiguous layout).
    pub(crate) fn alloc_with_layout(
        layout: Layout,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        device.backend().check_dtype(dtype)?;
        let shape = layout.shape().to_vec();
        let bytes = layout
            .numel()
            .checked_mul(dtype.itemsize())
            .ok_or_else(|| {
                Error::Shape(format!("{shape:?} of {dtype} overflows the byte count"))
            })?;
        let stream = device.current_handle();
        let buffer = device.allocate_buffer(bytes, stream.id)?;
        Ok(Tensor {
            storage: Arc::new(Storage::new(buffer, device.clone(), stream)),
            layout,
            dtype,
            autograd: None,
        })
    }

    /// A tensor over a buffer another library lent (a DLPack import).
    pub(crate) fn from_foreign(
        buffer: Arc<dyn DeviceBuffer>,
        layout: Layout,
        dtype: DType,
        device: &Device,
        read_only: bool,
    ) -> Tensor {
        let mut storage = Storage::new(buffer, device.clone(), device.current_handle());
        storage.read_only = read_only;
        Tensor {
            storage: Arc::new(storage),
            layout,
            dtype,
            autograd: None,
        }
    }

    /// A view of the same storage with another layout (checked to lie inside the storage).
    pub(crate) fn with_layout(&self, layout: Layout) -> Tensor {
        Tensor {
            storage: self.storage.clone(),
            layout,
            dtype: self.dtype,
            autograd: None,
        }
    }

    /// The size of each axis.
    ///
    /// ```
    /// let t = strata_core::Tensor::zeros([4, 2], strata_core::DType::F32, &strata_core::Device::cpu()).unwrap();
    /// assert_eq!(t.shape(), &[4, 2]);
    /// ```
    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }

    /// The step, in elements, between neighbours along each axis (0 for broadcast axes,
    /// negative for reversed ones).
    ///
    /// ```
    /// let t = strata_core::Tensor::zeros([4, 2], strata_core::DType::F32, &strata_core::Device::cpu()).unwrap();
    /// assert_eq!(t.strides(), &[2, 1]);
    /// ```
    pub fn strides(&self) -> &[isize] {
        self.layout.strides()
    }

    /// The position of element `[0, ...]` in the storage, in elements.
    ///
    /// ```
    /// use strata_core::{s, Device, DType, Tensor};
    /// let t = Tensor::zeros([4, 2], DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.slice(s![1..]).unwrap().offset(), 2);
    /// ```
    pub fn offset(&self) -> usize {
        self.layout.offset()
    }

    /// The number of axes.
    ///
    /// ```
    /// let t = strata_core::Tensor::zeros([4, 2], strata_core::DType::F32, &strata_core::Device::cpu()).unwrap();
    /// assert_eq!(t.ndim(), 2);
    /// ```
    pub fn ndim(&self) -> usize {
        self.layout.ndim()
    }

    /// The number of elements.
    ///
    /// ```
    /// let t = strata_core::Tensor::zeros([4, 2], strata_core::DType::F32, &strata_core::Device::cpu()).unwrap();
    /// assert_eq!(t.numel(), 8);
    /// ```
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }

    /// True when the elements lie in row-major order without gaps.
    ///
    /// ```
    /// let t = strata_core::Tensor::zeros([4, 2], strata_core::DType::F32, &strata_core::Device::cpu()).unwrap();
    /// assert!(t.is_contiguous() && !t.t().unwrap().is_contiguous());
    /// ```
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// Bytes per element.
    ///
    /// ```
    /// let t = strata_core::Tensor::zeros([3], strata_core::DType::I16, &strata_core::Device::cpu()).unwrap();
    /// assert_eq!(t.itemsize(), 2);
    /// ```
    pub fn itemsize(&self) -> usize {
        self.dtype.itemsize()
    }

    /// Bytes of the elements in this view (`numel × itemsize`).
    ///
    /// ```
    /// let t = strata_core::Tensor::zeros([3], strata_core::DType::I16, &strata_core::Device::cpu()).unwrap();
    /// assert_eq!(t.nbytes(), 6);
    /// ```
    pub fn nbytes(&self) -> usize {
        self.numel() * self.itemsize()
    }

    /// Bytes of the whole storage this view looks into (known before pending work runs).
    pub(crate) fn storage_bytes(&self) -> usize {
        self.storage.bytes
    }

    /// The element type.
    ///
    /// ```
    /// let t = strata_core::Tensor::zeros([3], strata_core::DType::I16, &strata_core::Device::cpu()).unwrap();
    /// assert_eq!(t.dtype(), strata_core::DType::I16);
    /// ```
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device holding the storage.
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// let t = strata_core::Tensor::zeros([3], strata_core::DType::I16, &dev).unwrap();
    /// assert_eq!(t.device(), &dev);
    /// ```
    pub fn device(&self) -> &Device {
        &self.storage.device
    }

    /// Shape, strides and offset together.
    ///
    /// ```
    /// let t = strata_core::Tensor::zeros([3], strata_core::DType::I16, &strata_core::Device::cpu()).unwrap();
    /// assert_eq!(t.layout().numel(), 3);
    /// ```
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// True when both tensors are views of the same storage.
    ///
    /// ```
    /// use strata_core::{s, Device, DType, Tensor};
    /// let t = Tensor::zeros([4], DType::F32, &Device::cpu()).unwrap();
    /// assert!(t.shares_storage(&t.slice(s![1..]).unwrap()));
    /// assert!(!t.shares_storage(&t.copy().unwrap()));
    /// ```
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// This view as a kernel operand (for backends and tests of backends): its buffer, which
    /// runs the tensor's pending work first (lazy fusion), its layout and dtype.
    ///
    /// ```
    /// let t = strata_core::Tensor::zeros([3], strata_core::DType::I16, &strata_core::Device::cpu()).unwrap();
    /// assert_eq!(t.operand().unwrap().dtype, strata_core::DType::I16);
    /// ```
    pub fn operand(&self) -> Result<Operand> {
        Ok(Operand {
            buffer: self.realized_buffer()?,
            layout: self.layout.clone(),
            dtype: self.dtype,
        })
    }

    /// This view's memory without its device handle (see [`DeviceFree`]); runs its pending
    /// work first.
    pub(crate) fn device_free(&self) -> Result<DeviceFree> {
        Ok(DeviceFree {
            operand: self.operand()?,
            writer: self.storage.last_write(),
        })
    }

    /// The storage's buffer, running pending work first (lazy fusion).
    pub(crate) fn realized_buffer(&self) -> Result<Arc<dyn DeviceBuffer>> {
        self.storage.realized_buffer()
    }

    /// Makes `current` wait for the work on other streams that this access must follow: the
    /// last write to the storage, and for a write also the reads since (which must not see
    /// the new values).
    pub(crate) fn order_access(&self, current: &Arc<StreamHandle>, write: bool) -> Result<()> {
        for other in self.storage.to_wait_for(current, write) {
            let backend = self.device().backend();
            let event = backend.record_event(other.id)?;
            let waited = backend.wait_event(current.id, event);
            backend.destroy_event(event);
            waited?;
        }
        Ok(())
    }

    /// The stream that last wrote this tensor's storage: what a host read must wait for.
    pub(crate) fn storage_last_writer(&self) -> crate::backend::StreamId {
        self.storage.last_write().id
    }

    /// An `Err` unless `other` lives on this tensor's device.
    pub(crate) fn same_device(&self, other: &Tensor, what: &str) -> Result<()> {
        let (a, b) = (self.device(), other.device());
        if !a.shares_memory_with(b) {
            let note = if a.name() == b.name() {
                " (two separately created devices of one kind: create it once and share it)"
            } else {
                ""
            };
            return Err(Error::DeviceMismatch(format!(
                "{what}: the tensors are on different devices, {} and {}{note}; \
                 move one with to_device",
                a.name(),
                b.name()
            )));
        }
        Ok(())
    }
}

/// An `Err` naming the view when two of its indices share a storage position (a broadcast
/// view), since writing it would write one element several times.
fn check_writable(out: &Tensor) -> Result<()> {
    if out.storage.read_only {
        return Err(Error::Invalid(format!(
            "cannot write into a read-only tensor (shape {:?}, {}): its DLPack producer lent it \
             read-only; write into a copy (t.copy()) instead",
            out.shape(),
            out.dtype
        )));
    }
    if out.layout.has_internal_overlap() {
        return Err(Error::Invalid(format!(
            "cannot write into a view whose elements overlap in memory (shape {:?}, strides {:?}); \
             write into a contiguous copy instead",
            out.shape(),
            out.strides()
        )));
    }
    Ok(())
}

/// Launches `kernel` writing `out` on the current stream (a map's inputs have `out`'s shape:
/// broadcast views). This is the one place core orders work across streams and checks what
/// every write must satisfy.
pub(crate) fn launch(
    kernel: Kernel,
    out: &Tensor,
    inputs: &[&Tensor],
    scalars: Vec<Scalar>,
) -> Result<()> {
    let stream = out.device().current_handle();
    launch_on(kernel, out, &[], inputs, scalars, &stream, Write::Existing)
}

/// [`launch`] of a kernel that also writes `also` (a gather's range flag; a multi-output
/// map's further outputs, such as an optimizer's state), each checked and ordered like `out`.
pub(crate) fn launch_writing(
    kernel: Kernel,
    out: &Tensor,
    also: &[&Tensor],
    inputs: &[&Tensor],
    scalars: Vec<Scalar>,
) -> Result<()> {
    let stream = out.device().current_handle();
    launch_on(kernel, out, also, inputs, scalars, &stream, Write::Existing)
}

/// What a launch writes into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Write {
    /// A storage that may have readers: pending trees that read it run before it is written.
    Existing,
    /// A pending storage being realized by this launch (fusion holds its pending lock): no
    /// pending tree can need its old values, since it has none.
    Fresh,
}

/// [`launch`] on `stream`, writing the further outputs `also` too (see [`launch_writing`]).
pub(crate) fn launch_on(
    kernel: Kernel,
    out: &Tensor,
    also: &[&Tensor],
    inputs: &[&Tensor],
    scalars: Vec<Scalar>,
    stream: &Arc<StreamHandle>,
    write: Write,
) -> Result<()> {
    check_writable(out)?;
    // Deferred work runs before this kernel is enqueued: the inputs' own, and any pending
    // tree that reads a storage about to be written (it must see the old values).
    for t in inputs {
        t.realize()?;
    }
    // A map's further outputs are existing tensors too (an optimizer's state); a reduction's
    // is the row statistic this launch realizes, whose readers wait for it.
    let map = matches!(kernel, Kernel::Map { .. });
    if write == Write::Existing {
        for t in std::iter::once(&out).chain(also.iter().filter(|_| map)) {
            check_writable(t)?;
            t.storage.run_pending_readers()?;
            t.storage.version.fetch_add(1, Ordering::AcqRel);
        }
    }
    out.realize()?;
    // A map that does not read the position may visit elements in any order: its operands
    // with their axes in the output's memory order, so a permuted output (and inputs and
    // further outputs laid out like it) reach the backend contiguous.
    let order = match &kernel {
        Kernel::Map { expr, also } => {
            let positional = std::iter::once(expr)
                .chain(also)
                .any(Expr::reads_linear_index);
            iteration_order(positional, &out.layout)
        }
        _ => None,
    };
    if let Some(order) = order {
        let permute = |ts: &[&Tensor]| {
            ts.iter()
                .map(|t| Ok(t.with_layout(t.layout.permuted(&order)?)))
                .collect::<Result<Vec<_>>>()
        };
        let (out_p, also_p, ins) = (permute(&[out])?, permute(also)?, permute(inputs)?);
        let refs: Vec<&Tensor> = ins.iter().collect();
        let also_refs: Vec<&Tensor> = also_p.iter().collect();
        return launch_ordered(kernel, &out_p[0], &also_refs, &refs, scalars, stream, write);
    }
    launch_ordered(kernel, out, also, inputs, scalars, stream, write)
}

/// `launch` after the checks and the choice of axis order.
fn launch_ordered(
    kernel: Kernel,
    out: &Tensor,
    also: &[&Tensor],
    inputs: &[&Tensor],
    scalars: Vec<Scalar>,
    stream: &Arc<StreamHandle>,
    write: Write,
) -> Result<()> {
    let device = out.device();
    let mut copies = Vec::new();
    // A reduction's row epilogue reads the reduction's own result on purpose.
    let reads_result = match &kernel {
        Kernel::Reduce {
            epilogue: Some(e), ..
        } => Some(e.result),
        _ => None,
    };
    for (k, t) in inputs.iter().enumerate() {
        out.same_device(t, "cannot combine tensors")?;
        // Reading a differently-laid-out view of a storage being written could see
        // elements this kernel already overwrote: read from a copy instead. (A map's further
        // outputs count too; a reduction's row prologue reads its own further output, the
        // row statistic, on purpose.) A matmul reads every operand element many times while
        // writing C, so it takes a copy of an operand that shares C's storage in any layout
        // (`gemm` into one of its operands).
        let map = matches!(kernel, Kernel::Map { .. });
        let matmul = matches!(kernel, Kernel::Matmul { .. });
        let overwritten = reads_result != Some(k)
            && std::iter::once(&out)
                .chain(also.iter().filter(|_| map))
                .any(|o| t.shares_storage(o) && (t.layout != o.layout || matmul));
        if overwritten {
            copies.push(Some(t.copy()?));
        } else {
            copies.push(None);
        }
    }
    let inputs: Vec<&Tensor> = inputs
        .iter()
        .zip(&copies)
        .map(|(t, c)| c.as_ref().unwrap_or(t))
        .collect();
    for t in &inputs {
        t.realize()?;
        t.order_access(stream, false)?;
    }
    out.order_access(stream, true)?;
    for t in also {
        t.realize()?;
        t.order_access(stream, true)?;
    }
    let args = KernelArgs {
        outputs: std::iter::once(out)
            .chain(also.iter().copied())
            .map(|t| t.operand())
            .collect::<Result<Vec<_>>>()?,
        inputs: inputs
            .iter()
            .map(|t| t.operand())
            .collect::<Result<Vec<_>>>()?,
        scalars,
    };
    // The user ops a fused kernel ran name it in the profile. An existing storage's record
    // tells how it was first computed, not what writes it now (an optimizer's step into a
    // parameter made by `randn`): such a launch goes by its kernel's name.
    device.run_kernel(&kernel, &args, stream.id, || {
        let ran = out.storage.ran.get().filter(|_| write == Write::Fresh)?;
        Some(ran.ops.iter().map(|op| op.to_string()).collect())
    })?;
    for t in &inputs {
        t.storage.note_read(stream);
    }
    out.storage.note_write(stream);
    for t in also {
        t.storage.note_write(stream);
    }
    if device.blocking() {
        device.backend().synchronize_stream(stream.id)?;
    }
    Ok(())
}
