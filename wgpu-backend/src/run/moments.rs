//! Channel moments' dispatches: a workgroup a slice of a channel (core's [`moments_plan`]),
//! and with several slices a channel, their statistics in scratch and a second dispatch (an
//! invocation a channel) merging them. Every operand is bound whole (core sends the kernel
//! only where `x` fits a binding).

use super::{Bind, Dispatch, Sig, Step};
use crate::render::moments::{MomentsSig, Stage, PARAMS};
use crate::WgpuBackend;
use strata_core::backend::KernelArgs;
use strata_core::lower::moments_plan::{self, MomentsOperands};
use strata_core::{DType, Error, Result};

impl WgpuBackend {
    /// The dispatches of `ChannelMoments` over `args`.
    pub(crate) fn moments_steps(&self, args: &KernelArgs) -> Result<Vec<Step<'static>>> {
        let ops = MomentsOperands::of(args)?;
        if ops.dtype != DType::F32 {
            return Err(Error::Unsupported(format!(
                "wgpu runs channel moments for f32, not {}",
                ops.dtype
            )));
        }
        if ops.channels == 0 {
            return Ok(Vec::new());
        }
        // Scalar loads: no vector to align (the plan's `vector` is CUDA's).
        let plan = moments_plan::plan(&ops, 0, &self.target);
        let (binds, firsts) = self.whole_bindings(args)?;
        // mean, var, x.
        let [mean, var, x] = [firsts[0], firsts[1], firsts[2]];
        let [mean_bind, var_bind, x_bind] = [binds[0], binds[1], binds[2]];
        let (channels, parts) = (ops.channels as u32, plan.parts as u32);
        let mut params = vec![channels, ops.inner as u32, plan.count as u32, parts, x];
        let threads = ops.channels * plan.parts * 256;
        if plan.parts == 1 {
            params.extend([mean, var]);
            return Ok(vec![Step::Dispatch(Dispatch {
                sig: Sig::Moments(MomentsSig {
                    stage: Stage::Whole,
                }),
                params,
                binds,
                threads,
            })]);
        }
        // The slices' means, then their variances.
        let slices = channels * parts;
        params.extend([0, slices]);
        let mut merge = vec![channels, parts, mean, var, slices];
        merge.resize(PARAMS, 0);
        Ok(vec![
            Step::Scratch {
                bytes: 2 * slices as usize * 4,
            },
            Step::Dispatch(Dispatch {
                sig: Sig::Moments(MomentsSig {
                    stage: Stage::Slices,
                }),
                params,
                binds: vec![Bind::Scratch { scratch: 0 }, x_bind],
                threads,
            }),
            Step::Dispatch(Dispatch {
                sig: Sig::Moments(MomentsSig {
                    stage: Stage::Merge,
                }),
                params: merge,
                binds: vec![mean_bind, var_bind, Bind::Scratch { scratch: 0 }],
                threads: ops.channels.div_ceil(256) * 256,
            }),
        ])
    }
}
