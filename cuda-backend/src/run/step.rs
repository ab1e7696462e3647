//! What running a kernel takes, as data: its launch steps, which the planners here write and
//! `Runner` executes, describes and compiles ahead.

use crate::blas::GemmCall;
use crate::dnn::ConvCall;
use crate::launch::Launch;
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
use strata_core::layout::{Dims, Strides};

/// One thing a kernel's launch does, in order.
#[derive(Debug)]
pub(crate) enum Step<'k> {
    /// Device memory of `bytes` bytes that later launches of the same kernel use (a split
    /// reduction's partials), freed in stream order after the last.
    Scratch { bytes: usize },
    /// A map: the generated kernel, whose first launch may run through the interpreter and
    /// whose small launches join their stream's batch.
    Map { sig: MapSig<'k>, launch: MapLaunch },
    /// A generated kernel of another kind.
    Kernel { sig: Sig, launch: Launch },
    /// A cuBLAS call.
    Gemm(GemmCall),
    /// A cuDNN convolution.
    Conv(ConvCall),
}

/// The signature of a generated kernel other than a map.
#[derive(Debug)]
pub(crate) enum Sig {
    Reduce(ReduceSig),
    Index(IndexSig),
    Matmul(MatmulSig),
    Softmax(SoftmaxSig),
    LayerNormForward(LayerNormForwardSig),
    LayerNorm(LayerNormSig),
    Moments(MomentsSig),
    GradSums(GradSumsSig),
    Histogram(HistogramSig),
    Conv(ConvSig),
    ConvSum(ConvSumSig),
}

/// `first`'s steps, then `then`'s, whose scratch buffers are numbered after `first`'s.
pub(super) fn chain<'k>(mut first: Vec<Step<'k>>, then: Vec<Step<'k>>) -> Vec<Step<'k>> {
    let before = first
        .iter()
        .filter(|s| matches!(s, Step::Scratch { .. }))
        .count();
    for mut step in then {
        if let Step::Kernel { launch, .. } = &mut step {
            for (_, buffer) in &mut launch.scratch {
                *buffer += before;
            }
        }
        first.push(step);
    }
    first
}

/// A map's launch as its planner made it: the words and grid a compiled kernel takes, and the
/// same values as data (the interpreter lays them out its own way,
/// [`first_launch`](super::first_launch)).
#[derive(Debug)]
pub(crate) struct MapLaunch {
    /// The compiled kernel's argument words and grid.
    pub launch: Launch,
    /// Elements written.
    pub numel: usize,
    /// The piece's extents (its axes, coalesced).
    pub shape: Dims,
    /// Per operand (outputs first), the address of its first element and its strides over the
    /// piece's axes.
    pub operands: Vec<(u64, Strides)>,
    /// The launch scalars' bits.
    pub scalars: Vec<u64>,
}

impl Sig {
    /// The kernel's entry point.
    pub(super) fn name(&self) -> &'static str {
        match self {
            Sig::Reduce(_) => ReduceSig::NAME,
            Sig::Index(_) => IndexSig::NAME,
            Sig::Matmul(_) => MatmulSig::NAME,
            Sig::Softmax(_) => SoftmaxSig::NAME,
            Sig::LayerNormForward(_) => LayerNormForwardSig::NAME,
            Sig::LayerNorm(_) => LayerNormSig::NAME,
            Sig::Moments(_) => MomentsSig::NAME,
            Sig::GradSums(_) => GradSumsSig::NAME,
            Sig::Histogram(_) => HistogramSig::NAME,
            Sig::Conv(_) => ConvSig::NAME,
            Sig::ConvSum(_) => ConvSumSig::NAME,
        }
    }
}
