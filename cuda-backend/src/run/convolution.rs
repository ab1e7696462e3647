//! A convolution's launch: one cuDNN call after a scratch buffer for its algorithm's
//! workspace; without cuDNN (absent, or `STRATA_CUDNN=0`), strata's own implicit-GEMM kernel
//! (`render::conv`, core's `conv_plan`), backward filter's partial products in a scratch
//! buffer summed by a second kernel.

use super::step::{Sig, Step};
use crate::dnn::{ConvCall, ConvKey, Dnn};
use crate::launch::{Args, Launch};
use crate::render::conv::{acc_of, ConvSig, ConvSumSig};
use strata_core::backend::{KernelArgs, Operand};
use strata_core::ir::{ConvGeometry, ConvPass};
use strata_core::lower::conv_plan::{division_magic, ConvDims, ConvPlan};
use strata_core::target::Target;
use strata_core::{Error, Result};

/// An operand's address and its four sizes, checked contiguous (core makes it so).
fn operand(o: &Operand) -> Result<(u64, [usize; 4])> {
    let (Ok(shape), true) = (
        <[usize; 4]>::try_from(o.layout.shape()),
        o.layout.is_contiguous(),
    ) else {
        return Err(Error::Backend(format!(
            "internal error: a convolution operand of shape {:?}, strides {:?} (contiguous \
             4-D expected)",
            o.layout.shape(),
            o.layout.strides()
        )));
    };
    Ok((crate::memory::element_address(o)?, shape))
}

/// The steps of `Convolution { pass, geometry, tf32 }` over `args`.
pub(crate) fn steps(
    pass: ConvPass,
    geometry: ConvGeometry,
    tf32: bool,
    args: &KernelArgs,
    dnn: Option<&Dnn>,
    target: &Target,
) -> Result<Vec<Step<'static>>> {
    let (Some(out), [a, b]) = (args.outputs.first(), args.inputs.as_slice()) else {
        return Err(Error::Backend(
            "internal error: a convolution takes two inputs and one output".into(),
        ));
    };
    let (out, a, b) = (operand(out)?, operand(a)?, operand(b)?);
    let Some(dnn) = dnn else {
        let dtype = args.outputs[0].dtype;
        return implicit_gemm(pass, &geometry, dtype, [out, a, b], target);
    };
    // (x, w, y): which operand plays which part in this pass.
    let (x, w, y) = match pass {
        ConvPass::Forward => (a, b, out),
        ConvPass::BackwardData => (out, b, a),
        ConvPass::BackwardFilter => (a, out, b),
    };
    let key = ConvKey {
        pass,
        geometry,
        dtype: args.outputs[0].dtype,
        tf32,
        x: x.1,
        w: w.1,
        y: y.1,
    };
    let plan = dnn.plan(&key)?;
    let mut steps = Vec::new();
    let workspace = (plan.workspace > 0).then(|| {
        steps.push(Step::Scratch {
            bytes: plan.workspace,
        });
        0
    });
    steps.push(Step::Conv(ConvCall {
        plan,
        x: x.0,
        w: w.0,
        y: y.0,
        workspace,
    }));
    Ok(steps)
}

/// The launches of strata's own kernel for `pass` over `[out, a, b]` (address and shape
/// each): one per piece of core's plan (a single one here, where nothing limits a binding),
/// and for backward filter the sum of its partial products.
fn implicit_gemm(
    pass: ConvPass,
    geometry: &ConvGeometry,
    dtype: strata_core::DType,
    [out, a, b]: [(u64, [usize; 4]); 3],
    target: &Target,
) -> Result<Vec<Step<'static>>> {
    let acc = acc_of(dtype);
    let dims = ConvDims::of(pass, &a.1, &b.1, &out.1)?;
    let item = dtype.itemsize();
    let plan = ConvPlan::of(pass, geometry, dims, target, acc.itemsize(), [item; 3])?;
    let groups = geometry.groups.max(1);
    let filter = pass == ConvPass::BackwardFilter;
    // A is the gathered operand: x, dy, dy; B the other.
    let (pa, pb) = match pass {
        ConvPass::BackwardFilter => (b.0, a.0),
        _ => (a.0, b.0),
    };
    // Bytes a sample holds in operand A (0), B (1) or the output (2).
    let per_sample = |k: usize| -> u64 {
        let input = dims.c * dims.h * dims.w;
        let output = dims.o * dims.oh * dims.ow;
        let elements = match (pass, k) {
            (ConvPass::Forward, 0) | (ConvPass::BackwardFilter, 1) => input,
            (ConvPass::Forward, 2)
            | (ConvPass::BackwardData, 0)
            | (ConvPass::BackwardFilter, 0) => output,
            (ConvPass::BackwardData, 2) => input,
            _ => 0,
        };
        (elements * item) as u64
    };
    let weight = dims.o * (dims.c / groups) * dims.kh * dims.kw;
    let mut steps = Vec::with_capacity(plan.pieces.len() + 2);
    if filter {
        steps.push(Step::Scratch {
            bytes: plan.partials * weight * acc.itemsize(),
        });
    }
    // (Backward data: one product per stride phase, a single one at stride 1.)
    for (piece, phase) in plan.launches(pass, geometry) {
        let (piece, phase) = (&piece, phase.as_ref());
        let lw = plan.launch_words(pass, geometry, piece, phase);
        let (m, n) = (lw[0], lw[1]);
        let at = |base: u64, k: usize| base + piece.first as u64 * per_sample(k);
        let mut words = Args::new();
        for v in lw {
            words.push(v as u64);
        }
        // The output (backward filter: the partials, an offset into scratch buffer 0).
        words.push(if filter { 0 } else { at(out.0, 2) });
        words.push(at(pa, 0));
        words.push(if filter { at(pb, 1) } else { pb });
        words.push(piece.splits as u64);
        words.push(plan.per_split as u64);
        words.push((piece.first / plan.per_split) as u64);
        words.push(u64::from(piece.accumulate));
        for by in plan.divisors(phase) {
            let [m, s] = division_magic(by);
            words.push(u64::from(m));
            words.push(u64::from(s));
        }
        for v in phase.map_or([0; 14], |p| p.words()) {
            words.push(v as u64);
        }
        let [tm, tn] = plan.tile;
        let blocks = m.div_ceil(tm) * n.div_ceil(tn) * groups * piece.splits;
        let blocks = u32::try_from(blocks).map_err(|_| {
            Error::Unsupported(format!(
                "a {} of {blocks} tiles (over 32 bits)",
                pass.name()
            ))
        })?;
        let mut launch = Launch::fixed(words, (blocks, 1, 1), (256, 1, 1), 0);
        if filter {
            launch.scratch = vec![(19, 0)];
        }
        steps.push(Step::Kernel {
            sig: Sig::Conv(ConvSig {
                pass,
                dtype,
                tile: plan.tile,
                narrow: plan.narrow_indices(groups),
                strided: pass == ConvPass::BackwardData && geometry.stride != [1, 1],
            }),
            launch,
        });
    }
    if filter {
        let mut words = Args::new();
        words.push(weight as u64);
        words.push(plan.partials as u64);
        words.push(out.0);
        words.push(0);
        let mut launch = Launch::linear(words, weight);
        launch.scratch = vec![(3, 0)];
        steps.push(Step::Kernel {
            sig: Sig::ConvSum(ConvSumSig { dtype }),
            launch,
        });
    }
    Ok(steps)
}
