//! # strata-wgpu
//!
//! strata's wgpu backend, for machines without an NVIDIA GPU (Vulkan, Metal, DX12, and Mesa's
//! software Vulkan, lavapipe). It implements strata-core's [`Backend`] trait: every IR kernel
//! is generated as WGSL ([`render`]), compiled into a pipeline once per structure, and
//! recorded into a command batch that is submitted at a sync point, a host read, or every
//! 256 dispatches. Operands larger than the adapter's storage-binding limit are bound in
//! windows, and a launch is split into pieces that fit.
//!
//! ```
//! match strata_wgpu::open() {
//!     Ok(dev) => println!("{}", dev.name()),
//!     Err(e) => println!("no wgpu adapter here: {e}"),
//! }
//! ```
#![warn(missing_docs)]

mod copy;
mod events;
mod gpu;
mod launch;
mod memory;
mod probe;
pub mod render;
mod run;
mod staging;

pub use gpu::AdapterSummary;
pub use memory::WgpuBuffer;
/// The kind of an adapter ([`AdapterSummary::device_type`]).
pub use wgpu::DeviceType;

use gpu::Gpu;
use launch::PipelineCache;
use memory::Pool;
use render::{conv, index, map, matmul, reduce, Caps};
use std::sync::Arc;
use strata_core::backend::KernelArgs;
use strata_core::ir::Kernel;
use strata_core::target::Target;
use strata_core::{
    Backend, BackendKind, DType, Device, DeviceBuffer, Error, EventId, MemoryStats, Result,
    StreamId,
};

/// Opens the wgpu adapter strata would pick (`STRATA_WGPU_ADAPTER` chooses by name or backend,
/// else the high-performance adapter) as a [`Device`].
///
/// ```
/// if let Ok(dev) = strata_wgpu::open() {
///     assert_eq!(dev.kind(), strata_core::BackendKind::Wgpu);
/// }
/// ```
pub fn open() -> Result<Device> {
    Ok(Device::from_backend(Arc::new(WgpuBackend::new()?)))
}

/// Every adapter wgpu finds, with its features and limits.
///
/// ```
/// for a in strata_wgpu::adapters() {
///     println!("{} on {:?}", a.name, a.backend);
/// }
/// ```
pub fn adapters() -> Vec<AdapterSummary> {
    gpu::adapters()
}

/// The wgpu implementation of [`Backend`] for one adapter.
///
/// ```
/// use strata_core::Backend;
/// if let Ok(b) = strata_wgpu::WgpuBackend::new() {
///     assert!(b.name().starts_with("wgpu:"));
/// }
/// ```
pub struct WgpuBackend {
    gpu: Arc<Gpu>,
    pool: Arc<Pool>,
    maps: PipelineCache<map::MapSig<'static>>,
    reductions: PipelineCache<reduce::ReduceSig>,
    indexing: PipelineCache<index::IndexSig>,
    matmuls: PipelineCache<matmul::MatmulSig>,
    convolutions: PipelineCache<conv::ConvSig>,
    histograms: PipelineCache<render::histogram::HistogramSig>,
    softmaxes: PipelineCache<render::softmax::SoftmaxSig>,
    layer_norms: PipelineCache<render::layer_norm::LayerNormSig>,
    layer_norm_forwards: PipelineCache<render::layer_norm::LayerNormForwardSig>,
    moments: PipelineCache<render::moments::MomentsSig>,
    grad_sums: PipelineCache<render::moments::GradSumsSig>,
    staged: PipelineCache<render::staged::StagedSig>,
    /// What core's planners and fusion know of this adapter.
    target: Target,
    /// `target` without reduce vectors (they are four 32-bit elements): what plans a reduction
    /// of another dtype, and softmax rows (its kernel takes vectors itself), built once.
    element_target: Target,
    /// The cooperative f16 matmul stages by 16-byte loads where layouts allow
    /// (`STRATA_WGPU_COOP=elements` keeps one half a load: the tests reach that path so).
    coop_vectors: bool,
    /// The next stream id (one queue runs them all; ids only name them).
    next_stream: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for WgpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WgpuBackend({})", self.name())
    }
}

impl WgpuBackend {
    /// Opens the adapter (see [`open`]) with its own limits and the optional features it has.
    ///
    /// ```
    /// let _ = strata_wgpu::WgpuBackend::new();
    /// ```
    pub fn new() -> Result<WgpuBackend> {
        let mut gpu = Gpu::open()?;
        // STRATA_WGPU_FUSED_FMA=0 takes the square root that needs no fused `fma` (the tests
        // reach it on any adapter that way).
        gpu.caps.fused_fma = std::env::var("STRATA_WGPU_FUSED_FMA").as_deref() != Ok("0")
            && probe::fma_is_fused(&gpu);
        let gpu = Arc::new(gpu);
        let pool = Arc::new(Pool::new(gpu.device.clone(), gpu.limits.max_buffer_size));
        // Tests reach the windowed paths with small tensors, and fusion's binding count, by
        // asking for less than the adapter has: `STRATA_WGPU_MAX_BINDING` (bytes a binding
        // spans) and `STRATA_WGPU_MAX_BINDINGS` (storage buffers a kernel binds).
        let cap = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(u64::MAX)
        };
        // Window sizes are rounded up to 16 bytes: keep them under the limit.
        let binding_limit = (gpu
            .limits
            .max_storage_buffer_binding_size
            .min(cap("STRATA_WGPU_MAX_BINDING"))
            / 16)
            * 16;
        // One storage buffer of every kernel holds its parameters.
        let buffers = u64::from(gpu.limits.max_storage_buffers_per_shader_stage)
            .min(cap("STRATA_WGPU_MAX_BINDINGS"));
        let max_bindings = (buffers as usize).saturating_sub(1).max(3);
        let target = Target {
            vector_bytes: 16,
            // WGSL moves four elements in `u32` words (dtypes up to 32 bits), whole vectors;
            // tiles of 32-bit dtypes.
            vector_lanes: 4,
            // Four 64-bit lanes that draw (randint as i64): one Philox call serves them.
            draw_vector_bytes: 32,
            vector_tail: false,
            tile_32bit_only: true,
            tile_reads_position: false,
            // Operands strided between rows (parts of a `cat`, slices of rows) in whole
            // vec4 words; row-broadcast inputs (softmax's [n, 1] values) read once per vec4.
            vector_rows: true,
            vector_splats: true,
            wide_index: false,
            // wgpu tells nothing of the device's size: enough threads for a large GPU (2,048
            // workgroups of 256); a small one runs the extra ranges in turn.
            parallel_slots: 1 << 18,
            items_per_thread: 8,
            group_sizes: &[1, 256],
            // Softmax: one invocation a short row, else a workgroup.
            row_groups: &[1, 256],
            row_stage_bytes: 0,
            row_stage_group: 1,
            // A reduction along a contiguous axis, or along rows of one (batch norm's
            // statistics), reads four 32-bit elements a `vec4<u32>` load (render::reduce).
            reduce_vectors: true,
            binding_limit: Some(binding_limit),
            offset_align: gpu.limits.min_storage_buffer_offset_alignment as u64,
            max_bindings: Some(max_bindings),
            // Each further output is one more storage binding; past a few, a fused kernel's
            // parameters and registers grow for little (as on CUDA).
            max_map_outputs: 8,
            fuses_map_into_reduce: true,
            // A row prologue and epilogue in one dispatch where the row fits a workgroup's
            // registers (render::staged), else core's launches.
            fuses_row_prologue: true,
            // A sum too (a layer norm's mean, then its variance and the normalized rows in the
            // same dispatch), in the workgroup's order: wgpu's fused sums may differ from the
            // eager launches' in their last bits, as its map→reduce fusion's do.
            fuses_sum_prologue: true,
            fuses_row_epilogue: true,
            stages_row_epilogue_alone: false,
            stores_reduce_map: false,
            // One launch: each row read once, written once (render::softmax).
            runs_softmax: true,
            layer_norm_row: render::layer_norm::LONGEST_ROW,
            // (16-bit elements share a word: one invocation's would race its neighbour's.)
            layer_norm_dtypes: &[DType::F32],
            // (f32: scalar loads, every operand bound whole.)
            channel_moments_dtypes: &[DType::F32],
            // (The same: f32, scalar loads, bound whole.)
            channel_sums_dtypes: &[DType::F32],
            // WGSL's atomics are 32-bit: u32 counts, f32 sums by compare-and-swap.
            histogram_accumulators: &[DType::U32, DType::F32],
            // Measured through NVIDIA's Vulkan driver (H200, 8192³): the half kernel ran at half
            // the f32 kernel's rate (64 against 33.4 ms); widened, 33.9 ms. Lavapipe: the same
            // either way. f16 on cooperative matrices (render::coop_matmul) runs as it is.
            widens_half_matmul: if gpu.caps.coop_f16 {
                &[DType::BF16]
            } else {
                &[DType::F16, DType::BF16]
            },
            k_major_tf32_from: None,
        };
        let element_target = Target {
            reduce_vectors: false,
            ..target.clone()
        };
        Ok(WgpuBackend {
            gpu,
            pool,
            target,
            element_target,
            coop_vectors: std::env::var("STRATA_WGPU_COOP").as_deref() != Ok("elements"),
            next_stream: std::sync::atomic::AtomicU64::new(1),
            maps: PipelineCache::default(),
            reductions: PipelineCache::default(),
            indexing: PipelineCache::default(),
            matmuls: PipelineCache::default(),
            convolutions: PipelineCache::default(),
            histograms: PipelineCache::default(),
            softmaxes: PipelineCache::default(),
            layer_norms: PipelineCache::default(),
            layer_norm_forwards: PipelineCache::default(),
            moments: PipelineCache::default(),
            grad_sums: PipelineCache::default(),
            staged: PipelineCache::default(),
        })
    }

    /// What the generated shaders may use on this adapter.
    ///
    /// ```
    /// if let Ok(b) = strata_wgpu::WgpuBackend::new() {
    ///     println!("f64: {}", b.caps().f64);
    /// }
    /// ```
    pub fn caps(&self) -> Caps {
        self.gpu.caps
    }

    /// The adapter's features and limits as this device uses them.
    ///
    /// ```
    /// if let Ok(b) = strata_wgpu::WgpuBackend::new() {
    ///     assert!(b.limits().max_storage_buffer_binding_size > 0);
    /// }
    /// ```
    pub fn limits(&self) -> &wgpu::Limits {
        &self.gpu.limits
    }

    /// The optional features this device was opened with (those of SHADER_F16, SHADER_F64,
    /// SHADER_INT64, TIMESTAMP_QUERY and SUBGROUP that the adapter has).
    ///
    /// ```
    /// if let Ok(b) = strata_wgpu::WgpuBackend::new() {
    ///     println!("{:?}", b.features());
    /// }
    /// ```
    pub fn features(&self) -> wgpu::Features {
        self.gpu.features
    }

    /// How many pipelines this device has compiled.
    ///
    /// ```
    /// if let Ok(b) = strata_wgpu::WgpuBackend::new() {
    ///     assert_eq!(b.cached_pipelines(), 0);
    /// }
    /// ```
    pub fn cached_pipelines(&self) -> usize {
        self.maps.len()
            + self.reductions.len()
            + self.indexing.len()
            + self.matmuls.len()
            + self.convolutions.len()
            + self.histograms.len()
            + self.softmaxes.len()
            + self.layer_norms.len()
            + self.layer_norm_forwards.len()
            + self.moments.len()
            + self.grad_sums.len()
            + self.staged.len()
    }

    /// The most bytes one binding spans (the target's binding limit).
    fn binding_limit(&self) -> u64 {
        self.target.binding_limit.unwrap_or(u64::MAX)
    }

    fn check_operands(&self, args: &KernelArgs) -> Result<()> {
        for op in args.outputs.iter().chain(&args.inputs) {
            WgpuBuffer::of(op.buffer.as_ref())?;
            self.check_dtype(op.dtype)?;
        }
        Ok(())
    }
}

impl Backend for WgpuBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Wgpu
    }

    fn name(&self) -> String {
        format!("wgpu:{} ({:?})", self.gpu.info.name, self.gpu.info.backend)
    }

    fn properties(&self) -> Vec<(&'static str, String)> {
        let caps = self.gpu.caps;
        let yes_no = |b: bool| if b { "yes" } else { "no" };
        vec![
            (
                "f16 storage",
                if caps.f16 {
                    "native"
                } else {
                    "packed in u32 words"
                }
                .to_string(),
            ),
            ("f64", yes_no(caps.f64).to_string()),
            ("i64 / u64", yes_no(caps.int64).to_string()),
            (
                "f16 matmul",
                if caps.coop_f16 {
                    "cooperative matrices (16×16×16, f32 accumulation)"
                } else {
                    "tiles in f32"
                }
                .to_string(),
            ),
        ]
    }

    fn check_dtype(&self, dtype: DType) -> Result<()> {
        let caps = self.gpu.caps;
        let missing = match dtype {
            DType::F64 if !caps.f64 => Some("SHADER_F64 and SHADER_INT64"),
            DType::I64 | DType::U64 if !caps.int64 => Some("SHADER_INT64"),
            _ => None,
        };
        match missing {
            Some(feature) => Err(Error::Unsupported(format!(
                "{dtype} is not available on the wgpu adapter {} (it lacks {feature}); use f32 \
                 (or i32) there, or the CPU or CUDA backend",
                self.gpu.info.name
            ))),
            None => Ok(()),
        }
    }

    fn allocate(&self, bytes: usize, _stream: StreamId) -> Result<Arc<dyn DeviceBuffer>> {
        Ok(Arc::new(self.pool.allocate(bytes)?))
    }

    fn upload(
        &self,
        dst: &dyn DeviceBuffer,
        byte_offset: usize,
        data: &[u8],
        _stream: StreamId,
    ) -> Result<()> {
        let buf = WgpuBuffer::of(dst)?;
        range_check(buf, byte_offset, data.len())?;
        self.gpu.write(buf.raw(), byte_offset as u64, data)
    }

    fn download(
        &self,
        src: &dyn DeviceBuffer,
        byte_offset: usize,
        out: &mut [u8],
        _stream: StreamId,
    ) -> Result<()> {
        let buf = WgpuBuffer::of(src)?;
        range_check(buf, byte_offset, out.len())?;
        self.gpu.read_into(buf.raw(), byte_offset as u64, out)
    }

    fn map_source(
        &self,
        expr: &strata_core::ir::Expr,
        also: &[strata_core::ir::Expr],
        args: &KernelArgs,
    ) -> Result<Option<strata_core::backend::KernelSource>> {
        // The buffers may be stand-ins (nothing runs): only the dtypes are checked.
        for op in args.outputs.iter().chain(&args.inputs) {
            self.check_dtype(op.dtype)?;
        }
        let kernel = Kernel::Map {
            expr: expr.clone(),
            also: also.to_vec(),
        };
        self.map_source_of(&self.steps(&kernel, args)?)
    }

    fn target(&self) -> &Target {
        &self.target
    }

    fn run(&self, kernel: &Kernel, args: &KernelArgs, _stream: StreamId) -> Result<()> {
        self.check_operands(args)?;
        // A row prologue or epilogue whose rows do not stage runs as core's launches, each its
        // own run.
        let fused_rows = matches!(
            kernel,
            Kernel::Reduce { prologue, epilogue, .. } if prologue.is_some() || epilogue.is_some()
        );
        if fused_rows && self.staged_steps(kernel, args)?.is_none() {
            for (k, a) in strata_core::lower::prologue::split(kernel, args)? {
                self.run(&k, &a, _stream)?;
            }
            return Ok(());
        }
        let steps = self.steps(kernel, args)?;
        self.execute(&steps, args)
    }

    fn event_times_ms(&self, base: EventId, events: &[EventId]) -> Result<Vec<f64>> {
        self.gpu.event_times_ms(base, events)
    }

    fn describe_launch(
        &self,
        kernel: &Kernel,
        args: &KernelArgs,
    ) -> Option<strata_core::backend::LaunchDescription> {
        self.describe(&self.steps(kernel, args).ok()?)
    }

    fn memory_stats(&self) -> MemoryStats {
        self.pool.stats()
    }

    fn empty_cache(&self) {
        self.pool.empty_cache();
        self.gpu.release_staging();
    }

    fn new_stream(&self) -> Result<StreamId> {
        // One queue: every stream's work runs in submission order, which is a valid schedule
        // for any set of streams and events.
        Ok(StreamId(
            self.next_stream
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        ))
    }

    fn destroy_stream(&self, _stream: StreamId) {}

    fn record_event(&self, _stream: StreamId) -> Result<EventId> {
        Ok(self.gpu.record_event())
    }

    fn wait_event(&self, _stream: StreamId, _event: EventId) -> Result<()> {
        Ok(())
    }

    fn synchronize_event(&self, event: EventId) -> Result<()> {
        self.gpu.synchronize_event(event)
    }

    fn elapsed_ms(&self, start: EventId, end: EventId) -> Result<f64> {
        // From the two timestamps, read back together.
        Ok(self.gpu.event_times_ms(start, &[end])?[0])
    }

    fn destroy_event(&self, event: EventId) {
        self.gpu.destroy_event(event)
    }

    fn synchronize_stream(&self, _stream: StreamId) -> Result<()> {
        self.gpu.synchronize()
    }

    fn synchronize(&self) -> Result<()> {
        self.gpu.synchronize()
    }
}

fn range_check(buf: &WgpuBuffer, offset: usize, len: usize) -> Result<()> {
    if offset
        .checked_add(len)
        .is_none_or(|end| end > buf.len_bytes())
    {
        return Err(Error::Index(format!(
            "bytes {offset}..{} of a {}-byte buffer",
            offset.saturating_add(len),
            buf.len_bytes()
        )));
    }
    Ok(())
}
