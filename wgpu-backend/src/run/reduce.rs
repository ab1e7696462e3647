//! A reduction: core's plan, one dispatch per window, and a combine dispatch when the plan
//! splits the extent into ranges (partials `[outputs, splits]` in the accumulator dtype, and
//! positions for argmin/argmax). A fused map (map→reduce) is evaluated per element inside the
//! reduction, its further inputs bound whole (core fuses only what fits: `Target::binds_reduce`).

use super::{Bind, Dispatch, Sig, Step};
use crate::launch::operand_info;
use crate::render::reduce;
use crate::WgpuBackend;
use strata_core::backend::KernelArgs;
use strata_core::ir::{Expr, ReduceOp};
use strata_core::lower::operands::{ReduceMap, ReduceOperands};
use strata_core::lower::pieces::Window;
use strata_core::lower::reduce_plan::{self, partial_strides, ReducePlan};
use strata_core::{Backend, DType, Error, Result};

impl WgpuBackend {
    /// The dispatches of `Reduce { op, reduced_axes, acc, map }` over `args`.
    pub(crate) fn reduce_steps(
        &self,
        op: ReduceOp,
        reduced_axes: usize,
        acc: DType,
        map: Option<&Expr>,
        args: &KernelArgs,
    ) -> Result<Vec<Step<'static>>> {
        let ops = ReduceOperands::of(reduced_axes, args)?;
        self.check_dtype(acc)?;
        if ops.outputs == 0 {
            return Ok(Vec::new());
        }
        let map = map.map(|expr| ReduceMap::of(expr, &ops, args));
        let buffers = [operand_info(ops.out)?, operand_info(ops.input)?];
        // Vectors are four 32-bit elements (render::reduce): other dtypes are planned (ranges,
        // splits) element by element, as they are read.
        let target = if ops.input.dtype.itemsize() == 4 {
            &self.target
        } else {
            &self.element_target
        };
        let plan = reduce_plan::plan(&ops, &buffers, target)?;
        let windowed = || Error::Backend("internal error: the wgpu target binds windows".into());
        // Operands: the output (0), then the input (1) and the map's further inputs.
        let mut steps = Vec::new();
        let (ro, rr) = (plan.outer_shape.len(), plan.reduced_shape.len());
        let arg = op.returns_index();
        let partial = plan.splits > 1;
        // Scratch 0: the partial values; scratch 1: their positions (argmin, argmax).
        if partial {
            let n = plan.outputs * plan.splits;
            steps.push(Step::Scratch {
                bytes: n * acc.itemsize(),
            });
            if arg {
                steps.push(Step::Scratch { bytes: n * 4 });
            }
        }
        let slots = reduce::slots(ro, rr, map.as_ref());
        let vector = vector_width(&plan, &ops, map.as_ref());
        let sig = reduce::ReduceSig {
            op,
            acc,
            input: ops.input.dtype,
            out: if partial { acc } else { ops.out.dtype },
            outer_rank: ro,
            reduced_rank: rr,
            group: plan.group,
            combine: false,
            partial,
            map,
            vector,
        };
        let partial_outer = partial_strides(&plan.outer_shape, plan.splits);
        for launch in &plan.launches {
            let outputs: usize = launch.piece.len[..ro].iter().product();
            if outputs == 0 {
                continue;
            }
            let input = launch.input.ok_or_else(windowed)?;
            let mut params = vec![0u32; slots.len];
            params[0] = outputs as u32;
            params[1] = launch.piece.len[ro..].iter().product::<usize>() as u32;
            params[2] = launch.first_position as u32;
            params[3] = input.rel_offset as u32;
            params[5] = launch.splits as u32;
            params[6] = launch.chunk as u32;
            let mut binds = Vec::with_capacity(3);
            if partial {
                // Partial (o, split) lives at o * splits + split.
                params[4] = (launch.first_output * plan.splits + launch.first_split) as u32;
                for d in 0..ro {
                    params[slots.out_outer + d] = partial_outer[d] as i32 as u32;
                }
                binds.push(Bind::Scratch { scratch: 0 });
            } else {
                let out = launch.out.ok_or_else(windowed)?;
                params[4] = out.rel_offset as u32;
                for d in 0..ro {
                    params[slots.out_outer + d] = plan.out_outer[d] as i32 as u32;
                }
                binds.push(Bind::Operand {
                    operand: 0,
                    window: out,
                });
            }
            binds.push(Bind::Operand {
                operand: 1,
                window: input,
            });
            if partial && arg {
                binds.push(Bind::Scratch { scratch: 1 });
            }
            if let Some(m) = &sig.map {
                // Further inputs, bound whole: alike ones at the element's offset from the
                // input's, per-output ones at the output's position (from the piece's start),
                // per-position ones at the element's position from their own offset.
                let first = (input.byte_offset / ops.input.dtype.itemsize() as u64) as i64;
                let start: i64 = (0..ro)
                    .map(|d| launch.piece.start[d] as i64 * plan.out_outer[d] as i64)
                    .sum();
                for (k, o) in ops.more.iter().enumerate() {
                    let own = o.layout.offset() as i64;
                    let base = if m.per_output[k + 1] {
                        own + start
                    } else if m.per_position[k + 1] {
                        own
                    } else {
                        own - ops.input.layout.offset() as i64 + first
                    };
                    params[slots.map_base + k] = base as i32 as u32;
                    // The tensor's bytes, rounded up to a binding's 16 (within its buffer,
                    // a pool size class, which may be larger).
                    let bytes = (o.buffer.len_bytes().max(1) as u64).next_multiple_of(16);
                    binds.push(Bind::Operand {
                        operand: 2 + k,
                        window: Window::whole(bytes.min(operand_info(o)?.bytes)),
                    });
                }
                if !ops.more.is_empty() {
                    for d in 0..ro {
                        params[slots.map_outer + d] = plan.out_outer[d] as i32 as u32;
                    }
                }
                for (k, s) in args.scalars.iter().enumerate() {
                    let [lo, hi] = crate::launch::scalar_words(*s);
                    params[slots.scalars + 2 * k] = lo;
                    params[slots.scalars + 2 * k + 1] = hi;
                }
            }
            for d in 0..ro {
                params[slots.outer_shape + d] = launch.piece.len[d] as u32;
                params[slots.in_outer + d] = plan.in_outer[d] as i32 as u32;
            }
            for d in 0..rr {
                params[slots.reduced_shape + d] = launch.piece.len[ro + d] as u32;
                params[slots.in_reduced + d] = plan.in_reduced[d] as i32 as u32;
            }
            steps.push(Step::Dispatch(Dispatch {
                sig: Sig::Reduce(sig.clone()),
                params,
                binds,
                threads: plan.work(launch),
            }));
        }
        if !partial {
            return Ok(steps);
        }
        // Combine: reduce the [outputs, splits] partials into the output.
        let sig = reduce::ReduceSig {
            input: acc,
            out: ops.out.dtype,
            reduced_rank: 1,
            group: plan.combine_group,
            combine: true,
            partial: false,
            map: None,
            vector: 1,
            ..sig
        };
        let slots = reduce::slots(ro, 1, None);
        let mut params = vec![0u32; slots.len];
        params[0] = plan.outputs as u32;
        params[1] = plan.splits as u32;
        params[5] = 1;
        params[6] = plan.splits as u32;
        let out = plan.combine_out.ok_or_else(windowed)?;
        params[4] = out.rel_offset as u32;
        for d in 0..ro {
            params[slots.outer_shape + d] = plan.outer_shape[d] as u32;
            params[slots.in_outer + d] = partial_outer[d] as i32 as u32;
            params[slots.out_outer + d] = plan.out_outer[d] as i32 as u32;
        }
        params[slots.reduced_shape] = plan.splits as u32;
        params[slots.in_reduced] = 1;
        let mut binds = vec![
            Bind::Operand {
                operand: 0,
                window: out,
            },
            Bind::Scratch { scratch: 0 },
        ];
        if arg {
            binds.push(Bind::Scratch { scratch: 1 });
        }
        steps.push(Step::Dispatch(Dispatch {
            sig: Sig::Reduce(sig),
            params,
            binds,
            threads: plan.outputs * plan.combine_group,
        }));
        Ok(steps)
    }
}

/// 4 where the plan reads the input in vectors of four 32-bit elements, rows of several reduced
/// axes hold whole vectors, and every input of a fused map laid out like the input is a 32-bit
/// dtype starting on a whole vector too (so one `vec4<u32>` word holds each vector's elements
/// of each); else 1.
fn vector_width(plan: &ReducePlan, ops: &ReduceOperands, map: Option<&ReduceMap>) -> usize {
    let words = |d: DType| d.itemsize() == 4;
    // Rows of several reduced axes are whole vectors (the kernel counts vectors across rows).
    let inner = plan.reduced_shape.last().copied().unwrap_or(1);
    let rows_of_vectors = plan.reduced_shape.len() == 1 || inner.is_multiple_of(4);
    let on_vectors = plan.vector == 4
        && rows_of_vectors
        && words(ops.input.dtype)
        && plan.launches.iter().all(|l| {
            l.input
                .is_some_and(|w| w.rel_offset.is_multiple_of(4) && w.byte_offset.is_multiple_of(16))
        });
    let alike_on_vectors = map.is_none_or(|m| {
        ops.more.iter().enumerate().all(|(k, o)| {
            m.per_output[k + 1]
                || m.per_position[k + 1]
                || (words(o.dtype) && o.layout.offset().is_multiple_of(4))
        })
    });
    if on_vectors && alike_on_vectors {
        4
    } else {
        1
    }
}
