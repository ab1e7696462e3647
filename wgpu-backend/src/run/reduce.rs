//! A reduction: core's plan, one dispatch per window, and a combine dispatch when the plan
//! splits the extent into ranges (partials `[outputs, splits]` in the accumulator dtype, and
//! positions for argmin/argmax). A fused map (map→reduce) is evaluated per element inside the
//! reduction, its further inputs bound whole (core fuses only what fits: `Target::binds_reduce`).

use crate::codegen::reduce;
use crate::launch::{buffer_info, raw, Binding};
use crate::WgpuBackend;
use strata_core::ir::{Expr, KernelArgs, ReduceOp};
use strata_core::lower::operands::{ReduceMap, ReduceOperands};
use strata_core::lower::reduce_plan::{self, partial_strides};
use strata_core::{Backend, DType, Result};

impl WgpuBackend {
    pub(crate) fn run_reduce(
        &self,
        op: ReduceOp,
        reduced_axes: usize,
        acc: DType,
        map: Option<&Expr>,
        args: &KernelArgs,
    ) -> Result<()> {
        let ops = ReduceOperands::of(reduced_axes, args)?;
        self.check_dtype(acc)?;
        if ops.outputs == 0 {
            return Ok(());
        }
        let map = map.map(|expr| ReduceMap::of(expr, &ops, args));
        let (in_buf, out_buf) = (raw(ops.input)?, raw(ops.out)?);
        let plan = reduce_plan::plan(&ops, &buffer_info(&[out_buf, in_buf]), &self.target)?;
        let (ro, rr) = (plan.outer_shape.len(), plan.reduced_shape.len());
        let arg = op.returns_index();
        let caps = self.gpu.caps;
        let partial = plan.splits > 1;
        let (values, positions) = if partial {
            let n = plan.outputs * plan.splits;
            let positions = arg.then(|| self.pool.allocate(n * 4)).transpose()?;
            (Some(self.pool.allocate(n * acc.itemsize())?), positions)
        } else {
            (None, None)
        };
        let slots = reduce::slots(ro, rr, map.as_ref());
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
        };
        let pl = self.reductions.get(&sig, |sig| {
            self.gpu
                .pipeline(&reduce::source(sig, caps)?, reduce::bindings(sig))
        })?;
        let partial_outer = partial_strides(&plan.outer_shape, plan.splits);
        for launch in &plan.launches {
            let outputs: usize = launch.piece.len[..ro].iter().product();
            if outputs == 0 {
                continue;
            }
            let input = launch.input.expect("the wgpu target binds windows");
            let mut params = vec![0u32; slots.len];
            params[0] = outputs as u32;
            params[1] = launch.piece.len[ro..].iter().product::<usize>() as u32;
            params[2] = launch.first_position as u32;
            params[3] = input.rel_offset as u32;
            params[5] = launch.splits as u32;
            let mut bindings = Vec::with_capacity(3);
            if let Some(values) = &values {
                // Partial (o, split) lives at o * splits + split.
                params[4] = (launch.first_output * plan.splits + launch.first_split) as u32;
                for d in 0..ro {
                    params[slots.out_outer + d] = partial_outer[d] as i32 as u32;
                }
                bindings.push(Binding::whole(values.raw()));
            } else {
                let out = launch.out.expect("the wgpu target binds windows");
                params[4] = out.rel_offset as u32;
                for d in 0..ro {
                    params[slots.out_outer + d] = plan.out_outer[d] as i32 as u32;
                }
                bindings.push(Binding {
                    buffer: out_buf,
                    window: out,
                });
            }
            bindings.push(Binding {
                buffer: in_buf,
                window: input,
            });
            if let Some(positions) = &positions {
                bindings.push(Binding::whole(positions.raw()));
            }
            if let Some(m) = &sig.map {
                // Further inputs, bound whole: alike ones at the element's offset from the
                // input's, per-output ones at the output's position (from the piece's start).
                let first = (input.byte_offset / ops.input.dtype.itemsize() as u64) as i64;
                let start: i64 = (0..ro)
                    .map(|d| launch.piece.start[d] as i64 * plan.out_outer[d] as i64)
                    .sum();
                for (k, o) in ops.more.iter().enumerate() {
                    let own = o.layout.offset() as i64;
                    let base = if m.per_output[k + 1] {
                        own + start
                    } else {
                        own - ops.input.layout.offset() as i64 + first
                    };
                    params[slots.map_base + k] = base as i32 as u32;
                    bindings.push(Binding::tensor(raw(o)?, o.buffer.len_bytes()));
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
            self.gpu
                .dispatch(&pl, &params, &bindings, plan.work(launch))?;
        }
        let Some(values) = values else { return Ok(()) };
        // Combine: reduce the [outputs, splits] partials into the output.
        let sig = reduce::ReduceSig {
            input: acc,
            out: ops.out.dtype,
            reduced_rank: 1,
            group: plan.combine_group,
            combine: true,
            partial: false,
            map: None,
            ..sig
        };
        let slots = reduce::slots(ro, 1, None);
        let mut params = vec![0u32; slots.len];
        params[0] = plan.outputs as u32;
        params[1] = plan.splits as u32;
        params[5] = 1;
        let out = plan.combine_out.expect("the wgpu target binds windows");
        params[4] = out.rel_offset as u32;
        for d in 0..ro {
            params[slots.outer_shape + d] = plan.outer_shape[d] as u32;
            params[slots.in_outer + d] = partial_outer[d] as i32 as u32;
            params[slots.out_outer + d] = plan.out_outer[d] as i32 as u32;
        }
        params[slots.reduced_shape] = plan.splits as u32;
        params[slots.in_reduced] = 1;
        let mut bindings = vec![
            Binding {
                buffer: out_buf,
                window: out,
            },
            Binding::whole(values.raw()),
        ];
        if let Some(positions) = &positions {
            bindings.push(Binding::whole(positions.raw()));
        }
        let pl = self.reductions.get(&sig, |sig| {
            self.gpu
                .pipeline(&reduce::source(sig, caps)?, reduce::bindings(sig))
        })?;
        let threads = plan.outputs * plan.combine_group;
        self.gpu.dispatch(&pl, &params, &bindings, threads)
        // The partial buffers return to the pool here; later work is ordered after the combine.
    }
}
