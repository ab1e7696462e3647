//! A histogram's dispatches: the values (and weights) in pieces that fit a storage binding,
//! each piece one dispatch adding into the same output; enough workgroups to fill a large
//! GPU, each walking its share of the piece.

use super::{access, Bind, Dispatch, Sig, Step};
use crate::render::histogram::{HistogramSig, FIRST_SCALAR};
use crate::WgpuBackend;
use strata_core::backend::KernelArgs;
use strata_core::ir::Expr;
use strata_core::lower::histogram_plan::{private_copies, HistogramOperands};
use strata_core::lower::pieces::{split_by, window, Piece};
use strata_core::{DType, Error, Result};

/// Workgroup memory every adapter offers (WebGPU's default limit).
const WORKGROUP_BYTES: usize = 16 << 10;

/// Workgroups per dispatch at most: each adds its copies to the output once.
const MAX_GROUPS: usize = 1024;

impl WgpuBackend {
    /// The dispatches of `Histogram { bins, bin, weighted }` over `args`.
    pub(crate) fn histogram_steps(
        &self,
        bins: usize,
        bin: &Expr,
        weighted: bool,
        args: &KernelArgs,
    ) -> Result<Vec<Step<'static>>> {
        let ops = HistogramOperands::of(args, bins, weighted)?;
        if !matches!(ops.out.dtype, DType::U32 | DType::F32) {
            return Err(Error::Unsupported(format!(
                "wgpu: a histogram of {} needs 64-bit atomics, which WGSL lacks",
                ops.out.dtype
            )));
        }
        if ops.n == 0 || bins == 0 {
            return Ok(Vec::new());
        }
        let align = self.target.offset_align;
        let values = access(ops.values, vec![1])?;
        let weights = ops.weights.map(|w| access(w, vec![1])).transpose()?;
        let windows = |p: &Piece| {
            let w = weights.as_ref().map(|a| window(a, p, align));
            (window(&values, p, align), w)
        };
        let limit = self.binding_limit();
        let pieces = split_by(&[ops.n], None, limit, |p| {
            let (v, w) = windows(p);
            v.byte_size.max(w.map_or(0, |w| w.byte_size))
        })?;
        let out_access = access(ops.out, vec![1])?;
        // Bins past one binding are dispatched in ranges (each reads every value again).
        let ranges = split_by(&[bins], None, limit, |p| {
            window(&out_access, p, align).byte_size
        })?;
        let mut steps = Vec::with_capacity(pieces.len() * ranges.len());
        for range in &ranges {
            let bound = range.len[0];
            let sig = HistogramSig {
                bin: bin.clone(),
                values: ops.values.dtype,
                acc: ops.out.dtype,
                weighted,
                scalars: args.scalars.iter().map(|s| s.dtype()).collect(),
                bins: bound,
                copies: private_copies(bound, 4, WORKGROUP_BYTES, 8),
            };
            let out = window(&out_access, range, align);
            for piece in &pieces {
                let (v, w) = windows(piece);
                let mut params = vec![0u32; FIRST_SCALAR + 2 * args.scalars.len()];
                params[0] = piece.numel() as u32;
                params[1] = v.rel_offset as u32;
                params[2] = w.map_or(0, |w| w.rel_offset as u32);
                params[3] = range.start[0] as u32;
                params[4] = out.rel_offset as u32;
                for (k, s) in args.scalars.iter().enumerate() {
                    let [lo, hi] = crate::launch::scalar_words(*s);
                    params[FIRST_SCALAR + 2 * k] = lo;
                    params[FIRST_SCALAR + 2 * k + 1] = hi;
                }
                let mut binds = vec![
                    Bind::Operand {
                        operand: 0,
                        window: out,
                    },
                    Bind::Operand {
                        operand: 1,
                        window: v,
                    },
                ];
                if let Some(w) = w {
                    binds.push(Bind::Operand {
                        operand: 2,
                        window: w,
                    });
                }
                let groups = piece.numel().div_ceil(256).min(MAX_GROUPS);
                steps.push(Step::Dispatch(Dispatch {
                    sig: Sig::Histogram(sig.clone()),
                    params,
                    binds,
                    threads: groups * 256,
                }));
            }
        }
        Ok(steps)
    }
}
