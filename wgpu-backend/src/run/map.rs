//! A map: core's plan, one dispatch per piece (pieces under the binding limit).

use super::{Bind, Dispatch, Sig, Step};
use crate::launch::operand_info;
use crate::render::map;
use crate::WgpuBackend;
use strata_core::backend::{KernelArgs, Operand};
use strata_core::ir::Expr;
use strata_core::lower::map_plan;
use strata_core::lower::operands::MapOperands;
use strata_core::Result;

impl WgpuBackend {
    /// The dispatches of the map `expr` (and the further outputs `also`) over `args`.
    pub(crate) fn map_steps<'k>(
        &self,
        expr: &'k Expr,
        also: &'k [Expr],
        args: &KernelArgs,
    ) -> Result<Vec<Step<'k>>> {
        let ops = MapOperands::of_outputs(expr, also, args)?;
        let operands: Vec<&Operand> = ops.operands().collect();
        let infos = operands
            .iter()
            .map(|o| operand_info(o))
            .collect::<Result<Vec<_>>>()?;
        let plan = map_plan::plan(&ops, expr.reads_linear_index(), &infos, &self.target)?;
        let dtypes: Vec<_> = operands.iter().map(|o| o.dtype).collect();
        let scalars: Vec<_> = ops.scalars.iter().map(|s| s.dtype()).collect();
        plan.pieces
            .iter()
            .map(|piece| {
                let sig = map::MapSig::of(expr, also, piece, dtypes.clone(), scalars.clone());
                let binds = piece
                    .operands
                    .iter()
                    .enumerate()
                    .map(|(operand, o)| {
                        let window = o.window.ok_or_else(|| {
                            strata_core::Error::Backend(
                                "internal error: the wgpu target binds windows".into(),
                            )
                        })?;
                        Ok(Bind::Operand { operand, window })
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(Step::Dispatch(Dispatch {
                    params: map::params(&sig, piece, ops.scalars),
                    sig: Sig::Map(sig),
                    binds,
                    threads: piece.work,
                }))
            })
            .collect()
    }
}
