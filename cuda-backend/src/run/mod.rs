//! Deciding what runs. A kernel becomes its launch steps ([`Runner::steps`]), planned once
//! from core's plans: device scratch, launches of generated kernels, cuBLAS calls. Everything
//! that needs to know what a kernel does reads them: `run` executes them, the profiler names
//! them and compiles them ahead, and `explain` renders the map's. A new kernel kind is a new
//! planner file here and a renderer in `crate::render`, nothing else.

pub(crate) mod batch;
mod convolution;
pub(crate) mod first_launch;
mod histogram;
mod index;
mod layer_norm;
pub(crate) mod map;
pub(crate) mod matmul;
mod moments;
pub(crate) mod reduce;
mod softmax;
mod step;
mod unfused;

use crate::blas::Blas;
use crate::compile::Compiler;
use crate::driver::Gpu;
use crate::function::FunctionCache;
use crate::function::{function, Function};
use crate::launch::{self, dims, Launch};
use crate::memory::Memory;
use crate::render::conv::{ConvSig, ConvSumSig};
use crate::render::histogram::HistogramSig;
use crate::render::index::IndexSig;
use crate::render::layer_norm::{LayerNormForwardSig, LayerNormSig};
use crate::render::map::MapSig;
use crate::render::matmul::MatmulSig;
use crate::render::moments::{GradSumsSig, MomentsSig};
use crate::render::reduce::ReduceSig;
use crate::render::softmax::SoftmaxSig;
use crate::render::Generated;
use cudarc::driver::sys::CUstream;
use std::sync::Arc;
use step::MapLaunch;
pub(crate) use step::{Sig, Step};
use strata_core::backend::KernelArgs;
use strata_core::backend::LaunchDescription;
use strata_core::ir::Kernel;
use strata_core::kernel_cache::KernelCache;
use strata_core::lower::operands::IndexOperands;
use strata_core::lower::softmax_plan::SoftmaxOperands;
use strata_core::target::Target;
use strata_core::{Result, StreamId};

/// Everything that turns a kernel into work on the device: its plans ([`Runner::steps`]), the
/// compiler and the loaded functions, the launch batches, the first launches' interpreter and
/// cuBLAS. The backend holds one and hands it each kernel.
pub(crate) struct Runner {
    pub gpu: Arc<Gpu>,
    /// For scratch buffers.
    memory: Arc<Memory>,
    pub compiler: Compiler,
    pub batches: batch::Batches,
    /// Maps' first launches through the interpreter.
    first_launches: first_launch::FirstLaunches,
    pub blas: Option<Blas>,
    /// cuDNN where it loads (and `STRATA_CUDNN` is not 0); strata's own convolution kernels
    /// otherwise.
    dnn: Option<crate::dnn::Dnn>,
    maps: FunctionCache<MapSig<'static>>,
    reductions: FunctionCache<ReduceSig>,
    /// Fused reductions that ran unfused while their kernel was not compiled
    /// ([`unfused`]).
    unfused_reductions: KernelCache<ReduceSig, Arc<unfused::Pending>>,
    indexing: FunctionCache<IndexSig>,
    matmuls: FunctionCache<MatmulSig>,
    softmaxes: FunctionCache<SoftmaxSig>,
    layer_norms: FunctionCache<LayerNormSig>,
    layer_norm_forwards: FunctionCache<LayerNormForwardSig>,
    moments: FunctionCache<MomentsSig>,
    grad_sums: FunctionCache<GradSumsSig>,
    histograms: FunctionCache<HistogramSig>,
    convolutions: FunctionCache<ConvSig>,
    conv_sums: FunctionCache<ConvSumSig>,
    /// What core's planners know of this device.
    pub target: Target,
}

impl Runner {
    /// A runner for `gpu`, planning for `target`; cuBLAS when present.
    pub(crate) fn new(gpu: Arc<Gpu>, memory: Arc<Memory>, target: Target) -> Runner {
        Runner {
            compiler: Compiler::new(Some(gpu.clone()), gpu.arch),
            gpu,
            memory,
            batches: batch::Batches::new(),
            first_launches: first_launch::FirstLaunches::new(),
            blas: Blas::new(),
            dnn: crate::dnn::Dnn::available().then(crate::dnn::Dnn::new),
            maps: FunctionCache::default(),
            reductions: FunctionCache::default(),
            unfused_reductions: KernelCache::default(),
            indexing: FunctionCache::default(),
            matmuls: FunctionCache::default(),
            softmaxes: FunctionCache::default(),
            layer_norms: FunctionCache::default(),
            layer_norm_forwards: FunctionCache::default(),
            moments: FunctionCache::default(),
            grad_sums: FunctionCache::default(),
            histograms: FunctionCache::default(),
            convolutions: FunctionCache::default(),
            conv_sums: FunctionCache::default(),
            target,
        }
    }

    /// How many kernels are compiled or loaded so far.
    pub(crate) fn cached_kernels(&self) -> usize {
        self.maps.len()
            + self.reductions.len()
            + self.indexing.len()
            + self.matmuls.len()
            + self.softmaxes.len()
            + self.layer_norms.len()
            + self.layer_norm_forwards.len()
            + self.moments.len()
            + self.grad_sums.len()
            + self.histograms.len()
            + self.convolutions.len()
            + self.conv_sums.len()
    }

    /// The steps `kernel` over `args` takes on this device: the one place each kernel kind's
    /// launches are decided.
    pub(crate) fn steps<'k>(&self, kernel: &'k Kernel, args: &KernelArgs) -> Result<Vec<Step<'k>>> {
        match kernel {
            Kernel::Map { expr, also } => map::steps(expr, also, args, &self.target),
            Kernel::Reduce { .. } => reduce::steps(kernel, args, &self.target),
            Kernel::Matmul { acc, tf32 } => matmul::steps(*acc, *tf32, args, self.blas.is_some()),
            Kernel::Index { kind, axis } => index::steps(&IndexOperands::of(*kind, *axis, args)?),
            Kernel::Softmax { log } => {
                softmax::steps(*log, &SoftmaxOperands::of(args)?, &self.target)
            }
            Kernel::LayerNorm { weight, bias } => {
                layer_norm::forward_steps(*weight, *bias, args, &self.target)
            }
            Kernel::LayerNormBackward { weight, columns } => {
                layer_norm::steps(*weight, *columns, args, &self.target)
            }
            Kernel::ChannelMoments => moments::steps(args, &self.target),
            Kernel::ChannelGradSums => moments::grad_steps(args, &self.target),
            Kernel::Histogram {
                bins,
                bin,
                weighted,
            } => histogram::steps(*bins, bin, *weighted, args, &self.target),
            Kernel::Convolution {
                pass,
                geometry,
                tf32,
            } => convolution::steps(
                *pass,
                *geometry,
                *tf32,
                args,
                self.dnn.as_ref(),
                &self.target,
            ),
        }
    }

    /// Runs `steps` (of a kernel over `args`) on `stream` (`s`, its handle).
    pub(crate) fn execute(
        &self,
        steps: &[Step],
        args: &KernelArgs,
        stream: StreamId,
        s: CUstream,
    ) -> Result<()> {
        // Scratch buffers live until the steps are enqueued; their frees are stream-ordered.
        let mut scratch = Vec::new();
        for step in steps {
            match step {
                Step::Scratch { bytes } => scratch.push(self.memory.allocate(*bytes, stream)?),
                Step::Map { sig, launch } => self.launch_map(sig, launch, args, stream, s)?,
                Step::Kernel { sig, launch } => {
                    let f = self.function(sig)?;
                    if launch.scratch.is_empty() {
                        launch::launch(&self.gpu, &f, launch, s)?;
                    } else {
                        let mut words = launch.args.0.clone();
                        for &(word, buffer) in &launch.scratch {
                            let (Some(w), Some(b)) = (words.get_mut(word), scratch.get(buffer))
                            else {
                                return Err(strata_core::Error::Backend(format!(
                                    "internal error: a launch patches word {word} with scratch \
                                     buffer {buffer}, but it has {} words and {} scratch buffers",
                                    launch.args.0.len(),
                                    scratch.len()
                                )));
                            };
                            *w += b.device_ptr();
                        }
                        let patched = Launch {
                            args: launch::Args(words),
                            grid: launch.grid.clone(),
                            scratch: Vec::new(),
                        };
                        launch::launch(&self.gpu, &f, &patched, s)?;
                    }
                }
                Step::Gemm(call) => match &self.blas {
                    Some(blas) => blas.run(call, s)?,
                    None => {
                        return Err(strata_core::Error::Backend(
                            "internal error: a cuBLAS call planned without cuBLAS".into(),
                        ))
                    }
                },
                Step::Conv(call) => {
                    let workspace = match call.workspace {
                        Some(i) => scratch.get(i).map_or(0, |b| b.device_ptr()),
                        None => 0,
                    };
                    match &self.dnn {
                        Some(dnn) => dnn.run(call, workspace, s)?,
                        None => {
                            return Err(strata_core::Error::Backend(
                                "internal error: a cuDNN call planned without cuDNN".into(),
                            ))
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// A map's launch: its compiled kernel (alone, or in its stream's batch when small), or
    /// at its first launch the interpreter.
    fn launch_map(
        &self,
        sig: &MapSig,
        map: &MapLaunch,
        args: &KernelArgs,
        stream: StreamId,
        s: CUstream,
    ) -> Result<()> {
        let f = match self.maps.peek(sig) {
            Some(f) => f,
            None => {
                if let Some((f, launch)) =
                    self.first_launches.interpret(sig, map, &self.compiler)?
                {
                    self.batches.send(&self.gpu, stream)?;
                    return launch::launch(&self.gpu, &f, &launch, s);
                }
                self.maps
                    .get(sig, |k| self.first_launches.function(k, &self.compiler))?
            }
        };
        let launch = &map.launch;
        if self
            .batches
            .add(&self.gpu, &self.compiler, &f, launch, stream, s, args)?
        {
            return Ok(());
        }
        self.batches.send(&self.gpu, stream)?;
        launch::launch(&self.gpu, &f, launch, s)
    }

    /// The loaded function of a generated kernel, compiled on a miss.
    fn function(&self, sig: &Sig) -> Result<Function> {
        match sig {
            Sig::Reduce(k) => self.reductions.get(k, |k| match self.unfused_function(k) {
                Some(f) => Ok(f),
                None => Function::load(
                    &self.compiler,
                    k.render()?,
                    ReduceSig::NAME,
                    k.optimization(),
                ),
            }),
            Sig::Index(k) => function(&self.indexing, k, &self.compiler),
            Sig::Matmul(k) => function(&self.matmuls, k, &self.compiler),
            Sig::Softmax(k) => function(&self.softmaxes, k, &self.compiler),
            Sig::LayerNorm(k) => function(&self.layer_norms, k, &self.compiler),
            Sig::LayerNormForward(k) => function(&self.layer_norm_forwards, k, &self.compiler),
            Sig::Moments(k) => function(&self.moments, k, &self.compiler),
            Sig::GradSums(k) => function(&self.grad_sums, k, &self.compiler),
            Sig::Histogram(k) => function(&self.histograms, k, &self.compiler),
            Sig::Conv(k) => function(&self.convolutions, k, &self.compiler),
            Sig::ConvSum(k) => function(&self.conv_sums, k, &self.compiler),
        }
    }

    /// What `steps` launch, for the profiler: each launch's kernel (or library call) and
    /// shape, joined in order; `None` for no launch.
    pub(crate) fn describe(&self, steps: &[Step]) -> Option<LaunchDescription> {
        let grid =
            |l: &Launch| dims(&self.gpu, &l.grid).map(|(g, b)| format!("grid {g:?} × block {b:?}"));
        let mut names = Vec::new();
        let mut shapes = Vec::new();
        for step in steps {
            let (name, shape) = match step {
                Step::Scratch { .. } => continue,
                Step::Map { sig, launch } => {
                    // A launch small enough is appended to its stream's batch once the
                    // kernel's batched form is due (run::batch): from its second small launch
                    // (the profiler compiles it before the launch it times).
                    let batched = self.maps.peek(sig).is_some_and(|f| {
                        self.batches
                            .form(&f, &launch.launch)
                            .is_some_and(|form| form.is_due())
                    });
                    let name = if batched {
                        "strata_map_batch"
                    } else {
                        MapSig::NAME
                    };
                    (name.to_string(), grid(&launch.launch)?)
                }
                Step::Kernel { sig, launch } => {
                    let shape = match sig {
                        Sig::Softmax(k) => {
                            format!("{}, {} threads per row", grid(launch)?, k.group)
                        }
                        Sig::Reduce(k) if k.prologue.is_some() => {
                            format!("{}, a row staged", grid(launch)?)
                        }
                        _ => grid(launch)?,
                    };
                    (sig.name().to_string(), shape)
                }
                Step::Conv(call) => {
                    let [n, c, h, w] = call.plan.key.x;
                    let [o, _, kh, kw] = call.plan.key.w;
                    (
                        format!("cuDNN {}", call.plan.key.pass.name()),
                        format!(
                            "x [{n}, {c}, {h}, {w}], w [{o}, {c}/g, {kh}, {kw}], {}, workspace {} B",
                            call.plan.algo_name, call.plan.workspace
                        ),
                    )
                }
                Step::Gemm(call) => {
                    let (batch, m, k, n) = call.dims;
                    (
                        "cublasGemmStridedBatchedEx".to_string(),
                        format!("batch {batch}, m {m}, n {n}, k {k}"),
                    )
                }
            };
            names.push(name);
            shapes.push(shape);
        }
        (!names.is_empty()).then(|| LaunchDescription {
            name: names.join(" then "),
            shape: shapes.join("; then "),
        })
    }

    /// Compiles (or loads from the disk cache) every kernel `steps` launch at its own level
    /// (waiting for a background compile under way), so that the profiler's events around the
    /// launch time the kernel users run, not NVRTC; true when something was compiled or
    /// loaded.
    pub(crate) fn compile_ahead(&self, steps: &[Step]) -> Result<bool> {
        let mut compiled = false;
        for step in steps {
            match step {
                Step::Map { sig, launch } => {
                    let f = self.maps.get(sig, |k| {
                        compiled = true;
                        self.first_launches.function(k, &self.compiler)
                    })?;
                    compiled |= f.settle();
                    if let Some(form) = self.batches.form(&f, &launch.launch) {
                        compiled |= form.prepare(&self.compiler)?;
                    }
                }
                Step::Kernel { sig, .. } => {
                    let cached = match sig {
                        Sig::Reduce(k) => self.reductions.peek(k).is_some(),
                        Sig::Index(k) => self.indexing.peek(k).is_some(),
                        Sig::Matmul(k) => self.matmuls.peek(k).is_some(),
                        Sig::Softmax(k) => self.softmaxes.peek(k).is_some(),
                        Sig::LayerNorm(k) => self.layer_norms.peek(k).is_some(),
                        Sig::LayerNormForward(k) => self.layer_norm_forwards.peek(k).is_some(),
                        Sig::Moments(k) => self.moments.peek(k).is_some(),
                        Sig::GradSums(k) => self.grad_sums.peek(k).is_some(),
                        Sig::Histogram(k) => self.histograms.peek(k).is_some(),
                        Sig::Conv(k) => self.convolutions.peek(k).is_some(),
                        Sig::ConvSum(k) => self.conv_sums.peek(k).is_some(),
                    };
                    compiled |= self.function(sig)?.settle() || !cached;
                }
                Step::Scratch { .. } | Step::Gemm(_) | Step::Conv(_) => {}
            }
        }
        Ok(compiled)
    }
}
