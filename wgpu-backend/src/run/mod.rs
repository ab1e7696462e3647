//! Deciding what runs. A kernel becomes its steps ([`WgpuBackend::steps`]), planned once from
//! core's plans: scratch buffers and dispatches, each with its pipeline's signature, its
//! parameter words, the windows it binds (by operand, so planning needs no buffer) and its
//! invocations. `run` executes them, the profiler names them and `explain` renders the first
//! map's. A new kernel kind is a planner here and a renderer in `crate::render`.

mod conv;
mod histogram;
mod index;
mod layer_norm;
mod map;
mod matmul;
mod moments;
mod reduce;
mod softmax;
mod staged;

use crate::launch::{operand_info, raw, Binding};
use crate::render::conv::ConvSig;
use crate::render::histogram::HistogramSig;
use crate::render::layer_norm::{LayerNormForwardSig, LayerNormSig};
use crate::render::moments::{GradSumsSig, MomentsSig};
use crate::render::softmax::SoftmaxSig;
use crate::render::staged::StagedSig;
use crate::render::{self, prelude};
use crate::render::{index::IndexSig, map::MapSig, matmul::MatmulSig, reduce::ReduceSig};
use crate::WgpuBackend;
use std::sync::Arc;
use strata_core::backend::{KernelArgs, Operand};
use strata_core::backend::{KernelSource, LaunchDescription};
use strata_core::ir::Kernel;
use strata_core::lower::pieces::{Access, Window};
use strata_core::{Backend, Error, Result};

/// One thing a kernel's launch does, in order.
// (Steps live for one launch: boxing the dispatch would allocate once more per dispatch.)
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Step<'k> {
    /// A pool buffer of `bytes` bytes that later dispatches bind whole (a split reduction's
    /// partials), returned to the pool after the last.
    Scratch { bytes: usize },
    /// One dispatch.
    Dispatch(Dispatch<'k>),
}

/// One dispatch of a generated kernel.
#[derive(Debug)]
pub(crate) struct Dispatch<'k> {
    pub sig: Sig<'k>,
    /// The `params` words.
    pub params: Vec<u32>,
    /// The storage bindings after the parameters, in order.
    pub binds: Vec<Bind>,
    /// Invocations (256 per workgroup).
    pub threads: usize,
}

/// A storage binding of a dispatch.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Bind {
    /// A window of an operand's buffer (operands numbered outputs first, then inputs).
    Operand { operand: usize, window: Window },
    /// A scratch buffer of the kernel's steps, whole.
    Scratch { scratch: usize },
}

/// The signature of a dispatch's pipeline.
#[derive(Debug)]
pub(crate) enum Sig<'k> {
    Map(MapSig<'k>),
    Reduce(ReduceSig),
    Index(IndexSig),
    Matmul(MatmulSig),
    Histogram(HistogramSig),
    Softmax(SoftmaxSig),
    LayerNorm(LayerNormSig),
    LayerNormForward(LayerNormForwardSig),
    Moments(MomentsSig),
    GradSums(GradSumsSig),
    Staged(StagedSig),
    Conv(ConvSig),
}

impl Sig<'_> {
    /// The kernel's name, for the profiler.
    fn name(&self) -> &'static str {
        match self {
            Sig::Map(_) => "strata_map",
            // (A staged reduction is a reduction, as on CUDA.)
            Sig::Reduce(_) | Sig::Staged(_) => "strata_reduce",
            Sig::Index(_) => "strata_index",
            Sig::Matmul(MatmulSig { coop: true, .. }) => "strata_matmul_coop",
            Sig::Matmul(_) => "strata_matmul",
            Sig::Histogram(_) => "strata_histogram",
            Sig::Softmax(_) => "strata_softmax",
            Sig::LayerNorm(_) => "strata_layer_norm_backward",
            Sig::LayerNormForward(_) => "strata_layer_norm",
            Sig::Moments(_) => "strata_channel_moments",
            Sig::GradSums(_) => "strata_channel_grad_sums",
            Sig::Conv(ConvSig {
                sum_partials: true, ..
            }) => "strata_conv_sum",
            Sig::Conv(_) => "strata_conv",
        }
    }
}

/// Operand `k` of `args`: the outputs first, then the inputs.
fn operand(args: &KernelArgs, k: usize) -> Result<&Operand> {
    let outputs = args.outputs.len();
    let op = if k < outputs {
        args.outputs.get(k)
    } else {
        args.inputs.get(k - outputs)
    };
    op.ok_or_else(|| Error::Backend(format!("internal error: a binding of operand {k}")))
}

/// Whether rows laid out as `strides` (the row's axis last) from element `offset` all start
/// on a 16-byte vector of 4-byte elements and run contiguously: the row kernels' `vec4` path.
pub(crate) fn rows_on_vectors(offset: usize, strides: &[isize]) -> bool {
    let Some((&along, outer)) = strides.split_last() else {
        return false;
    };
    along == 1 && offset.is_multiple_of(4) && outer.iter().all(|s| s % 4 == 0)
}

/// `op` as core's splitter sees it over iteration strides `strides` (a stand-in's size when
/// planning without buffers).
pub(crate) fn access(op: &Operand, strides: Vec<isize>) -> Result<Access> {
    Ok(Access {
        strides: strides.into(),
        offset: op.layout.offset(),
        itemsize: op.dtype.itemsize(),
        buffer_bytes: operand_info(op)?.bytes,
    })
}

impl WgpuBackend {
    /// The steps `kernel` over `args` takes on this adapter: the one place each kernel kind's
    /// dispatches are decided.
    pub(crate) fn steps<'k>(&self, kernel: &'k Kernel, args: &KernelArgs) -> Result<Vec<Step<'k>>> {
        match kernel {
            Kernel::Map { expr, also } => self.map_steps(expr, also, args),
            // A row prologue (and epilogue) in one dispatch where the rows stage; otherwise
            // `run` runs core's launches one by one (the steps here bind one launch's
            // operands).
            Kernel::Reduce {
                prologue, epilogue, ..
            } if prologue.is_some() || epilogue.is_some() => {
                self.staged_steps(kernel, args)?.ok_or_else(|| {
                    Error::Backend(
                        "internal error: a row prologue or epilogue that does not stage runs as \
                         core's launches"
                            .into(),
                    )
                })
            }
            // (The target does not store a reduction's map: core never asks.)
            Kernel::Reduce {
                stores_map: true, ..
            } => Err(Error::Backend(
                "a reduction that stores its map does not run on wgpu (stores_reduce_map)".into(),
            )),
            Kernel::Reduce {
                op,
                reduced_axes,
                acc,
                map,
                ..
            } => self.reduce_steps(*op, *reduced_axes, *acc, map.as_ref(), args),
            Kernel::Matmul { acc, .. } => self.matmul_steps(*acc, args),
            Kernel::Index { kind, axis } => self.index_steps(*kind, *axis, args),
            Kernel::Softmax { log } => self.softmax_steps(*log, args),
            Kernel::Histogram {
                bins,
                bin,
                weighted,
            } => self.histogram_steps(*bins, bin, *weighted, args),
            Kernel::Convolution { pass, geometry, .. } => self.conv_steps(*pass, geometry, args),
            Kernel::LayerNorm { weight, bias } => {
                self.layer_norm_forward_steps(*weight, *bias, args)
            }
            Kernel::LayerNormBackward { weight, columns } => {
                self.layer_norm_steps(*weight, *columns, args)
            }
            Kernel::ChannelMoments => self.moments_steps(args),
            Kernel::ChannelGradSums => self.grad_sums_steps(args),
        }
    }

    /// Records `steps` (of a kernel over `args`) into the command batch.
    pub(crate) fn execute(&self, steps: &[Step], args: &KernelArgs) -> Result<()> {
        let mut scratch = Vec::new();
        for step in steps {
            let d = match step {
                Step::Scratch { bytes } => {
                    scratch.push(self.pool.allocate(*bytes)?);
                    continue;
                }
                Step::Dispatch(d) => d,
            };
            let pipeline = self.pipeline(&d.sig)?;
            let bindings = d
                .binds
                .iter()
                .map(|b| match *b {
                    Bind::Operand { operand: k, window } => Ok(Binding {
                        buffer: raw(operand(args, k)?)?,
                        window,
                    }),
                    Bind::Scratch { scratch: k } => Ok(Binding::whole(scratch[k].raw())),
                })
                .collect::<Result<Vec<_>>>()?;
            self.gpu
                .dispatch(&pipeline, &d.params, &bindings, d.threads)?;
        }
        // The scratch buffers return to the pool here; later work is ordered after it.
        Ok(())
    }

    /// The pipeline of `sig`, compiled on a miss.
    fn pipeline(&self, sig: &Sig) -> Result<Arc<wgpu::ComputePipeline>> {
        let caps = self.gpu.caps;
        match sig {
            Sig::Map(sig) => self.maps.get(sig, |sig| {
                // Dtypes inside the tree (an f64 intermediate, say) are checked once, here.
                let mut used = std::collections::BTreeSet::new();
                prelude::dtypes_of(&sig.trees.expr, &mut used);
                for d in used {
                    self.check_dtype(d)?;
                }
                self.gpu
                    .pipeline(&render::map::source(sig, caps)?, sig.dtypes.len())
            }),
            Sig::Reduce(sig) => self.reductions.get(sig, |sig| {
                let source = render::reduce::source(sig, caps)?;
                self.gpu.pipeline(&source, render::reduce::bindings(sig))
            }),
            Sig::Index(sig) => self.indexing.get(sig, |sig| {
                let bindings = 3 + usize::from(sig.flagged);
                self.gpu
                    .pipeline(&render::index::source(sig, caps), bindings)
            }),
            Sig::Matmul(sig) => self.matmuls.get(sig, |sig| {
                let source = if sig.coop {
                    render::coop_matmul::source(
                        caps,
                        sig.staged[0] == render::matmul::Staged::AlongDepth,
                    )
                } else {
                    render::matmul::source(sig, caps)
                };
                self.gpu.pipeline(&source, 3)
            }),
            Sig::Softmax(sig) => self.softmaxes.get(sig, |sig| {
                self.gpu.pipeline(&render::softmax::source(sig, caps)?, 2)
            }),
            Sig::LayerNormForward(sig) => self.layer_norm_forwards.get(sig, |sig| {
                let bindings = 4 + sig.weight as usize + sig.bias as usize;
                self.gpu
                    .pipeline(&render::layer_norm::forward_source(sig, caps), bindings)
            }),
            Sig::Moments(sig) => self.moments.get(sig, |sig| {
                self.gpu
                    .pipeline(&render::moments::source(sig, caps), sig.bindings())
            }),
            Sig::GradSums(sig) => self.grad_sums.get(sig, |sig| {
                self.gpu
                    .pipeline(&render::moments::grad_source(sig, caps), sig.bindings())
            }),
            Sig::LayerNorm(sig) => self.layer_norms.get(sig, |sig| {
                let bindings = 5 + 2 * sig.columns as usize + sig.weight as usize;
                self.gpu
                    .pipeline(&render::layer_norm::source(sig, caps), bindings)
            }),
            Sig::Staged(sig) => self.staged.get(sig, |sig| {
                let source = render::staged::source(sig, caps)?;
                self.gpu.pipeline(&source, render::staged::bindings(sig))
            }),
            Sig::Conv(sig) => self.convolutions.get(sig, |sig| {
                let bindings = if sig.sum_partials { 2 } else { 3 };
                self.gpu
                    .pipeline(&render::conv::source(sig, caps), bindings)
            }),
            Sig::Histogram(sig) => self.histograms.get(sig, |sig| {
                let mut used = std::collections::BTreeSet::new();
                prelude::dtypes_of(&sig.bin, &mut used);
                for d in used {
                    self.check_dtype(d)?;
                }
                let bindings = 2 + usize::from(sig.weighted);
                self.gpu
                    .pipeline(&render::histogram::source(sig, caps)?, bindings)
            }),
        }
    }

    /// What `steps` dispatch, for the profiler: each kernel with its dispatches' invocations.
    pub(crate) fn describe(&self, steps: &[Step]) -> Option<LaunchDescription> {
        let mut kernels: Vec<(&'static str, Vec<usize>)> = Vec::new();
        for step in steps {
            let Step::Dispatch(d) = step else { continue };
            match kernels.last_mut() {
                Some((name, threads)) if *name == d.sig.name() => threads.push(d.threads),
                _ => kernels.push((d.sig.name(), vec![d.threads])),
            }
        }
        let shape = |threads: &[usize]| match threads {
            [one] => format!("{one} invocations in workgroups of 256"),
            many => format!(
                "{} dispatches of {} invocations in workgroups of 256",
                many.len(),
                many.iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        (!kernels.is_empty()).then(|| LaunchDescription {
            name: kernels
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(" then "),
            shape: kernels
                .iter()
                .map(|(_, t)| shape(t))
                .collect::<Vec<_>>()
                .join("; then "),
        })
    }

    /// The WGSL of the first dispatch of `steps`, a map's, and how it is launched.
    pub(crate) fn map_source_of(&self, steps: &[Step]) -> Result<Option<KernelSource>> {
        let dispatches: Vec<&Dispatch> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Dispatch(d) => Some(d),
                Step::Scratch { .. } => None,
            })
            .collect();
        let Some(Dispatch {
            sig: Sig::Map(sig),
            threads,
            ..
        }) = dispatches.first()
        else {
            return Ok(None);
        };
        let pieces = dispatches.len();
        Ok(Some(KernelSource {
            language: "WGSL".into(),
            launch: format!(
                "{threads} invocations in workgroups of 256{}",
                if pieces > 1 {
                    format!(", first of {pieces} dispatches (binding windows)")
                } else {
                    String::new()
                }
            ),
            source: render::map::source(sig, self.gpu.caps)?,
        }))
    }
}
