//! # strata-wgpu
//!
//! strata's wgpu backend, for machines without an NVIDIA GPU (Vulkan, Metal, DX12, and Mesa's
//! software Vulkan, lavapipe). It implements strata-core's [`Backend`] trait: every IR kernel
//! is generated as WGSL ([`codegen`]), compiled into a pipeline once per structure, and
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

pub mod codegen;
mod gpu;
mod launch;
mod memory;

pub use gpu::AdapterSummary;
pub use memory::WgpuBuffer;
/// The kind of an adapter ([`AdapterSummary::device_type`]).
pub use wgpu::DeviceType;

use codegen::{index, map, matmul, reduce, Caps};
use gpu::Gpu;
use launch::{dense, window, Access, PipelineCache, Window};
use memory::Pool;
use std::sync::Arc;
use strata_core::ir::{IndexKind, Kernel, KernelArgs, Operand, ReduceOp};
use strata_core::lower::operands::{IndexOperands, MatmulOperands};
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
    /// The largest window bound for one operand: the adapter's storage-binding limit, or less
    /// when `STRATA_WGPU_MAX_BINDING` (bytes) asks for less, so tests reach the windowed paths
    /// with small tensors.
    binding_limit: u64,
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
        let gpu = Arc::new(Gpu::open()?);
        let pool = Arc::new(Pool::new(gpu.device.clone(), gpu.limits.max_buffer_size));
        let cap = std::env::var("STRATA_WGPU_MAX_BINDING")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(u64::MAX);
        // Window sizes are rounded up to 16 bytes: keep them under the limit.
        let binding_limit = (gpu.limits.max_storage_buffer_binding_size.min(cap) / 16) * 16;
        Ok(WgpuBackend {
            gpu,
            pool,
            binding_limit,
            maps: PipelineCache::default(),
            reductions: PipelineCache::default(),
            indexing: PipelineCache::default(),
            matmuls: PipelineCache::default(),
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
        self.maps.len() + self.reductions.len() + self.indexing.len() + self.matmuls.len()
    }

    fn binding_limit(&self) -> u64 {
        self.binding_limit
    }

    fn align(&self) -> u64 {
        self.gpu.limits.min_storage_buffer_offset_alignment as u64
    }

    fn check_operands(&self, args: &KernelArgs) -> Result<()> {
        for op in args.outputs.iter().chain(&args.inputs) {
            WgpuBuffer::of(op.buffer.as_ref())?;
            self.check_dtype(op.dtype)?;
        }
        Ok(())
    }

    fn run_map(&self, expr: &strata_core::ir::Expr, args: &KernelArgs) -> Result<()> {
        for piece in map::plan(expr, args, self.binding_limit(), self.align())? {
            let caps = self.gpu.caps;
            let n = piece.windows.len();
            let p = self.maps.get(&piece.sig, |sig| {
                // Dtypes inside the tree (an f64 intermediate, say) are checked once, here.
                let mut used = std::collections::BTreeSet::new();
                codegen::prelude::dtypes_of(&sig.expr, &mut used);
                for d in used {
                    self.check_dtype(d)?;
                }
                self.gpu.pipeline(&map::source(sig, caps)?, n)
            })?;
            self.gpu
                .dispatch(&p, &piece.params, &piece.windows, piece.threads)?;
        }
        Ok(())
    }

    fn run_reduce(
        &self,
        op: ReduceOp,
        reduced_axes: usize,
        acc: DType,
        args: &KernelArgs,
    ) -> Result<()> {
        let ([input], [out]) = (args.inputs.as_slice(), args.outputs.as_slice()) else {
            return Err(Error::Invalid(
                "a reduce takes one input and one output".into(),
            ));
        };
        self.check_dtype(acc)?;
        let shape = input.layout.shape();
        let k = shape.len().checked_sub(reduced_axes).ok_or_else(|| {
            Error::Shape(format!(
                "reducing {reduced_axes} axes of a {}-d tensor",
                shape.len()
            ))
        })?;
        if out.layout.shape() != &shape[..k] {
            return Err(Error::Shape(format!(
                "reduce output {:?} for input {:?}",
                out.layout.shape(),
                shape
            )));
        }
        let outputs = out.layout.numel();
        if outputs == 0 {
            return Ok(());
        }
        let strides = input.layout.strides();
        let (oshape, ostr) =
            strata_core::layout::coalesce(&shape[..k], &[&strides[..k], out.layout.strides()]);
        let (rshape, rstr) = strata_core::layout::coalesce(&shape[k..], &[&strides[k..]]);
        let (oshape, ostr) = if oshape.is_empty() {
            (vec![1], vec![vec![0], vec![0]])
        } else {
            (oshape, ostr)
        };
        let (rshape, rstr) = if rshape.is_empty() {
            (
                vec![if shape[k..].iter().product::<usize>() == 0 {
                    0
                } else {
                    1
                }],
                vec![vec![0]],
            )
        } else {
            (rshape, rstr)
        };
        let reduced: usize = rshape.iter().product();
        if reduced > u32::MAX as usize || outputs > u32::MAX as usize {
            return Err(Error::Unsupported(format!(
                "wgpu reductions take at most 2^32 outputs and 2^32 elements each ({outputs} × {reduced})"
            )));
        }
        // Windows along the first reduced axis (s) and the first outer axis (t), one launch
        // each, when the input exceeds a storage binding.
        let limit = self.binding_limit();
        let align = self.align();
        let mut s = 1usize;
        let mut t = 1usize;
        let (ro, rr) = (oshape.len(), rshape.len());
        let mut full = oshape.clone();
        full.extend(&rshape);
        let mut in_strides = ostr[0].clone();
        in_strides.extend(&rstr[0]);
        let in_access = Access::of(input, in_strides)?;
        let pieces = loop {
            let sl = rshape[0].div_ceil(s).max(1);
            let tl = oshape[0].div_ceil(t).max(1);
            let s_eff = rshape[0].div_ceil(sl).max(1);
            let t_eff = oshape[0].div_ceil(tl).max(1);
            let mut ps = Vec::new();
            for ti in 0..t_eff {
                for si in 0..s_eff {
                    let mut p = launch::Piece {
                        start: vec![0; full.len()],
                        len: full.clone(),
                    };
                    p.start[0] = ti * tl;
                    p.len[0] = tl.min(oshape[0] - ti * tl);
                    p.start[ro] = si * sl;
                    p.len[ro] = if rshape[0] == 0 {
                        0
                    } else {
                        sl.min(rshape[0] - si * sl)
                    };
                    ps.push((si, p));
                }
            }
            let fits = ps.iter().all(|(_, p)| {
                p.len.contains(&0) || window(&in_access, p, align).byte_size <= limit
            });
            if fits {
                break (ps, s_eff);
            }
            if sl > 1 {
                s *= 2;
            } else if tl > 1 {
                t *= 2;
            } else {
                return Err(Error::Unsupported(format!(
                    "a reduce slice does not fit the adapter's {limit}-byte storage binding"
                )));
            }
        };
        let (pieces, windows_along) = pieces;
        // Ranges per output inside each launch: few long reductions (a full sum) are cut so
        // that the GPU gets ~1,000 workgroups with at least 4,096 elements each.
        let per_piece = reduced.div_ceil(windows_along);
        let ranges = if outputs < 1024 && per_piece >= 8192 {
            (per_piece / 4096).min(2048 / outputs.max(1)).max(1)
        } else {
            1
        };
        let splits = windows_along * ranges;
        let arg = op.returns_index();
        let caps = self.gpu.caps;
        let out_access = Access::of(out, ostr[1].iter().copied().chain(vec![0; rr]).collect())?;
        // Partials: [outputs, splits] values in `acc` (and u32 positions for arg ops).
        let partial = splits > 1;
        let (pv, pi) = if partial {
            let n = outputs * splits;
            (
                Some(self.pool.allocate(n * acc.itemsize())?),
                if arg {
                    Some(self.pool.allocate(n * 4)?)
                } else {
                    None
                },
            )
        } else {
            (None, None)
        };
        let w = reduce::words(ro, rr);
        for (si, p) in &pieces {
            let o_n: usize = p.len[..ro].iter().product();
            let r_n: usize = p.len[ro..].iter().product();
            if o_n == 0 {
                continue;
            }
            let group = r_n / ranges >= 64;
            let sig = reduce::ReduceSig {
                op,
                acc,
                input: input.dtype,
                output: if partial { acc } else { out.dtype },
                outer_rank: ro,
                reduced_rank: rr,
                group,
                combine: false,
                partial,
            };
            let in_w = window(&in_access, p, align);
            let mut params = vec![0u32; w.len];
            params[0] = o_n as u32;
            params[1] = r_n as u32;
            params[2] = (p.start[ro] * rshape[1..].iter().product::<usize>()) as u32;
            params[3] = in_w.rel_offset as u32;
            params[5] = ranges as u32;
            let mut windows = vec![];
            let first_out = p.start[0] * oshape[1..].iter().product::<usize>();
            if let Some(pv) = &pv {
                // Partial (o, si, k) lives at o * splits + si * ranges + k; the piece's outputs
                // are consecutive.
                params[4] = (first_out * splits + si * ranges) as u32;
                let ds = dense(&oshape);
                for d in 0..ro {
                    params[w.out_outer + d] = (ds[d] * splits as isize) as i32 as u32;
                }
                windows.push(Window::whole(pv.raw()));
            } else {
                let ow = window(&out_access, p, align);
                params[4] = ow.rel_offset as u32;
                for d in 0..ro {
                    params[w.out_outer + d] = ostr[1][d] as i32 as u32;
                }
                windows.push(ow);
            }
            windows.push(in_w);
            if let Some(pi) = &pi {
                windows.push(Window::whole(pi.raw()));
            }
            for d in 0..ro {
                params[w.outer_shape + d] = p.len[d] as u32;
                params[w.in_outer + d] = ostr[0][d] as i32 as u32;
            }
            for d in 0..rr {
                params[w.reduced_shape + d] = p.len[ro + d] as u32;
                params[w.in_reduced + d] = rstr[0][d] as i32 as u32;
            }
            let nb = reduce::bindings(&sig);
            let pl = self.reductions.get(&sig, |sig| {
                self.gpu.pipeline(&reduce::source(sig, caps), nb)
            })?;
            let workers = o_n * ranges;
            let threads = if group { workers * 256 } else { workers };
            self.gpu.dispatch(&pl, &params, &windows, threads)?;
        }
        let Some(pv) = pv else { return Ok(()) };
        // Combine: reduce [outputs, splits] partials into the output.
        let sig = reduce::ReduceSig {
            op,
            acc,
            input: acc,
            output: out.dtype,
            outer_rank: ro,
            reduced_rank: 1,
            group: splits >= 64,
            combine: true,
            partial: false,
        };
        let w = reduce::words(ro, 1);
        let mut params = vec![0u32; w.len];
        params[0] = outputs as u32;
        params[1] = splits as u32;
        params[5] = 1;
        let whole = launch::Piece {
            start: vec![0; ro],
            len: oshape.clone(),
        };
        let out_only = Access::of(out, ostr[1].clone())?;
        let ow = window(&out_only, &whole, align);
        params[4] = ow.rel_offset as u32;
        let ds = dense(&oshape);
        for d in 0..ro {
            params[w.outer_shape + d] = oshape[d] as u32;
            params[w.in_outer + d] = (ds[d] * splits as isize) as i32 as u32;
            params[w.out_outer + d] = ostr[1][d] as i32 as u32;
        }
        params[w.reduced_shape] = splits as u32;
        params[w.in_reduced] = 1;
        let mut windows = vec![ow, Window::whole(pv.raw())];
        if let Some(pi) = &pi {
            windows.push(Window::whole(pi.raw()));
        }
        let nb = reduce::bindings(&sig);
        let pl = self.reductions.get(&sig, |sig| {
            self.gpu.pipeline(&reduce::source(sig, caps), nb)
        })?;
        let threads = if sig.group { outputs * 256 } else { outputs };
        self.gpu.dispatch(&pl, &params, &windows, threads)
        // The partial buffers return to the pool here; later work is ordered after the combine.
    }

    fn run_matmul(&self, acc: DType, args: &KernelArgs) -> Result<()> {
        let ops = MatmulOperands::of(args)?;
        self.check_dtype(acc)?;
        let (batch, m, k, n) = ops.dims;
        if batch == 0 || m == 0 || n == 0 {
            return Ok(());
        }
        let limit = self.binding_limit();
        let align = self.align();
        let (aa, _) = whole(ops.a)?;
        let (ba, _) = whole(ops.b)?;
        let (ca, _) = whole(ops.c)?;
        let sig = matmul::MatmulSig {
            dtype: ops.c.dtype,
            acc,
        };
        let caps = self.gpu.caps;
        let pl = self
            .matmuls
            .get(&sig, |sig| self.gpu.pipeline(&matmul::source(sig, caps), 3))?;
        let [a0, a1] = launch::scalar_words(ops.alpha);
        let [b0, b1] = launch::scalar_words(ops.beta);
        // Pieces (batch start, batch count, row start, row count): halve the batch, then the
        // rows of A and C, until every operand's window fits one storage binding.
        let mut todo = vec![(0, batch, 0, m)];
        while let Some((bs, bl, rs, rl)) = todo.pop() {
            let piece = |start: [usize; 3], len: [usize; 3]| launch::Piece {
                start: start.to_vec(),
                len: len.to_vec(),
            };
            let wins = [
                window(&ca, &piece([bs, rs, 0], [bl, rl, n]), align),
                window(&aa, &piece([bs, rs, 0], [bl, rl, k]), align),
                window(&ba, &piece([bs, 0, 0], [bl, k, n]), align),
            ];
            if wins.iter().any(|w| w.byte_size > limit) {
                if bl > 1 {
                    todo.push((bs + bl / 2, bl - bl / 2, rs, rl));
                    todo.push((bs, bl / 2, rs, rl));
                } else if rl > 1 {
                    todo.push((bs, bl, rs + rl / 2, rl - rl / 2));
                    todo.push((bs, bl, rs, rl / 2));
                } else {
                    return Err(Error::Unsupported(format!(
                        "wgpu: one {k}×{n} matrix of the right operand exceeds the adapter's \
                         {limit}-byte storage binding; use the CPU or CUDA backend"
                    )));
                }
                continue;
            }
            let mut params = vec![0u32; matmul::WORDS];
            params[..4].copy_from_slice(&[bl as u32, rl as u32, k as u32, n as u32]);
            params[4] = wins[1].rel_offset as u32;
            params[5] = wins[2].rel_offset as u32;
            params[6] = wins[0].rel_offset as u32;
            for (i, o) in [ops.a, ops.b, ops.c].iter().enumerate() {
                for (j, &s) in o.layout.strides().iter().enumerate() {
                    params[7 + 3 * i + j] = s as i32 as u32;
                }
            }
            params[16..20].copy_from_slice(&[a0, a1, b0, b1]);
            let tiles = bl * rl.div_ceil(matmul::TILE) * n.div_ceil(matmul::TILE);
            self.gpu.dispatch(&pl, &params, &wins, tiles * 256)?;
        }
        Ok(())
    }

    fn run_index(&self, kind: IndexKind, axis: usize, args: &KernelArgs) -> Result<()> {
        let checked = IndexOperands::of(kind, axis, args)?;
        let (out, index, src) = (checked.out, checked.index, checked.src);
        let scatter = kind.writes_through_index();
        self.check_dtype(DType::I64)?;
        let iter = checked.space().to_vec();
        let rank = iter.len();
        if axis >= rank || iter.iter().product::<usize>() == 0 {
            return Ok(());
        }
        let mut shape = iter.clone();
        if scatter {
            shape[axis] = 1;
        }
        let align = self.align();
        let accesses = [out, index, src]
            .map(|op| Access::of(op, op.layout.strides().to_vec()))
            .into_iter()
            .collect::<Result<Vec<_>>>()?;
        // A piece spans the whole indexed axis: a gather reads its source, a scatter writes its
        // output, wherever an index points along it. Pieces split the other axes only.
        let axis_len = [
            out.layout.shape()[axis],
            index.layout.shape()[axis],
            src.layout.shape()[axis],
        ];
        let windows = |p: &launch::Piece| {
            let reach = match scatter {
                false => [p.clone(), p.clone(), p.whole_along(axis, axis_len[2])],
                true => [
                    p.whole_along(axis, axis_len[0]),
                    p.whole_along(axis, axis_len[1]),
                    p.whole_along(axis, axis_len[1]),
                ],
            };
            [0, 1, 2].map(|k| window(&accesses[k], &reach[k], align))
        };
        let limit = self.binding_limit();
        let pieces = launch::split_by(&shape, Some(axis), limit, |p| {
            windows(p).iter().map(|w| w.byte_size).max().unwrap_or(0)
        })
        .map_err(|_| {
            Error::Unsupported(format!(
                "wgpu: a {} along axis {axis} spans more than the adapter's {limit}-byte \
                 storage binding (its elements along that axis lie too far apart to bind at \
                 once); use the CPU or CUDA backend",
                if scatter { "scatter" } else { "gather" }
            ))
        })?;
        let sig = index::IndexSig {
            dtype: out.dtype,
            rank,
            axis,
            kind,
        };
        let caps = self.gpu.caps;
        let pl = self
            .indexing
            .get(&sig, |sig| self.gpu.pipeline(&index::source(sig, caps), 3))?;
        let (sw, st, len) = index::words(rank);
        for piece in &pieces {
            let wins = windows(piece);
            let mut params = vec![0u32; len];
            params[0] = piece.len.iter().product::<usize>() as u32;
            params[1] = iter[axis] as u32;
            for (k, w) in wins.iter().enumerate() {
                params[2 + k] = w.rel_offset as u32;
            }
            for d in 0..rank {
                params[sw + d] = piece.len[d] as u32;
                params[st[0] + d] = out.layout.strides()[d] as i32 as u32;
                params[st[1] + d] = index.layout.strides()[d] as i32 as u32;
                params[st[2] + d] = src.layout.strides()[d] as i32 as u32;
            }
            self.gpu.dispatch(&pl, &params, &wins, params[0] as usize)?;
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
        len: usize,
        _stream: StreamId,
    ) -> Result<Vec<u8>> {
        let buf = WgpuBuffer::of(src)?;
        range_check(buf, byte_offset, len)?;
        self.gpu.read(buf.raw(), byte_offset as u64, len)
    }

    fn run(&self, kernel: &Kernel, args: &KernelArgs, _stream: StreamId) -> Result<()> {
        self.check_operands(args)?;
        match kernel {
            Kernel::Map { expr } => self.run_map(expr, args),
            Kernel::Reduce {
                op,
                reduced_axes,
                acc,
            } => self.run_reduce(*op, *reduced_axes, *acc, args),
            Kernel::Matmul { acc, .. } => self.run_matmul(*acc, args),
            Kernel::Index { kind, axis } => self.run_index(*kind, *axis, args),
        }
    }

    fn memory_stats(&self) -> MemoryStats {
        self.pool.stats()
    }

    fn empty_cache(&self) {
        self.pool.empty_cache()
    }

    fn new_stream(&self) -> Result<StreamId> {
        // One queue: every stream's work runs in submission order, which is a valid schedule
        // for any set of streams and events.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Ok(StreamId(
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
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
        self.gpu.elapsed_ms(start, end)
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

/// An operand over its own shape: its access and the piece covering all of it.
fn whole(o: &Operand) -> Result<(Access<'_>, launch::Piece)> {
    Ok((
        Access::of(o, o.layout.strides().to_vec())?,
        launch::Piece {
            start: vec![0; o.layout.ndim()],
            len: o.layout.shape().to_vec(),
        },
    ))
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
