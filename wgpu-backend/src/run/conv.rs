//! A convolution pass's dispatches: core's implicit-GEMM plan
//! ([`conv_plan`](strata_core::lower::conv_plan)), one dispatch a piece of the batch (its
//! windows of the per-sample operands fit a binding); backward filter's pieces write partial
//! products into a scratch buffer, and one more dispatch sums them into the output.

use super::{access, Bind, Dispatch, Sig, Step};
use crate::render::conv::{ConvSig, PARAM_WORDS};
use crate::WgpuBackend;
use strata_core::backend::{KernelArgs, Operand};
use strata_core::ir::{ConvGeometry, ConvPass};
use strata_core::lower::conv_plan::{division_magic, ConvDims, ConvPlan};
use strata_core::lower::pieces::{window, Piece, Window};
use strata_core::{Backend, DType, Error, Result};

impl WgpuBackend {
    /// The dispatches of `Convolution { pass, geometry }` over `args` (operands: the output,
    /// then the two inputs; all contiguous, of one float dtype).
    pub(crate) fn conv_steps(
        &self,
        pass: ConvPass,
        geometry: &ConvGeometry,
        args: &KernelArgs,
    ) -> Result<Vec<Step<'static>>> {
        let (Some(out), [a, b]) = (args.outputs.first(), args.inputs.as_slice()) else {
            return Err(Error::Backend(
                "internal error: a convolution takes two inputs and one output".into(),
            ));
        };
        let dtype = out.dtype;
        for op in [out, a, b] {
            if op.dtype != dtype || !op.layout.is_contiguous() {
                return Err(Error::Backend(format!(
                    "internal error: a {} over {} {:?} (contiguous {dtype} operands expected)",
                    pass.name(),
                    op.dtype,
                    op.layout
                )));
            }
        }
        self.check_dtype(dtype)?;
        let acc = if dtype == DType::F64 {
            DType::F64
        } else {
            DType::F32
        };
        let dims = ConvDims::of(pass, a.layout.shape(), b.layout.shape(), out.layout.shape())?;
        let items = dtype.itemsize();
        let plan = ConvPlan::of(
            pass,
            geometry,
            dims,
            &self.target,
            acc.itemsize(),
            [items; 3],
        )?;
        let groups = geometry.groups.max(1);
        let align = self.target.offset_align;
        // Operands in the kernel's order (0 output, 1 A, 2 B) and whether each is indexed
        // by sample (the weight and the partials are bound whole).
        let (operand_a, operand_b) = match pass {
            ConvPass::BackwardFilter => (2, 1),
            _ => (1, 2),
        };
        let ops: [&Operand; 3] = [out, a, b];
        let by_sample = |k: usize| match pass {
            ConvPass::Forward | ConvPass::BackwardData => k != 2,
            ConvPass::BackwardFilter => k != 0,
        };
        let win = |k: usize, first: usize, samples: usize| -> Result<Window> {
            let op = ops[k];
            let shape = op.layout.shape();
            let (start, len) = if by_sample(k) {
                (
                    vec![first, 0, 0, 0],
                    vec![samples, shape[1], shape[2], shape[3]],
                )
            } else {
                (vec![0; 4], shape.to_vec())
            };
            let piece = Piece {
                start: start.into_iter().collect(),
                len: len.into_iter().collect(),
            };
            Ok(window(
                &access(op, op.layout.strides().to_vec())?,
                &piece,
                align,
            ))
        };
        let sig = ConvSig {
            pass,
            dtype,
            acc,
            tile: plan.tile,
            sum_partials: false,
            strided: pass == ConvPass::BackwardData && geometry.stride != [1, 1],
            fast_division: plan.narrow_indices(groups),
        };
        let filter = pass == ConvPass::BackwardFilter;
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
            let mut params = vec![0u32; PARAM_WORDS];
            for (p, w) in params.iter_mut().zip(lw) {
                *p = u32::try_from(w).map_err(|_| {
                    Error::Unsupported(format!(
                        "wgpu: a {} with a size of {w} (over 32 bits)",
                        pass.name()
                    ))
                })?;
            }
            let (wa, wb) = (
                win(operand_a, piece.first, piece.samples)?,
                win(operand_b, piece.first, piece.samples)?,
            );
            let first_bind = if filter {
                Bind::Scratch { scratch: 0 }
            } else {
                let wo = win(0, piece.first, piece.samples)?;
                params[19] = wo.rel_offset as u32;
                Bind::Operand {
                    operand: 0,
                    window: wo,
                }
            };
            params[20] = wa.rel_offset as u32;
            params[21] = wb.rel_offset as u32;
            params[22] = piece.splits as u32;
            params[23] = plan.per_split as u32;
            params[24] = (piece.first / plan.per_split) as u32;
            params[25] = u32::from(piece.accumulate);
            for (k, by) in plan.divisors(phase).into_iter().enumerate() {
                let [m, s] = division_magic(by);
                params[26 + 2 * k] = m;
                params[27 + 2 * k] = s;
            }
            for (k, v) in phase.map_or([0; 14], |p| p.words()).into_iter().enumerate() {
                params[34 + k] = v as i32 as u32;
            }
            let [tm, tn] = plan.tile;
            let tiles = m.div_ceil(tm) * n.div_ceil(tn) * groups * piece.splits;
            steps.push(Step::Dispatch(Dispatch {
                sig: Sig::Conv(sig.clone()),
                params,
                binds: vec![
                    first_bind,
                    Bind::Operand {
                        operand: operand_a,
                        window: wa,
                    },
                    Bind::Operand {
                        operand: operand_b,
                        window: wb,
                    },
                ],
                threads: tiles * 256,
            }));
        }
        if filter {
            let wo = win(0, 0, 0)?;
            let mut params = vec![0u32; 3];
            params[0] = weight as u32;
            params[1] = plan.partials as u32;
            params[2] = wo.rel_offset as u32;
            steps.push(Step::Dispatch(Dispatch {
                sig: Sig::Conv(ConvSig {
                    sum_partials: true,
                    ..sig
                }),
                params,
                binds: vec![
                    Bind::Operand {
                        operand: 0,
                        window: wo,
                    },
                    Bind::Scratch { scratch: 0 },
                ],
                threads: weight,
            }));
        }
        Ok(steps)
    }
}
