//! Channel moments' launches: core's plan ([`moments_plan`]) as the kernel's words and grid —
//! a block of [`THREADS`] a slice of a channel, and with several slices a channel, their
//! statistics in scratch and a second launch (a thread a channel) merging them.

use super::step::{Sig, Step};
use crate::launch::{Args, Launch};
use crate::memory::element_address;
use crate::render::moments::{GradSumsSig, MomentsSig, Stage};
use strata_core::backend::KernelArgs;
use strata_core::lower::moments_plan::{self, GradSumsOperands, MomentsOperands, THREADS};
use strata_core::target::Target;
use strata_core::Result;

/// The steps of `ChannelMoments` over `args` on `target`; none without channels.
pub(crate) fn steps(args: &KernelArgs, target: &Target) -> Result<Vec<Step<'static>>> {
    let ops = MomentsOperands::of(args)?;
    if ops.channels == 0 {
        return Ok(Vec::new());
    }
    let x = element_address(ops.x)?;
    let (mean, var) = (element_address(ops.mean)?, element_address(ops.var)?);
    let plan = moments_plan::plan(&ops, x, target);
    let slices = ops.channels * plan.parts;
    let mut w = Args::new();
    for word in [ops.channels, ops.inner, plan.count, plan.parts] {
        w.push(word as u64);
    }
    w.push(x);
    let block = (THREADS as u32, 1, 1);
    let sig = |stage, vector| {
        Sig::Moments(MomentsSig {
            dtype: ops.dtype,
            vector,
            stage,
        })
    };
    if plan.parts == 1 {
        w.push(mean);
        w.push(var);
        return Ok(vec![Step::Kernel {
            sig: sig(Stage::Whole, plan.vector),
            launch: Launch::fixed(w, (slices as u32, 1, 1), block, 0),
        }]);
    }
    // The slices' means, then their variances, in one scratch buffer (its address is added to
    // these offsets).
    let bytes = slices * ops.dtype.accumulator().itemsize();
    w.push(0);
    w.push(bytes as u64);
    let mut first = Launch::fixed(w, (slices as u32, 1, 1), block, 0);
    first.scratch = vec![(5, 0), (6, 0)];
    let mut m = Args::new();
    for word in [
        ops.channels as u64,
        plan.parts as u64,
        0,
        bytes as u64,
        mean,
        var,
    ] {
        m.push(word);
    }
    let mut merge = Launch::fixed(m, (ops.channels.div_ceil(THREADS) as u32, 1, 1), block, 0);
    merge.scratch = vec![(2, 0), (3, 0)];
    Ok(vec![
        Step::Scratch { bytes: 2 * bytes },
        Step::Kernel {
            sig: sig(Stage::Slices, plan.vector),
            launch: first,
        },
        Step::Kernel {
            sig: sig(Stage::Merge, 1),
            launch: merge,
        },
    ])
}

/// The steps of `ChannelGradSums` over `args` on `target` (as [`steps`]); none without
/// channels.
pub(crate) fn grad_steps(args: &KernelArgs, target: &Target) -> Result<Vec<Step<'static>>> {
    let ops = GradSumsOperands::of(args)?;
    if ops.channels == 0 {
        return Ok(Vec::new());
    }
    let addresses = [ops.x, ops.g, ops.mean, ops.rstd, ops.sum_g, ops.sum_gx]
        .map(element_address)
        .into_iter()
        .collect::<Result<Vec<u64>>>()?;
    let plan = moments_plan::grad_plan(&ops, [addresses[0], addresses[1]], target);
    let slices = ops.channels * plan.parts;
    let mut w = Args::new();
    for word in [ops.channels, ops.inner, plan.count, plan.parts] {
        w.push(word as u64);
    }
    for &a in &addresses[..4] {
        w.push(a);
    }
    let block = (THREADS as u32, 1, 1);
    let sig = |stage, vector| {
        Sig::GradSums(GradSumsSig {
            dtype: ops.dtype,
            vector,
            stage,
        })
    };
    let (sum_g, sum_gx) = (addresses[4], addresses[5]);
    if plan.parts == 1 {
        w.push(sum_g);
        w.push(sum_gx);
        return Ok(vec![Step::Kernel {
            sig: sig(Stage::Whole, plan.vector),
            launch: Launch::fixed(w, (slices as u32, 1, 1), block, 0),
        }]);
    }
    // The slices' `Σg`, then their `Σg·x̂`, in one scratch buffer.
    let bytes = slices * ops.dtype.accumulator().itemsize();
    w.push(0);
    w.push(bytes as u64);
    let mut first = Launch::fixed(w, (slices as u32, 1, 1), block, 0);
    first.scratch = vec![(8, 0), (9, 0)];
    let mut m = Args::new();
    for word in [
        ops.channels as u64,
        plan.parts as u64,
        0,
        bytes as u64,
        sum_g,
        sum_gx,
    ] {
        m.push(word);
    }
    let mut merge = Launch::fixed(m, (ops.channels.div_ceil(THREADS) as u32, 1, 1), block, 0);
    merge.scratch = vec![(2, 0), (3, 0)];
    Ok(vec![
        Step::Scratch { bytes: 2 * bytes },
        Step::Kernel {
            sig: sig(Stage::Slices, plan.vector),
            launch: first,
        },
        Step::Kernel {
            sig: sig(Stage::Merge, 1),
            launch: merge,
        },
    ])
}
