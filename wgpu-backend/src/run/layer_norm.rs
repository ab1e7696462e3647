//! A layer norm's dispatches, forward and backward: a workgroup per part of core's plan
//! ([`layer_norm_plan`]), every operand bound whole (core sends the kernels only where each
//! fits a binding).

use super::{access, Bind, Dispatch, Sig, Step};
use crate::render::layer_norm::{
    LayerNormForwardSig, LayerNormSig, FORWARD_PARAMS, LONGEST_ROW, PARAMS,
};
use crate::WgpuBackend;
use strata_core::backend::KernelArgs;
use strata_core::lower::layer_norm_plan::{self, LayerNormForwardOperands, LayerNormOperands};
use strata_core::lower::pieces::{window, Piece};
use strata_core::{DType, Error, Result};

impl WgpuBackend {
    /// The dispatch of `LayerNormBackward { weight, columns }` over `args`.
    pub(crate) fn layer_norm_steps(
        &self,
        weight: bool,
        columns: bool,
        args: &KernelArgs,
    ) -> Result<Vec<Step<'static>>> {
        let ops = LayerNormOperands::of(args, weight, columns)?;
        if ops.rows == 0 || ops.n == 0 {
            return Ok(Vec::new());
        }
        kept_rows(ops.dtype, ops.n)?;
        let parts = match ops.columns {
            Some([sums, _]) => sums.layout.shape()[0],
            None => layer_norm_plan::parts(ops.rows, ops.n, &self.target),
        };
        let (binds, firsts) = self.whole_bindings(args)?;
        // dx, the two sums (where bound), x, g, mean, rstd, γ (where bound).
        let outputs = args.outputs.len();
        let mut params = vec![ops.rows as u32, ops.n as u32, parts as u32, firsts[0]];
        params.extend(match columns {
            true => [firsts[1], firsts[2]],
            false => [0, 0],
        });
        params.extend(&firsts[outputs..]);
        params.resize(PARAMS, 0);
        Ok(vec![Step::Dispatch(Dispatch {
            sig: Sig::LayerNorm(LayerNormSig {
                weight,
                columns,
                per_invocation: ops.n.div_ceil(256),
            }),
            params,
            binds,
            threads: parts * 256,
        })])
    }
}

impl WgpuBackend {
    /// The dispatch of `LayerNorm { weight, bias }` over `args`.
    pub(crate) fn layer_norm_forward_steps(
        &self,
        weight: bool,
        bias: bool,
        args: &KernelArgs,
    ) -> Result<Vec<Step<'static>>> {
        let ops = LayerNormForwardOperands::of(args, weight, bias)?;
        if ops.rows == 0 || ops.n == 0 {
            return Ok(Vec::new());
        }
        kept_rows(ops.dtype, ops.n)?;
        let parts = layer_norm_plan::parts(ops.rows, ops.n, &self.target);
        let (binds, firsts) = self.whole_bindings(args)?;
        // y, mean, rstd, x, then γ and β where bound.
        let mut params = vec![
            ops.rows as u32,
            ops.n as u32,
            parts as u32,
            args.scalars[0].bits() as u32,
        ];
        params.extend(&firsts[..4]);
        let mut rest = firsts[4..].iter().copied();
        for on in [weight, bias] {
            params.push(if on { rest.next().unwrap_or(0) } else { 0 });
        }
        debug_assert_eq!(params.len(), FORWARD_PARAMS);
        Ok(vec![Step::Dispatch(Dispatch {
            sig: Sig::LayerNormForward(LayerNormForwardSig {
                weight,
                bias,
                per_invocation: ops.n.div_ceil(256),
            }),
            params,
            binds,
            threads: parts * 256,
        })])
    }

    /// Every operand of `args` (outputs, then inputs) bound whole, with its first element in
    /// its binding; an error where one does not fit a binding.
    pub(super) fn whole_bindings(&self, args: &KernelArgs) -> Result<(Vec<Bind>, Vec<u32>)> {
        let mut binds = Vec::new();
        let mut firsts = Vec::new();
        for (k, op) in args.outputs.iter().chain(&args.inputs).enumerate() {
            let shape = op.layout.shape();
            let win = window(
                &access(op, op.layout.strides().to_vec())?,
                &Piece::whole(shape),
                self.target.offset_align,
            );
            if win.byte_size > self.binding_limit() {
                return Err(Error::Backend(format!(
                    "an operand of shape {shape:?} does not fit the adapter's {}-byte storage \
                     binding",
                    self.binding_limit()
                )));
            }
            binds.push(Bind::Operand {
                operand: k,
                window: win,
            });
            firsts.push(win.rel_offset as u32);
        }
        Ok((binds, firsts))
    }
}

/// Checks that rows of `n` elements of `dtype` fit the kernels (f32, at most [`LONGEST_ROW`]
/// an invocation's elements of a workgroup can keep): core sends no others.
fn kept_rows(dtype: DType, n: usize) -> Result<()> {
    if dtype != DType::F32 || n > LONGEST_ROW {
        return Err(Error::Backend(format!(
            "wgpu's layer norm kernels take f32 rows of up to {LONGEST_ROW} elements: got {dtype} \
             rows of {n}"
        )));
    }
    Ok(())
}
