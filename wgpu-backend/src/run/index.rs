//! Gather and scatter: pieces along the axes other than the indexed one (the operand read or
//! written wherever an index points binds its whole run along that axis).

use super::{access, Bind, Dispatch, Sig, Step};
use crate::render::index;
use crate::WgpuBackend;
use strata_core::backend::KernelArgs;
use strata_core::backend::Operand;
use strata_core::ir::IndexKind;
use strata_core::lower::index_plan::{self, IndexRows};
use strata_core::lower::operands::IndexOperands;
use strata_core::lower::pieces::{split_by, window, Piece, Window};
use strata_core::Backend;
use strata_core::Layout;
use strata_core::{DType, Error, Result};

impl WgpuBackend {
    /// The dispatches of `Index { kind, axis }` over `args` (operands: the output, its range
    /// flag for a gather, then the source and the index).
    pub(crate) fn index_steps(
        &self,
        kind: IndexKind,
        axis: usize,
        args: &KernelArgs,
    ) -> Result<Vec<Step<'static>>> {
        let checked = IndexOperands::of(kind, axis, args)?;
        let (out, index, src) = (checked.out, checked.index, checked.src);
        let scatter = kind.writes_through_index();
        self.check_dtype(DType::I64)?;
        let iter = checked.space().to_vec();
        let rank = iter.len();
        if axis >= rank || iter.iter().product::<usize>() == 0 {
            return Ok(Vec::new());
        }
        let mut shape = iter.clone();
        if scatter {
            shape[axis] = 1;
        }
        let align = self.target.offset_align;
        // Bindings 0, 1, 2: the output, the index, the source.
        let operands = [out, index, src];
        let [ao, ai, as_] = operands.map(|op| access(op, op.layout.strides().to_vec()));
        let accesses = [ao?, ai?, as_?];
        // Their numbers among the kernel's operands: outputs first (the flag after the
        // output), then `[src, index]`.
        let first_input = args.outputs.len();
        let numbers = [0, first_input + 1, first_input];
        let axis_len = operands.map(|o| o.layout.shape()[axis]);
        let windows = |p: &Piece| {
            let reach = if scatter {
                [
                    p.whole_along(axis, axis_len[0]),
                    p.whole_along(axis, axis_len[1]),
                    p.whole_along(axis, axis_len[1]),
                ]
            } else {
                [p.clone(), p.clone(), p.whole_along(axis, axis_len[2])]
            };
            [0, 1, 2].map(|k| window(&accesses[k], &reach[k], align))
        };
        let limit = self.binding_limit();
        let pieces = split_by(&shape, Some(axis), limit, |p| {
            windows(p).iter().map(|w| w.byte_size).max().unwrap_or(0)
        })
        .map_err(|_| {
            Error::Unsupported(format!(
                "wgpu: a {} along axis {axis} spans more than the adapter's {limit}-byte \
                 storage binding (its elements along that axis lie too far apart to bind at \
                 once); use the CPU or CUDA backend",
                if scatter { "scatter" } else { "gather" }
            ))
        })?;
        let sig = index::IndexSig {
            dtype: out.dtype,
            rank,
            axis,
            kind,
            flagged: checked.flag.is_some(),
            rows: false,
        };
        let flag = match checked.flag {
            Some(f) => Some(access(f, f.layout.strides().to_vec())?),
            None => None,
        };
        let mut steps = Vec::with_capacity(pieces.len());
        let (sw, st, len) = index::slots(rank);
        for piece in &pieces {
            let wins = windows(piece);
            let rows = if scatter || out.dtype.itemsize() > 4 {
                None
            } else {
                row_plan(args, &checked, piece, &wins, axis)?
            };
            let mut binds = numbers
                .into_iter()
                .zip(wins)
                .map(|(operand, window)| Bind::Operand { operand, window })
                .collect::<Vec<_>>();
            if let Some(a) = &flag {
                // The flag's one word, at its offset (a fresh tensor: offset 0).
                let one = Piece::whole(&[1]);
                binds.push(Bind::Operand {
                    operand: 1,
                    window: window(a, &one, align),
                });
            }
            if let Some(r) = rows {
                let (count, per_run, strides, words) = index::row_slots();
                let mut params = vec![0u32; words];
                params[0] = (r.outer * r.count * r.inner / 4) as u32;
                params[1] = src.layout.shape()[axis] as u32;
                for (k, w) in wins.iter().enumerate() {
                    params[2 + k] = w.rel_offset as u32;
                }
                params[count] = r.count as u32;
                params[per_run] = (r.inner / 4) as u32;
                for (at, st) in
                    strides
                        .into_iter()
                        .zip([r.src_strides, r.index_strides, r.out_strides])
                {
                    params[at] = st[0] as i32 as u32;
                    params[at + 1] = st[1] as i32 as u32;
                }
                steps.push(Step::Dispatch(Dispatch {
                    threads: params[0] as usize,
                    sig: Sig::Index(index::IndexSig {
                        rank: 0,
                        axis: 0,
                        rows: true,
                        ..sig.clone()
                    }),
                    params,
                    binds,
                }));
                continue;
            }
            let mut params = vec![0u32; len];
            params[0] = piece.numel() as u32;
            params[1] = if sig.flagged {
                src.layout.shape()[axis] as u32
            } else {
                iter[axis] as u32
            };
            for (k, w) in wins.iter().enumerate() {
                params[2 + k] = w.rel_offset as u32;
            }
            for d in 0..rank {
                params[sw + d] = piece.len[d] as u32;
                for (k, o) in operands.iter().enumerate() {
                    params[st[k] + d] = o.layout.strides()[d] as i32 as u32;
                }
            }
            steps.push(Step::Dispatch(Dispatch {
                threads: params[0] as usize,
                sig: Sig::Index(sig.clone()),
                params,
                binds,
            }));
        }
        Ok(steps)
    }
}

/// The row plan of one piece of a gather ([`index_plan::rows`]) over its windows, when it moves
/// runs in vectors of four elements (WGSL's word groups); `None`: the element path.
fn row_plan(
    args: &KernelArgs,
    checked: &IndexOperands,
    piece: &Piece,
    wins: &[Window; 3],
    axis: usize,
) -> Result<Option<IndexRows>> {
    // The piece's operands as views of their windows: alignment counts from a binding's start.
    let view = |op: &Operand, len: &[usize], w: &Window| -> Result<Operand> {
        Ok(Operand {
            buffer: op.buffer.clone(),
            layout: Layout::new(len.to_vec(), op.layout.strides().to_vec(), w.rel_offset)?,
            dtype: op.dtype,
        })
    };
    let (out, index, src) = (checked.out, checked.index, checked.src);
    let src_len = piece.whole_along(axis, src.layout.shape()[axis]).len;
    let piece_args = KernelArgs {
        outputs: std::iter::once(view(out, &piece.len, &wins[0]))
            .chain(args.outputs[1..].iter().cloned().map(Ok))
            .collect::<Result<_>>()?,
        inputs: vec![
            view(src, &src_len, &wins[2])?,
            view(index, &piece.len, &wins[1])?,
        ],
        scalars: vec![],
    };
    let ops = IndexOperands::of(IndexKind::Gather, axis, &piece_args)?;
    let itemsize = out.dtype.itemsize() as u64;
    let addresses = [
        wins[2].rel_offset as u64 * itemsize,
        wins[0].rel_offset as u64 * itemsize,
    ];
    Ok(index_plan::rows(&ops, addresses, 4 * itemsize as usize).filter(|r| r.vector == 4))
}
