//! A reduction with a row prologue (and epilogue) as one dispatch where its rows fit the
//! registers of a workgroup ([`render::staged`](crate::render::staged)): every operand bound
//! whole, a workgroup a row. Anything else runs as core's launches
//! ([`split`](strata_core::lower::prologue::split)): two reductions and, for an epilogue, a
//! map.

use super::{rows_on_vectors, Bind, Dispatch, Sig, Step};
use crate::launch::{operand_info, scalar_words};
use crate::render::staged::{self, StagedEpilogue, StagedPrologue, StagedSig, GROUP, MAX_ROW};
use crate::WgpuBackend;
use strata_core::backend::{KernelArgs, Operand};
use strata_core::ir::{Kernel, ReduceOp};
use strata_core::lower::operands::{ReduceMap, ReduceOperands};
use strata_core::lower::pieces::Window;
use strata_core::{Backend, DType, Result};

/// Workgroups per dispatch at most; each walks rows until all are done.
const MAX_GROUPS: usize = 1 << 16;

impl WgpuBackend {
    /// The one dispatch of `kernel` (a `Reduce` with a row prologue) over `args`, or `None`
    /// when it does not stage: a reduction returning a position, a prologue not over input 0,
    /// rows longer than [`MAX_ROW`] or of integers, an epilogue written in another layout than
    /// the rows, an operand larger than a binding (or of 2^31 elements), or an input sharing
    /// an output's buffer.
    pub(crate) fn staged_steps(
        &self,
        kernel: &Kernel,
        args: &KernelArgs,
    ) -> Result<Option<Vec<Step<'static>>>> {
        let Kernel::Reduce {
            op,
            reduced_axes: 1,
            acc,
            map: Some(map),
            prologue: Some(prologue),
            epilogue,
            stores_map: false,
        } = kernel
        else {
            return Ok(None);
        };
        let (out, pout, eout) = match (args.outputs.as_slice(), epilogue) {
            ([out, p], None) => (out, p, None),
            ([out, p, e], Some(_)) => (out, p, Some(e)),
            _ => return Ok(None),
        };
        let main = KernelArgs {
            outputs: vec![out.clone()],
            inputs: args.inputs.clone(),
            scalars: args.scalars.clone(),
        };
        let ops = ReduceOperands::of(1, &main)?;
        let x = ops.input;
        let rm = ReduceMap::of(map, &ops, &main);
        let n = ops.extent;
        let fits = !op.returns_index()
            && prologue.source == 0
            && (prologue.op.is_order_free() || prologue.op == ReduceOp::Sum)
            && x.dtype.is_float()
            && (1..=MAX_ROW).contains(&n)
            && ops.outputs > 0
            && pout.dtype == x.dtype
            && pout.layout.shape() == out.layout.shape()
            && pout.layout.strides() == out.layout.strides()
            && rm.per_output.get(prologue.result) == Some(&true);
        if !fits {
            return Ok(None);
        }
        if let (Some(e), Some(o)) = (epilogue, eout) {
            let rows_like = o.layout.shape() == x.layout.shape()
                && o.layout.strides() == x.layout.strides()
                && e.result != prologue.result
                && rm.per_output.get(e.result) == Some(&true);
            if !rows_like {
                return Ok(None);
            }
        }
        self.check_dtype(*acc)?;
        let cached = n.div_ceil(GROUP).next_power_of_two();
        // 16-byte vectors where the f32 rows (and the epilogue's f32 output, laid out like
        // them) are contiguous and every row starts on one.
        let on_vectors = |o: &Operand| {
            o.dtype == DType::F32 && rows_on_vectors(o.layout.offset(), o.layout.strides())
        };
        let vector =
            cached >= 4 && n.is_multiple_of(4) && on_vectors(x) && eout.is_none_or(on_vectors);
        let sig = StagedSig {
            op: *op,
            acc: *acc,
            out: out.dtype,
            outer_rank: x.layout.ndim() - 1,
            map: rm,
            prologue: StagedPrologue {
                op: prologue.op,
                result: prologue.result,
            },
            epilogue: epilogue.as_ref().zip(eout).map(|(e, o)| StagedEpilogue {
                expr: e.expr.clone(),
                result: e.result,
                out: o.dtype,
            }),
            cached,
            vector,
            full: n == GROUP * cached,
        };
        // Operands by number (outputs first, then inputs), each bound whole.
        let outputs = args.outputs.len();
        let mut bound = vec![0, outputs, 1];
        if eout.is_some() {
            bound.push(2);
        }
        let further = staged::bound_inputs(&sig);
        bound.extend(further.iter().map(|&k| outputs + k));
        // Inputs are read while the outputs are written: no buffer may be both.
        let shares = |a: &Operand, b: &Operand| std::sync::Arc::ptr_eq(&a.buffer, &b.buffer);
        let aliased = std::iter::once(0)
            .chain(further.iter().copied())
            .any(|k| args.outputs.iter().any(|o| shares(&args.inputs[k], o)));
        if aliased {
            return Ok(None);
        }
        let mut binds = Vec::with_capacity(bound.len());
        for &k in &bound {
            let o = super::operand(args, k)?;
            let bytes = (o.buffer.len_bytes().max(1) as u64)
                .next_multiple_of(16)
                .min(operand_info(o)?.bytes);
            // (The kernel's element offsets are `i32`.)
            if bytes > self.binding_limit() || bytes / o.dtype.itemsize() as u64 > i32::MAX as u64 {
                return Ok(None);
            }
            binds.push(Bind::Operand {
                operand: k,
                window: Window::whole(bytes),
            });
        }
        let w = staged::slots(&sig);
        let ro = sig.outer_rank;
        let mut params = vec![0u32; w.len];
        params[0] = ops.outputs as u32;
        params[1] = n as u32;
        params[2] = x.layout.offset() as u32;
        params[3] = x.layout.strides()[ro] as i32 as u32;
        params[4] = out.layout.offset() as u32;
        params[5] = pout.layout.offset() as u32;
        params[6] = eout.map_or(0, |o| o.layout.offset() as u32);
        for dim in 0..ro {
            params[w.outer_shape + dim] = x.layout.shape()[dim] as u32;
            params[w.in_outer + dim] = x.layout.strides()[dim] as i32 as u32;
            params[w.out_outer + dim] = out.layout.strides()[dim] as i32 as u32;
        }
        for (k, o) in args.inputs.iter().enumerate().skip(1) {
            params[w.bases + k - 1] = o.layout.offset() as u32;
        }
        for (k, s) in args.scalars.iter().enumerate() {
            let [lo, hi] = scalar_words(*s);
            params[w.scalars + 2 * k] = lo;
            params[w.scalars + 2 * k + 1] = hi;
        }
        Ok(Some(vec![Step::Dispatch(Dispatch {
            sig: Sig::Staged(sig),
            params,
            binds,
            threads: ops.outputs.min(MAX_GROUPS) * GROUP,
        })]))
    }
}
