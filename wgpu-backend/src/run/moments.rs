//! Channel moments' and batch norm's backward sums' dispatches: a workgroup a slice of a
//! channel (core's [`moments_plan`]), and with several slices a channel, the slices' two values
//! in scratch and a second dispatch (an invocation a channel) merging them. Every operand is
//! bound whole (core sends the kernels only where `x` fits a binding).

use super::{Bind, Dispatch, Sig, Step};
use crate::render::moments::{GradSumsSig, MomentsSig, Stage};
use crate::WgpuBackend;
use strata_core::backend::KernelArgs;
use strata_core::lower::moments_plan::{self, GradSumsOperands, MomentsOperands, MomentsPlan};
use strata_core::{DType, Error, Result};

impl WgpuBackend {
    /// The dispatches of `ChannelMoments` over `args`.
    pub(crate) fn moments_steps(&self, args: &KernelArgs) -> Result<Vec<Step<'static>>> {
        let ops = MomentsOperands::of(args)?;
        f32_only("channel moments", ops.dtype)?;
        if ops.channels == 0 {
            return Ok(Vec::new());
        }
        // Scalar loads: no vector to align (the plan's `vector` is CUDA's).
        let plan = moments_plan::plan(&ops, 0, &self.target);
        self.slices_steps(args, ops.channels, ops.inner, &plan, |stage| {
            Sig::Moments(MomentsSig { stage })
        })
    }

    /// The dispatches of `ChannelGradSums` over `args`.
    pub(crate) fn grad_sums_steps(&self, args: &KernelArgs) -> Result<Vec<Step<'static>>> {
        let ops = GradSumsOperands::of(args)?;
        f32_only("batch norm's backward sums", ops.dtype)?;
        if ops.channels == 0 {
            return Ok(Vec::new());
        }
        let plan = moments_plan::grad_plan(&ops, [0, 0], &self.target);
        self.slices_steps(args, ops.channels, ops.inner, &plan, |stage| {
            Sig::GradSums(GradSumsSig { stage })
        })
    }

    /// A workgroup a slice over `channels` channels (runs of `inner`) writing two values a
    /// channel: one dispatch binding the outputs, then the inputs, with one slice a channel
    /// ([`Stage::Whole`]); else the slices' values in scratch (the first output's, then the
    /// second's) and the merge's dispatch. `params`: channels, inner, values a slice, parts,
    /// the inputs' first elements, then where the two outputs start; the merge's: channels,
    /// parts, the outputs' first elements, where the second values start in scratch. `sig`
    /// names the pipeline at a stage.
    fn slices_steps(
        &self,
        args: &KernelArgs,
        channels: usize,
        inner: usize,
        plan: &MomentsPlan,
        sig: impl Fn(Stage) -> Sig<'static>,
    ) -> Result<Vec<Step<'static>>> {
        let (binds, firsts) = self.whole_bindings(args)?;
        let (outputs, inputs) = binds.split_at(2);
        let (out_firsts, in_firsts) = firsts.split_at(2);
        let (c, parts) = (channels as u32, plan.parts as u32);
        let mut params = vec![c, inner as u32, plan.count as u32, parts];
        params.extend_from_slice(in_firsts);
        let threads = channels * plan.parts * 256;
        if plan.parts == 1 {
            params.extend_from_slice(out_firsts);
            return Ok(vec![Step::Dispatch(Dispatch {
                sig: sig(Stage::Whole),
                params,
                binds,
                threads,
            })]);
        }
        let slices = c * parts;
        params.extend([0, slices]);
        let scratch = Bind::Scratch { scratch: 0 };
        let mut slice_binds = vec![scratch];
        slice_binds.extend_from_slice(inputs);
        Ok(vec![
            Step::Scratch {
                bytes: 2 * slices as usize * 4,
            },
            Step::Dispatch(Dispatch {
                sig: sig(Stage::Slices),
                params,
                binds: slice_binds,
                threads,
            }),
            Step::Dispatch(Dispatch {
                sig: sig(Stage::Merge),
                params: vec![c, parts, out_firsts[0], out_firsts[1], slices],
                binds: vec![outputs[0], outputs[1], scratch],
                threads: channels.div_ceil(256) * 256,
            }),
        ])
    }
}

/// The kernels are rendered for f32 (core sends no other dtype: `Target::channel_*_dtypes`).
fn f32_only(what: &str, dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 => Ok(()),
        d => Err(Error::Unsupported(format!(
            "wgpu runs {what} for f32, not {d}"
        ))),
    }
}
