//! Channel moments' launches: core's plan ([`moments_plan`]) as the kernel's words and grid —
//! a block of [`THREADS`] a slice of a channel, and with several slices a channel, their
//! statistics in scratch and a second launch (a thread a channel) merging them.

use super::step::{Sig, Step};
use crate::launch::{Args, Launch};
use crate::memory::element_address;
use crate::render::moments::{GradSumsSig, MomentsSig, Stage};
use strata_core::backend::KernelArgs;
use strata_core::lower::moments_plan::{
    self, GradSumsOperands, MomentsOperands, MomentsPlan, THREADS,
};
use strata_core::target::Target;
use strata_core::{DType, Result};

/// The steps of `ChannelMoments` over `args` on `target`; none without channels.
pub(crate) fn steps(args: &KernelArgs, target: &Target) -> Result<Vec<Step<'static>>> {
    let ops = MomentsOperands::of(args)?;
    if ops.channels == 0 {
        return Ok(Vec::new());
    }
    let x = element_address(ops.x)?;
    let outputs = [element_address(ops.mean)?, element_address(ops.var)?];
    let plan = moments_plan::plan(&ops, x, target);
    let sig = |stage, vector| {
        Sig::Moments(MomentsSig {
            dtype: ops.dtype,
            vector,
            stage,
        })
    };
    Ok(launches(
        ops.channels,
        ops.inner,
        ops.dtype,
        &plan,
        &[x],
        outputs,
        sig,
    ))
}

/// The steps of `ChannelGradSums` over `args` on `target` (as [`steps`]); none without
/// channels.
pub(crate) fn grad_steps(args: &KernelArgs, target: &Target) -> Result<Vec<Step<'static>>> {
    let ops = GradSumsOperands::of(args)?;
    if ops.channels == 0 {
        return Ok(Vec::new());
    }
    let [x, g, mean, rstd, sum_g, sum_gx] =
        [ops.x, ops.g, ops.mean, ops.rstd, ops.sum_g, ops.sum_gx].map(element_address);
    let inputs = [x?, g?, mean?, rstd?];
    let plan = moments_plan::grad_plan(&ops, [inputs[0], inputs[1]], target);
    let sig = |stage, vector| {
        Sig::GradSums(GradSumsSig {
            dtype: ops.dtype,
            vector,
            stage,
        })
    };
    Ok(launches(
        ops.channels,
        ops.inner,
        ops.dtype,
        &plan,
        &inputs,
        [sum_g?, sum_gx?],
        sig,
    ))
}

/// A slice a block over `channels` channels of `dtype` (runs of `inner`) reading the `inputs`
/// addresses and writing its two values a slice to `outputs`: one launch ([`Stage::Whole`])
/// with one slice a channel, else the slices' values in scratch (the first, then the second)
/// and the merge's launch. `sig` names the kernel at a stage and vector width.
fn launches(
    channels: usize,
    inner: usize,
    dtype: DType,
    plan: &MomentsPlan,
    inputs: &[u64],
    [first, second]: [u64; 2],
    sig: impl Fn(Stage, usize) -> Sig,
) -> Vec<Step<'static>> {
    let slices = channels * plan.parts;
    let mut w = Args::new();
    for word in [channels, inner, plan.count, plan.parts] {
        w.push(word as u64);
    }
    for &a in inputs {
        w.push(a);
    }
    let block = (THREADS as u32, 1, 1);
    let grid = (slices as u32, 1, 1);
    if plan.parts == 1 {
        w.push(first);
        w.push(second);
        return vec![Step::Kernel {
            sig: sig(Stage::Whole, plan.vector),
            launch: Launch::fixed(w, grid, block, 0),
        }];
    }
    // One scratch buffer, its address added to these offsets.
    let bytes = slices * dtype.accumulator().itemsize();
    let out_word = 4 + inputs.len();
    w.push(0);
    w.push(bytes as u64);
    let mut slice = Launch::fixed(w, grid, block, 0);
    slice.scratch = vec![(out_word, 0), (out_word + 1, 0)];
    let mut m = Args::new();
    for word in [
        channels as u64,
        plan.parts as u64,
        0,
        bytes as u64,
        first,
        second,
    ] {
        m.push(word);
    }
    let mut merge = Launch::fixed(m, (channels.div_ceil(THREADS) as u32, 1, 1), block, 0);
    merge.scratch = vec![(2, 0), (3, 0)];
    vec![
        Step::Scratch { bytes: 2 * bytes },
        Step::Kernel {
            sig: sig(Stage::Slices, plan.vector),
            launch: slice,
        },
        Step::Kernel {
            sig: sig(Stage::Merge, 1),
            launch: merge,
        },
    ]
}
