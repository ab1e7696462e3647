//! What `run` dispatches for a kernel, for the profiler: the shader and its dispatches,
//! planned as `run` plans them (no pipeline, no dispatch).

use crate::codegen::matmul::TILE;
use crate::launch::{buffer_info, raw};
use crate::WgpuBackend;
use strata_core::backend::LaunchDescription;
use strata_core::ir::{IndexKind, Kernel, KernelArgs};
use strata_core::lower::operands::{MatmulOperands, ReduceOperands};
use strata_core::lower::reduce_plan;

impl WgpuBackend {
    pub(crate) fn describe(&self, kernel: &Kernel, args: &KernelArgs) -> Option<LaunchDescription> {
        let (name, shape) = match kernel {
            Kernel::Map { expr, also } => {
                let (_, _, plan) = self.plan_map(expr, also, args).ok()?;
                let first = plan.pieces.first()?;
                (
                    "strata_map",
                    format!(
                        "{} invocations in workgroups of 256, {} dispatch{}",
                        first.work,
                        plan.pieces.len(),
                        if plan.pieces.len() == 1 { "" } else { "es" }
                    ),
                )
            }
            Kernel::Reduce { reduced_axes, .. } => {
                let ops = ReduceOperands::of(*reduced_axes, args).ok()?;
                let (in_buf, out_buf) = (raw(ops.input).ok()?, raw(ops.out).ok()?);
                let plan =
                    reduce_plan::plan(&ops, &buffer_info(&[out_buf, in_buf]), &self.target).ok()?;
                (
                    "strata_reduce",
                    format!(
                        "{} outputs × {} splits, {} invocations per output, {} dispatch(es){}",
                        plan.outputs,
                        plan.splits,
                        plan.group,
                        plan.launches.len(),
                        if plan.splits > 1 {
                            " and a combine"
                        } else {
                            ""
                        }
                    ),
                )
            }
            Kernel::Matmul { .. } => {
                let ops = MatmulOperands::of(args).ok()?;
                let (batch, m, k, n) = ops.dims;
                (
                    "strata_matmul",
                    format!(
                        "{} tiles of {TILE}×{TILE} (batch {batch}, m {m}, n {n}, k {k})",
                        batch * m.div_ceil(TILE) * n.div_ceil(TILE)
                    ),
                )
            }
            Kernel::Softmax { .. } => return None,
            Kernel::Index { kind, .. } => {
                // A gather visits its output, a scatter its index.
                let visited = if *kind == IndexKind::Gather {
                    args.outputs.first()?
                } else {
                    args.inputs.get(1)?
                };
                (
                    "strata_index",
                    format!(
                        "{} invocations in workgroups of 256",
                        visited.layout.numel()
                    ),
                )
            }
        };
        Some(LaunchDescription {
            name: name.into(),
            shape,
        })
    }
}
