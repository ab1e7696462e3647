//! A matmul: pieces of whole batches, then rows of A and C, until every operand's window fits
//! one storage binding (a right-hand matrix must fit whole).

use super::{access, Bind, Dispatch, Sig, Step};
use crate::launch::scalar_words;
use crate::render::matmul::{self, Staged};
use crate::WgpuBackend;
use strata_core::backend::KernelArgs;
use strata_core::lower::operands::MatmulOperands;
use strata_core::lower::pieces::{window, Piece};
use strata_core::Backend;
use strata_core::{DType, Error, Result};

impl WgpuBackend {
    /// The dispatches of `Matmul { acc }` over `args` (operands: C, then A and B).
    pub(crate) fn matmul_steps(&self, acc: DType, args: &KernelArgs) -> Result<Vec<Step<'static>>> {
        let ops = MatmulOperands::of(args)?;
        self.check_dtype(acc)?;
        let (batch, m, k, n) = ops.dims;
        if batch == 0 || m == 0 || n == 0 {
            return Ok(Vec::new());
        }
        let (limit, align) = (self.binding_limit(), self.target.offset_align);
        let [aa, ba, ca] = [ops.a, ops.b, ops.c].map(|o| access(o, o.layout.strides().to_vec()));
        let [aa, ba, ca] = [aa?, ba?, ca?];
        let sig = matmul::MatmulSig {
            dtype: ops.c.dtype,
            acc,
            coop: self.gpu.caps.coop_f16 && ops.c.dtype == DType::F16 && acc == DType::F32,
            staged: [Staged::Elements; 2],
        };
        let mut steps = Vec::new();
        let [a0, a1] = scalar_words(ops.alpha);
        let [b0, b1] = scalar_words(ops.beta);
        // Pieces (batch start, batch count, row start, row count): halve the batch, then the
        // rows of A and C, until every operand's window fits one storage binding.
        let mut todo = vec![(0, batch, 0, m)];
        while let Some((bs, bl, rs, rl)) = todo.pop() {
            let piece = |start: [usize; 3], len: [usize; 3]| Piece {
                start: start.iter().copied().collect(),
                len: len.iter().copied().collect(),
            };
            let wins = [
                window(&ca, &piece([bs, rs, 0], [bl, rl, n]), align),
                window(&aa, &piece([bs, rs, 0], [bl, rl, k]), align),
                window(&ba, &piece([bs, 0, 0], [bl, k, n]), align),
            ];
            if wins.iter().any(|w| w.byte_size > limit) {
                if bl > 1 {
                    todo.push((bs + bl / 2, bl - bl / 2, rs, rl));
                    todo.push((bs, bl / 2, rs, rl));
                } else if rl > 1 {
                    todo.push((bs, bl, rs + rl / 2, rl - rl / 2));
                    todo.push((bs, bl, rs, rl / 2));
                } else {
                    return Err(Error::Unsupported(format!(
                        "wgpu: one {k}×{n} matrix of the right operand exceeds the adapter's \
                         {limit}-byte storage binding; use the CPU or CUDA backend"
                    )));
                }
                continue;
            }
            let mut params = vec![0u32; matmul::PARAM_WORDS];
            params[..4].copy_from_slice(&[bl as u32, rl as u32, k as u32, n as u32]);
            params[4] = wins[1].rel_offset as u32;
            params[5] = wins[2].rel_offset as u32;
            params[6] = wins[0].rel_offset as u32;
            for (i, o) in [ops.a, ops.b, ops.c].iter().enumerate() {
                for (j, &s) in o.layout.strides().iter().enumerate() {
                    params[7 + 3 * i + j] = s as i32 as u32;
                }
            }
            params[16..20].copy_from_slice(&[a0, a1, b0, b1]);
            let binds = [0, 1, 2]
                .into_iter()
                .zip(wins)
                .map(|(operand, window)| Bind::Operand { operand, window })
                .collect::<Vec<_>>();
            // An operand is staged by 16-byte loads along an axis (1: rows, 2: columns) of unit
            // stride where everything else keeps each run (8 halves, 4 floats) aligned and
            // wholly inside or outside the matrix (`len` elements along that axis).
            let runs = |strides: &[isize], axis: usize, rel: usize, len: usize, run: usize| {
                let step = |s: isize| s % run as isize == 0;
                strides[axis] == 1
                    && step(strides[3 - axis])
                    && (bl == 1 || step(strides[0]))
                    && rel.is_multiple_of(run)
                    && len.is_multiple_of(run)
            };
            let (sa, sb) = (ops.a.layout.strides(), ops.b.layout.strides());
            let (ra, rb) = (wins[1].rel_offset, wins[2].rel_offset);
            let staged = if sig.coop {
                let both = self.coop_vectors && runs(sa, 2, ra, k, 8) && runs(sb, 2, rb, n, 8);
                if both {
                    [Staged::AlongDepth, Staged::AlongTile]
                } else {
                    [Staged::Elements; 2]
                }
            } else if sig.dtype == DType::F32 && acc == DType::F32 {
                let pick = |depth: bool, tile: bool| match (depth, tile) {
                    (true, _) => Staged::AlongDepth,
                    (_, true) => Staged::AlongTile,
                    _ => Staged::Elements,
                };
                [
                    pick(runs(sa, 2, ra, k, 4), runs(sa, 1, ra, rl, 4)),
                    pick(runs(sb, 1, rb, k, 4), runs(sb, 2, rb, n, 4)),
                ]
            } else {
                [Staged::Elements; 2]
            };
            let sig = matmul::MatmulSig {
                staged,
                ..sig.clone()
            };
            let tile = if sig.coop {
                crate::render::coop_matmul::TILE
            } else {
                matmul::TILE
            };
            let tiles = bl * rl.div_ceil(tile) * n.div_ceil(tile);
            steps.push(Step::Dispatch(Dispatch {
                sig: Sig::Matmul(sig),
                params,
                binds,
                threads: tiles * 256,
            }));
        }
        Ok(steps)
    }
}
