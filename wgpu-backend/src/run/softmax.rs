//! A softmax's dispatches: core's row plan ([`softmax_plan`]) with the wgpu target's groups
//! (one invocation or one workgroup a row), its rows in pieces whose windows fit a storage
//! binding (a row is never split), one dispatch each.

use super::{access, rows_on_vectors, Bind, Dispatch, Sig, Step};
use crate::render::softmax::{slots, SoftmaxSig, MAX_CACHED};
use crate::WgpuBackend;
use strata_core::backend::KernelArgs;
use strata_core::lower::pieces::{split_by, window};
use strata_core::lower::softmax_plan::{self, SoftmaxOperands};
use strata_core::{DType, Result};

/// Workgroups per dispatch at most; each walks rows until the piece's are done.
const MAX_GROUPS: usize = 1 << 16;

impl WgpuBackend {
    /// The dispatches of `Softmax { log }` over `args`.
    pub(crate) fn softmax_steps(&self, log: bool, args: &KernelArgs) -> Result<Vec<Step<'static>>> {
        let ops = SoftmaxOperands::of(args)?;
        if ops.rows == 0 || ops.n == 0 {
            return Ok(Vec::new());
        }
        // The plan's groups are for rows read element by element: this kernel takes its
        // vectors itself (below), where the windows' offsets are known. (Windows start at
        // aligned offsets: addresses 0.)
        let p = softmax_plan::plan(&ops, [0, 0], &self.element_target);
        let ro = p.outer_shape.len();
        let mut shape = p.outer_shape.to_vec();
        shape.push(p.n);
        let strides = |outer: &[isize], along: isize| {
            let mut s = outer.to_vec();
            s.push(along);
            s
        };
        let input = access(ops.input, strides(&p.in_outer, p.in_stride))?;
        let out = access(ops.out, strides(&p.out_outer, p.out_stride))?;
        let align = self.target.offset_align;
        let pieces = split_by(&shape, Some(ro), self.binding_limit(), |piece| {
            window(&input, piece, align)
                .byte_size
                .max(window(&out, piece, align).byte_size)
        })?;
        let share = p.n.div_ceil(p.group);
        let cached = if share <= MAX_CACHED {
            share.next_power_of_two()
        } else {
            0
        };
        let windows: Vec<_> = pieces
            .iter()
            .map(|piece| (window(&input, piece, align), window(&out, piece, align)))
            .collect();
        // 16-byte vectors where every row of both operands starts on one and is contiguous.
        let vector = ops.out.dtype == DType::F32
            && cached >= 4
            && p.n.is_multiple_of(4)
            && windows.iter().all(|(wi, wo)| {
                rows_on_vectors(wi.rel_offset, &input.strides)
                    && rows_on_vectors(wo.rel_offset, &out.strides)
            });
        let sig = SoftmaxSig {
            dtype: ops.out.dtype,
            log,
            outer_rank: ro,
            group: p.group,
            cached,
            vector,
            full: cached > 0 && p.n == p.group * cached,
        };
        let w = slots(ro);
        let mut steps = Vec::with_capacity(pieces.len());
        for (piece, (wi, wo)) in pieces.iter().zip(windows) {
            let rows = piece.numel() / p.n;
            let mut params = vec![0u32; w.len];
            params[0] = rows as u32;
            params[1] = p.n as u32;
            for (k, &len) in piece.len[..ro].iter().enumerate() {
                params[w.outer_shape + k] = len as u32;
            }
            for (first, rel, outer, along) in [
                (w.input, wi.rel_offset, &p.in_outer, p.in_stride),
                (w.output, wo.rel_offset, &p.out_outer, p.out_stride),
            ] {
                params[first] = rel as u32;
                for (k, &s) in outer.iter().enumerate() {
                    params[first + 1 + k] = s as i32 as u32;
                }
                params[first + 1 + ro] = along as i32 as u32;
            }
            let threads = if p.group == 1 {
                rows
            } else {
                rows.min(MAX_GROUPS) * p.group
            };
            steps.push(Step::Dispatch(Dispatch {
                sig: Sig::Softmax(sig.clone()),
                params,
                binds: vec![
                    Bind::Operand {
                        operand: 0,
                        window: wo,
                    },
                    Bind::Operand {
                        operand: 1,
                        window: wi,
                    },
                ],
                threads,
            }));
        }
        Ok(steps)
    }
}
