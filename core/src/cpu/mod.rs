//! The CPU reference backend: the oracle every other backend is compared with. Work runs
//! when it is enqueued, so streams are only names here and events record host times, but
//! callers go through the same asynchronous API as on a GPU.

mod block;
mod buffer;
mod convolution;
mod histogram;
mod index;
mod layer_norm;
mod map;
mod matmul;
mod moments;
mod reduce;
mod softmax;
mod strided;

pub use buffer::CpuBuffer;

use crate::backend::KernelArgs;
use crate::backend::{
    Backend, BackendKind, DeviceBuffer, EventId, ForeignOwner, MemoryStats, StreamId,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::Kernel;
use crate::lower::program::{Lanes, Program};
use crate::sync::LockUnpoisoned;
use crate::target::Target;
use buffer::Pool;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The CPU backend. Create devices with [`Device::cpu`](crate::Device::cpu).
///
/// ```
/// use strata_core::{cpu::CpuBackend, Backend, BackendKind};
/// let b = CpuBackend::new();
/// assert_eq!(b.kind(), BackendKind::Cpu);
/// assert!(b.check_dtype(strata_core::DType::BF16).is_ok());
/// ```
#[derive(Debug)]
pub struct CpuBackend {
    pool: Arc<Pool>,
    /// What core's planners and fusion know of this backend.
    target: Target,
    next_id: AtomicU64,
    events: Mutex<HashMap<u64, Instant>>,
    /// The GPU backend whose page-locked memory this backend's buffers are (a
    /// [`Device::pinned_host`](crate::Device::pinned_host) device), and its name.
    pinned_by: Option<(Arc<dyn Backend>, String)>,
}

impl CpuBackend {
    /// A new CPU backend with its own allocation statistics.
    ///
    /// ```
    /// let b = strata_core::cpu::CpuBackend::new();
    /// use strata_core::Backend;
    /// assert_eq!(b.memory_stats().allocated, 0);
    /// ```
    pub fn new() -> CpuBackend {
        CpuBackend {
            pool: Arc::default(),
            target: Target::cpu(strided::threads()),
            next_id: AtomicU64::new(1),
            events: Mutex::default(),
            pinned_by: None,
        }
    }

    /// A CPU backend whose buffers are page-locked memory of `gpu` (see
    /// [`Device::pinned_host`](crate::Device::pinned_host)); `Err` when `gpu` has none.
    ///
    /// ```
    /// use strata_core::{cpu::CpuBackend, Device};
    /// let err = CpuBackend::pinned(Device::cpu().backend().clone()).unwrap_err();
    /// assert!(err.to_string().contains("pinned"));
    /// ```
    pub fn pinned(gpu: Arc<dyn Backend>) -> Result<CpuBackend> {
        if !gpu.pins_host_memory() {
            // The backend's own `Err`, which names it.
            gpu.allocate_pinned(0)?;
        }
        let name = gpu.name();
        Ok(CpuBackend {
            pinned_by: Some((gpu, name)),
            ..CpuBackend::new()
        })
    }

    fn fresh_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn event_time(&self, e: EventId) -> Result<Instant> {
        self.events
            .lock_unpoisoned()
            .get(&e.0)
            .copied()
            .ok_or_else(|| Error::Invalid(format!("event {} does not exist on cpu", e.0)))
    }
}

impl Default for CpuBackend {
    fn default() -> CpuBackend {
        CpuBackend::new()
    }
}

impl Backend for CpuBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn map_source(
        &self,
        expr: &crate::ir::Expr,
        also: &[crate::ir::Expr],
        args: &KernelArgs,
    ) -> Result<Option<crate::backend::KernelSource>> {
        let n = args.outputs.first().map_or(0, |o| o.layout.numel());
        if n == 0 {
            return Ok(None);
        }
        let threads = if n >= strided::PARALLEL_MIN {
            format!(", split over {} threads", strided::threads())
        } else {
            String::new()
        };
        Ok(Some(crate::backend::KernelSource {
            language: "CPU evaluation plan".into(),
            launch: format!(
                "{n} elements, each value evaluated over blocks of {} elements{threads}",
                strided::BLOCK
            ),
            source: Program::build(
                &std::iter::once(expr)
                    .chain(also)
                    .cloned()
                    .collect::<Vec<_>>(),
                Lanes::one(),
            )
            .to_string(),
        }))
    }

    fn name(&self) -> String {
        match &self.pinned_by {
            Some((_, gpu)) => format!("cpu (pinned for {gpu})"),
            None => "cpu".into(),
        }
    }

    fn check_dtype(&self, _dtype: DType) -> Result<()> {
        Ok(())
    }

    fn allocate(&self, bytes: usize, _: StreamId) -> Result<Arc<dyn DeviceBuffer>> {
        if let Some((gpu, _)) = &self.pinned_by {
            let pinned = CpuBuffer::pinned(bytes, self.pool.clone(), |n| gpu.allocate_pinned(n))?;
            return Ok(Arc::new(pinned));
        }
        Ok(Arc::new(CpuBuffer::new(bytes, self.pool.clone())?))
    }

    fn upload(
        &self,
        dst: &dyn DeviceBuffer,
        offset: usize,
        data: &[u8],
        _: StreamId,
    ) -> Result<()> {
        let buf = CpuBuffer::of(dst)?;
        buf.range_check(offset, data.len())?;
        // SAFETY: range checked; the source is host memory distinct from the buffer.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf.ptr().add(offset), data.len()) };
        Ok(())
    }

    fn download(
        &self,
        src: &dyn DeviceBuffer,
        offset: usize,
        out: &mut [u8],
        _: StreamId,
    ) -> Result<()> {
        let buf = CpuBuffer::of(src)?;
        buf.range_check(offset, out.len())?;
        // SAFETY: range checked.
        out.copy_from_slice(unsafe {
            std::slice::from_raw_parts(buf.ptr().add(offset), out.len())
        });
        Ok(())
    }

    // The CPU runs every kernel at once, in issue order: it has no streams to tell apart.
    fn run(&self, kernel: &Kernel, args: &KernelArgs, _stream: StreamId) -> Result<()> {
        match kernel {
            Kernel::Map { expr, also } => map::run(expr, also, args),
            Kernel::Reduce {
                prologue: Some(_), ..
            }
            | Kernel::Reduce {
                epilogue: Some(_), ..
            } => {
                // The reference runs the definition: the prologue, the main reduction, the
                // epilogue.
                for (kernel, args) in crate::lower::prologue::split(kernel, args)? {
                    self.run(&kernel, &args, StreamId::DEFAULT)?;
                }
                Ok(())
            }
            Kernel::Reduce {
                op,
                reduced_axes,
                acc,
                map: None,
                ..
            } => reduce::run(*op, *reduced_axes, *acc, args),
            Kernel::Reduce {
                op,
                reduced_axes,
                acc,
                map: Some(expr),
                stores_map,
                ..
            } => {
                // The oracle keeps it simple: the map into a scratch buffer laid out like
                // the inputs' shape (or into output 1, when it stores the map), then the
                // plain reduction of it.
                let (main, stored) = match (args.outputs.as_slice(), stores_map) {
                    ([out], false) => (out, None),
                    ([out, stored], true) => (out, Some(stored)),
                    _ => {
                        return Err(crate::error::Error::Invalid(format!(
                            "a reduction writes one output, and one more when it stores its \
                             map; got {} outputs (stores_map: {stores_map})",
                            args.outputs.len()
                        )))
                    }
                };
                let args = &KernelArgs {
                    outputs: vec![main.clone()],
                    inputs: args.inputs.clone(),
                    scalars: args.scalars.clone(),
                };
                let ops = crate::lower::operands::ReduceOperands::of(*reduced_axes, args)?;
                let scratch = match stored {
                    Some(stored) => stored.clone(),
                    None => {
                        let layout = crate::layout::Layout::contiguous(ops.input.layout.shape())?;
                        let bytes = layout.numel() * expr.dtype.itemsize();
                        crate::backend::Operand {
                            buffer: Arc::new(CpuBuffer::new(bytes, self.pool.clone())?),
                            layout,
                            dtype: expr.dtype,
                        }
                    }
                };
                map::run(
                    expr,
                    &[],
                    &KernelArgs {
                        outputs: vec![scratch.clone()],
                        inputs: args.inputs.clone(),
                        scalars: args.scalars.clone(),
                    },
                )?;
                let plain = KernelArgs {
                    outputs: args.outputs.clone(),
                    inputs: vec![scratch],
                    scalars: vec![],
                };
                reduce::run(*op, *reduced_axes, *acc, &plain)
            }
            Kernel::Matmul { acc, .. } => matmul::run(*acc, args),
            Kernel::Index { kind, axis } => index::run(*kind, *axis, args),
            Kernel::Softmax { log } => softmax::run(*log, args, &self.pool),
            Kernel::Histogram {
                bins,
                bin,
                weighted,
            } => histogram::run(*bins, bin, *weighted, args, &self.pool),
            Kernel::Convolution { pass, geometry, .. } => convolution::run(*pass, geometry, args),
            Kernel::LayerNorm { weight, bias } => layer_norm::forward(*weight, *bias, args),
            Kernel::LayerNormBackward { weight, columns } => {
                layer_norm::backward(*weight, *columns, args)
            }
            Kernel::ChannelMoments => moments::run(args),
            Kernel::ChannelGradSums => moments::grad_sums(args),
        }
    }

    fn describe_launch(
        &self,
        kernel: &Kernel,
        args: &KernelArgs,
    ) -> Option<crate::backend::LaunchDescription> {
        let Kernel::Map { .. } = kernel else {
            return None;
        };
        let n = args.outputs.first()?.layout.numel();
        let threads = if n < strided::PARALLEL_MIN {
            1
        } else {
            strided::threads()
        };
        Some(crate::backend::LaunchDescription {
            name: "cpu map".into(),
            shape: format!(
                "{n} elements in blocks of {}, on {threads} thread{}",
                strided::BLOCK,
                if threads == 1 { "" } else { "s" }
            ),
        })
    }

    fn target(&self) -> &Target {
        &self.target
    }

    fn buffer_address(&self, buffer: &dyn DeviceBuffer) -> Result<u64> {
        Ok(CpuBuffer::of(buffer)?.ptr() as usize as u64)
    }

    fn dlpack_device(&self) -> Option<dlpark::ffi::DLDevice> {
        Some(dlpark::ffi::DLDevice::CPU)
    }

    fn wrap_foreign(
        &self,
        address: u64,
        bytes: usize,
        owner: ForeignOwner,
    ) -> Result<Arc<dyn DeviceBuffer>> {
        Ok(Arc::new(CpuBuffer::foreign(address, bytes, owner)?))
    }

    fn memory_stats(&self) -> MemoryStats {
        self.pool.stats()
    }

    fn empty_cache(&self) {
        self.pool.empty_cache()
    }

    fn new_stream(&self) -> Result<StreamId> {
        Ok(StreamId(self.fresh_id()))
    }

    fn destroy_stream(&self, _stream: StreamId) {}

    fn record_event(&self, _stream: StreamId) -> Result<EventId> {
        let id = self.fresh_id();
        self.events.lock_unpoisoned().insert(id, Instant::now());
        Ok(EventId(id))
    }

    fn wait_event(&self, _stream: StreamId, event: EventId) -> Result<()> {
        self.event_time(event).map(|_| ())
    }

    fn synchronize_event(&self, event: EventId) -> Result<()> {
        self.event_time(event).map(|_| ())
    }

    fn elapsed_ms(&self, start: EventId, end: EventId) -> Result<f64> {
        let (a, b) = (self.event_time(start)?, self.event_time(end)?);
        Ok(b.saturating_duration_since(a).as_secs_f64() * 1e3)
    }

    fn destroy_event(&self, event: EventId) {
        self.events.lock_unpoisoned().remove(&event.0);
    }

    fn synchronize_stream(&self, _stream: StreamId) -> Result<()> {
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}
