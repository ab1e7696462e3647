//! # strata-cuda
//!
//! strata's CUDA backend. It implements strata-core's [`Backend`] trait: each IR kernel is
//! planned into launch steps from core's plans (`run`), rendered as CUDA C (`render`), compiled
//! by NVRTC to the device's machine code (cached on disk and per device), and launched through
//! the driver API on user-visible streams. Float matmuls go to cuBLAS. The CUDA libraries are loaded at run time,
//! so this crate builds, and everything else runs, on a machine without CUDA: there
//! [`open`] returns an `Err` saying no driver was found.
//!
//! ```
//! match strata_cuda::open(0) {
//!     Ok(dev) => println!("{}", dev.name()),
//!     Err(e) => println!("no CUDA here: {e}"),
//! }
//! ```
#![warn(missing_docs)]

mod background;
mod blas;
mod compile;
mod dnn;
mod driver;
mod function;
mod launch;
mod memory;
mod nccl;
mod peer;
mod pinned;
mod render;
mod run;
mod staging;

mod archive;
mod hash;

/// Kernels shipped compiled: the machine code of the kernels common first calls launch
/// (reductions, softmax, index, casts, random draws, the map interpreter), built into the
/// library for the common GPU architectures, so those first calls load it instead of waiting
/// for NVRTC. How it is made, used and checked: `examples/ship_kernels.rs` and
/// docs/semantics.md ("Shipped kernels"); `STRATA_CUDA_SHIPPED=0` leaves it unused.
///
/// ```
/// let entries = strata_cuda::shipped::entries(strata_cuda::shipped::archive()).unwrap();
/// assert!(entries.iter().any(|e| e.name == "strata_interpret"));
/// ```
pub mod shipped {
    pub use crate::archive::{archive, built_by, entries, nvrtc_compiles, serves, Entry};
    pub use crate::compile::build_archive;
}

pub use compile::{nvrtc_version, ptx_cache_dir};
pub use memory::CudaBuffer;
pub use nccl::Nccl;

use driver::Gpu;
use memory::Memory;
use render::{map, softmax};
use run::{Runner, Step};
use std::sync::Arc;
use strata_core::backend::KernelArgs;
use strata_core::backend::KernelSource;
use strata_core::ir::{Expr, Kernel};
use strata_core::target::Target;
use strata_core::{
    Backend, BackendKind, DType, Device, DeviceBuffer, EventId, MemoryStats, Result, StreamId,
};

/// Opens CUDA device `ordinal` as a strata [`Device`].
///
/// ```
/// if let Ok(dev) = strata_cuda::open(0) {
///     assert_eq!(dev.kind(), strata_core::BackendKind::Cuda);
/// }
/// ```
pub fn open(ordinal: usize) -> Result<Device> {
    Ok(Device::from_backend(Arc::new(CudaBackend::new(ordinal)?)))
}

/// How many CUDA devices the driver reports (0 without a driver).
///
/// ```
/// let n = strata_cuda::device_count();
/// assert!(strata_cuda::open(n).is_err());
/// ```
pub fn device_count() -> usize {
    // SAFETY: only asks the loader whether the library can be opened.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return 0;
    }
    cudarc::driver::CudaContext::device_count()
        .map(|n| n.max(0) as usize)
        .unwrap_or(0)
}

/// The CUDA implementation of [`Backend`] for one device.
///
/// ```
/// use strata_core::Backend;
/// if let Ok(b) = strata_cuda::CudaBackend::new(0) {
///     assert!(b.name().starts_with("cuda:0"));
/// }
/// ```
pub struct CudaBackend {
    gpu: Arc<Gpu>,
    memory: Arc<Memory>,
    /// Pinned chunks for large host↔device copies.
    staging: staging::Staging,
    /// Plans, compiles and launches kernels.
    runner: Runner,
    /// The other devices this one reaches directly.
    peers: peer::Peers,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBackend({})", self.name())
    }
}

impl CudaBackend {
    /// Opens device `ordinal`: its context, a stream for `StreamId::DEFAULT`, the memory pool,
    /// and cuBLAS when present.
    ///
    /// ```
    /// assert!(strata_cuda::CudaBackend::new(usize::MAX).is_err());
    /// ```
    pub fn new(ordinal: usize) -> Result<CudaBackend> {
        let gpu = Arc::new(Gpu::open(ordinal)?);
        let memory = Arc::new(Memory::new(gpu.clone())?);
        let target = Target {
            vector_bytes: 16,
            vector_lanes: 0,
            draw_vector_bytes: 32,
            vector_tail: true,
            tile_32bit_only: false,
            tile_reads_position: true,
            vector_rows: true,
            vector_splats: true,
            wide_index: true,
            // 2,048 resident threads per multiprocessor.
            parallel_slots: gpu.sm_count as usize * 2048,
            items_per_thread: 8,
            group_sizes: &[1, 32, 256],
            row_groups: &[1, 32, 256, 1024],
            row_stage_bytes: softmax::row_stage_bytes(gpu.shared_per_sm, gpu.shared_per_block),
            row_stage_group: softmax::STAGE_GROUP,
            reduce_vectors: true,
            binding_limit: None,
            offset_align: 1,
            max_bindings: None,
            // Past a few, a fused kernel's argument words and registers grow for little.
            max_map_outputs: 8,
            fuses_map_into_reduce: true,
            fuses_row_prologue: true,
            // The staged kernels add a prologue's sum in the eager plan's lanes: a block's
            // (render::reduce::staged) or, where that plan gives a row one warp, each warp its
            // own rows (render::reduce::per_warp).
            fuses_sum_prologue: true,
            // Staged rows: the epilogue reads them again from L2 and writes once.
            fuses_row_epilogue: true,
            stages_row_epilogue_alone: true,
            // The plain kernel stores each element's value where it computes it.
            stores_reduce_map: true,
            runs_softmax: true,
            layer_norm_row: strata_core::lower::layer_norm_plan::longest_row(1024),
            layer_norm_dtypes: &[DType::F16, DType::BF16, DType::F32, DType::F64],
            channel_moments_dtypes: &[DType::F16, DType::BF16, DType::F32, DType::F64],
            channel_sums_dtypes: &[DType::F16, DType::BF16, DType::F32, DType::F64],
            histogram_accumulators: &[DType::U32, DType::U64, DType::F32, DType::F64],
            widens_half_matmul: &[],
            // Set below where cuBLAS runs the products.
            k_major_tf32_from: None,
        };
        let mut runner = Runner::new(gpu.clone(), memory.clone(), target);
        if runner.blas.is_some() && gpu.arch.0 == 9 {
            // Measured on an H200 (cuBLAS 13): xᵀ·dy [4096, 8192]·[8192, 4096] 1.23 ms as it
            // is, 0.69 with either operand contiguous along k; 2048³ 92 against 63 µs; 1024³
            // equal. f16, bf16, f64 and f32 without TF32 show no such gap. Hopper only: the
            // other architectures were not measured.
            runner.target.k_major_tf32_from = Some(1 << 32);
        }
        Ok(CudaBackend {
            runner,
            staging: staging::Staging::new(gpu.clone()),
            gpu,
            memory,
            peers: peer::Peers::default(),
        })
    }

    /// How many kernels this device has compiled or loaded so far.
    ///
    /// ```
    /// if let Ok(b) = strata_cuda::CudaBackend::new(0) {
    ///     assert_eq!(b.cached_kernels(), 0);
    /// }
    /// ```
    pub fn cached_kernels(&self) -> usize {
        self.runner.cached_kernels()
    }

    /// Marks every operand's buffer as used on `stream` (for stream-ordered frees).
    fn note_use(&self, args: &KernelArgs, stream: StreamId) -> Result<()> {
        for op in args.outputs.iter().chain(&args.inputs) {
            CudaBuffer::of(op.buffer.as_ref())?.used_on(stream);
        }
        Ok(())
    }
}

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn name(&self) -> String {
        format!("cuda:{} ({})", self.gpu.ordinal, self.gpu.name)
    }

    fn check_dtype(&self, _dtype: DType) -> Result<()> {
        Ok(())
    }

    fn allocate(&self, bytes: usize, stream: StreamId) -> Result<Arc<dyn DeviceBuffer>> {
        Ok(Arc::new(self.memory.allocate(bytes, stream)?))
    }

    fn upload(
        &self,
        dst: &dyn DeviceBuffer,
        byte_offset: usize,
        data: &[u8],
        stream: StreamId,
    ) -> Result<()> {
        let buf = CudaBuffer::of(dst)?;
        buf.range_check(byte_offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        self.gpu.bind()?;
        let s = self.gpu.stream(stream)?;
        self.runner.batches.send(&self.gpu, stream)?;
        buf.used_on(stream);
        let dst_ptr = buf.device_ptr() + byte_offset as u64;
        if data.len() >= staging::STAGED_FROM {
            if let Some(done) = self.staging.upload(dst_ptr, data, s) {
                return done;
            }
        }
        // SAFETY: range checked; a pageable source is staged before the call returns.
        driver::check(
            unsafe {
                cudarc::driver::sys::cuMemcpyHtoDAsync_v2(
                    dst_ptr,
                    data.as_ptr() as *const std::ffi::c_void,
                    data.len(),
                    s,
                )
            },
            "cuMemcpyHtoDAsync",
        )
    }

    fn download(
        &self,
        src: &dyn DeviceBuffer,
        byte_offset: usize,
        out: &mut [u8],
        stream: StreamId,
    ) -> Result<()> {
        let buf = CudaBuffer::of(src)?;
        buf.range_check(byte_offset, out.len())?;
        self.gpu.bind()?;
        let s = self.gpu.stream(stream)?;
        self.runner.batches.send(&self.gpu, stream)?;
        let src_ptr = buf.device_ptr() + byte_offset as u64;
        if !out.is_empty() {
            buf.used_on(stream);
            if out.len() >= staging::STAGED_FROM {
                if let Some(done) = self.staging.download(src_ptr, out, s) {
                    return done;
                }
            }
            // SAFETY: range checked; `out` has its length in bytes and lives until the
            // stream syncs.
            driver::check(
                unsafe {
                    cudarc::driver::sys::cuMemcpyDtoHAsync_v2(
                        out.as_mut_ptr() as *mut std::ffi::c_void,
                        src_ptr,
                        out.len(),
                        s,
                    )
                },
                "cuMemcpyDtoHAsync",
            )?;
        }
        // SAFETY: live stream.
        driver::check(
            unsafe { cudarc::driver::sys::cuStreamSynchronize(s) },
            "cuStreamSynchronize",
        )
    }

    fn run(&self, kernel: &Kernel, args: &KernelArgs, stream: StreamId) -> Result<()> {
        self.gpu.bind()?;
        let s = self.gpu.stream(stream)?;
        self.note_use(args, stream)?;
        // A row epilogue whose rows do not stage runs as core's launches, each its own run.
        if matches!(
            kernel,
            Kernel::Reduce {
                epilogue: Some(_),
                ..
            }
        ) && !run::reduce::stages(kernel, args, &self.runner.target)?
        {
            for (k, a) in strata_core::lower::prologue::split(kernel, args)? {
                self.run(&k, &a, stream)?;
            }
            return Ok(());
        }
        let steps = self.runner.steps(kernel, args)?;
        // A fused reduction not compiled yet runs as its eager launches (`run::unfused`).
        if let Some(launches) = self.runner.unfused(kernel, args, &steps, stream)? {
            for (k, a) in &launches {
                self.note_use(a, stream)?;
                if !self.runner.interpret_alone(k, a, stream, s)? {
                    self.run(k, a, stream)?;
                }
            }
            return Ok(());
        }
        // A map may join its stream's batch; anything else runs after the batch.
        if !matches!(steps.as_slice(), [Step::Map { .. }]) {
            self.runner.batches.send(&self.gpu, stream)?;
        }
        self.runner.execute(&steps, args, stream, s)
    }

    fn target(&self) -> &Target {
        &self.runner.target
    }

    fn map_source(
        &self,
        expr: &Expr,
        also: &[Expr],
        args: &KernelArgs,
    ) -> Result<Option<KernelSource>> {
        let kernel = Kernel::Map {
            expr: expr.clone(),
            also: also.to_vec(),
        };
        let steps = self.runner.steps(&kernel, args)?;
        let Some(Step::Map { sig, launch }) = steps.first() else {
            return Ok(None);
        };
        let Some((grid, block)) = launch::dims(&self.gpu, &launch.launch.grid) else {
            return Ok(None);
        };
        Ok(Some(KernelSource {
            language: "CUDA C".into(),
            launch: format!(
                "grid {grid:?} × block {block:?}, {} argument words{}",
                launch.launch.args.0.len(),
                if sig.vector > 1 {
                    format!(", {} elements per vector load", sig.vector)
                } else {
                    String::new()
                }
            ),
            source: map::render(sig)?.source,
        }))
    }

    fn describe_launch(
        &self,
        kernel: &Kernel,
        args: &KernelArgs,
    ) -> Option<strata_core::backend::LaunchDescription> {
        self.runner.describe(&self.runner.steps(kernel, args).ok()?)
    }

    fn prepare(&self, kernel: &Kernel, args: &KernelArgs) -> Result<bool> {
        // A row epilogue whose rows do not stage runs as core's launches: each prepared.
        if matches!(
            kernel,
            Kernel::Reduce {
                epilogue: Some(_),
                ..
            }
        ) && !run::reduce::stages(kernel, args, &self.runner.target)?
        {
            let mut any = false;
            for (k, a) in strata_core::lower::prologue::split(kernel, args)? {
                any |= self.prepare(&k, &a)?;
            }
            return Ok(any);
        }
        self.runner.compile_ahead(&self.runner.steps(kernel, args)?)
    }

    fn buffer_address(&self, buffer: &dyn DeviceBuffer) -> Result<u64> {
        Ok(CudaBuffer::of(buffer)?.device_ptr())
    }

    fn properties(&self) -> Vec<(&'static str, String)> {
        // Unbound, the memory query answers 0 bytes.
        let _ = self.gpu.bind();
        let (free, total) = self.gpu.mem_info();
        let gib = |b: usize| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64);
        let others: Vec<usize> = (0..device_count())
            .filter(|&o| o != self.gpu.ordinal)
            .collect();
        let reach: Vec<String> = others
            .iter()
            .filter(|&&o| peer::can_access(self.gpu.ordinal, o).unwrap_or(false))
            .map(|o| format!("cuda:{o}"))
            .collect();
        let peers = match (others.is_empty(), reach.is_empty()) {
            (true, _) => "no other CUDA device".to_string(),
            (false, true) => "none (copies to other devices are staged by the driver)".into(),
            (false, false) => reach.join(", "),
        };
        vec![
            ("index", self.gpu.ordinal.to_string()),
            (
                "memory",
                format!("{} total, {} free", gib(total), gib(free)),
            ),
            ("peer access", peers),
        ]
    }

    fn dlpack_device(&self) -> Option<strata_core::dlpack::DLDevice> {
        Some(strata_core::dlpack::DLDevice::cuda(self.gpu.ordinal as i32))
    }

    fn wrap_foreign(
        &self,
        address: u64,
        bytes: usize,
        owner: strata_core::backend::ForeignOwner,
    ) -> Result<Arc<dyn DeviceBuffer>> {
        let buffer = self
            .memory
            .foreign(address, bytes, StreamId::DEFAULT, owner);
        Ok(Arc::new(buffer))
    }

    fn pins_host_memory(&self) -> bool {
        true
    }

    fn allocate_pinned(&self, bytes: usize) -> Result<(u64, strata_core::backend::ForeignOwner)> {
        self.allocate_pinned_block(bytes)
    }

    fn upload_pinned(
        &self,
        dst: &dyn DeviceBuffer,
        byte_offset: usize,
        src: u64,
        len: usize,
        stream: StreamId,
    ) -> Result<EventId> {
        self.copy_pinned(dst, byte_offset, src, len, stream, true)
    }

    fn download_pinned(
        &self,
        src: &dyn DeviceBuffer,
        byte_offset: usize,
        dst: u64,
        len: usize,
        stream: StreamId,
    ) -> Result<EventId> {
        self.copy_pinned(src, byte_offset, dst, len, stream, false)
    }

    fn native_stream(&self, stream: StreamId) -> Result<u64> {
        // Whoever enqueues on the handle comes after the work strata enqueued so far.
        self.runner.batches.send(&self.gpu, stream)?;
        Ok(self.gpu.stream(stream)? as usize as u64)
    }

    fn foreign_waits_for(&self, foreign: u64, stream: StreamId) -> Result<()> {
        self.runner.batches.send(&self.gpu, stream)?;
        self.gpu
            .foreign_waits_for(foreign as usize as cudarc::driver::sys::CUstream, stream)
    }

    fn copy_from_peer(
        &self,
        dst: &dyn DeviceBuffer,
        byte_offset: usize,
        src: u64,
        peer: strata_core::dlpack::DLDevice,
        len: usize,
        stream: StreamId,
    ) -> Option<Result<()>> {
        if peer.device_type != strata_core::dlpack::DLDeviceType::CUDA {
            return None;
        }
        // A pair without peer access copies through the host (core's path).
        let from = self
            .peers
            .reach(&self.gpu, peer.device_id.max(0) as usize)?;
        Some((|| {
            let buf = CudaBuffer::of(dst)?;
            buf.range_check(byte_offset, len)?;
            if len == 0 {
                return Ok(());
            }
            self.runner.batches.send(&self.gpu, stream)?;
            buf.used_on(stream);
            let s = self.gpu.stream(stream)?;
            let at = buf.device_ptr() + byte_offset as u64;
            peer::copy(&self.gpu, at, src, &from, len, s)
        })())
    }

    fn wait_for_foreign(&self, stream: StreamId, foreign: u64) -> Result<()> {
        self.runner.batches.send(&self.gpu, stream)?;
        self.gpu
            .wait_foreign(stream, foreign as usize as cudarc::driver::sys::CUstream)
    }

    fn memory_stats(&self) -> MemoryStats {
        self.memory.stats()
    }

    fn empty_cache(&self) {
        // Sending the batches releases the buffers they kept alive.
        if self.runner.batches.send_all(&self.gpu).is_ok() {
            self.memory.empty_cache()
        }
    }

    fn new_stream(&self) -> Result<StreamId> {
        self.gpu.new_stream()
    }

    fn destroy_stream(&self, stream: StreamId) {
        // A failed send leaves nothing to wait for: the stream is destroyed either way.
        let _ = self.runner.batches.send(&self.gpu, stream);
        self.runner.batches.remove(stream);
        self.gpu.destroy_stream(stream)
    }

    fn record_event(&self, stream: StreamId) -> Result<EventId> {
        self.runner.batches.send(&self.gpu, stream)?;
        self.gpu.record_event(stream)
    }

    fn wait_event(&self, stream: StreamId, event: EventId) -> Result<()> {
        self.runner.batches.send(&self.gpu, stream)?;
        self.gpu.wait_event(stream, event)
    }

    fn synchronize_event(&self, event: EventId) -> Result<()> {
        self.gpu.synchronize_event(event)
    }

    fn elapsed_ms(&self, start: EventId, end: EventId) -> Result<f64> {
        self.gpu.elapsed_ms(start, end)
    }

    fn destroy_event(&self, event: EventId) {
        self.gpu.destroy_event(event)
    }

    fn synchronize_stream(&self, stream: StreamId) -> Result<()> {
        self.runner.batches.send(&self.gpu, stream)?;
        self.gpu.synchronize_stream(stream)
    }

    fn synchronize(&self) -> Result<()> {
        self.runner.batches.send_all(&self.gpu)?;
        self.gpu.synchronize()
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Pending work runs before the device goes; an error has no one left to report to.
        let _ = self.runner.batches.send_all(&self.gpu);
    }
}
