//! A map: core's plan, one dispatch per piece.

use crate::codegen::{map, prelude};
use crate::launch::{operand_info, raw, Binding};
use crate::WgpuBackend;
use strata_core::backend::KernelSource;
use strata_core::ir::{Expr, KernelArgs, Operand};
use strata_core::lower::map_plan;
use strata_core::lower::operands::MapOperands;
use strata_core::Backend;
use strata_core::Result;

/// A map's operands (outputs first) and core's plan for them.
type PlannedMap<'a> = (MapOperands<'a>, Vec<&'a Operand>, map_plan::MapPlan);

impl WgpuBackend {
    pub(crate) fn plan_map<'a>(
        &self,
        expr: &Expr,
        also: &[Expr],
        args: &'a KernelArgs,
    ) -> Result<PlannedMap<'a>> {
        let ops = MapOperands::of_outputs(expr, also, args)?;
        let operands: Vec<&Operand> = ops.operands().collect();
        let infos = operands
            .iter()
            .map(|o| operand_info(o))
            .collect::<Result<Vec<_>>>()?;
        let plan = map_plan::plan(&ops, expr.reads_linear_index(), &infos, &self.target)?;
        Ok((ops, operands, plan))
    }

    pub(crate) fn run_map(&self, expr: &Expr, also: &[Expr], args: &KernelArgs) -> Result<()> {
        let (ops, operands, plan) = self.plan_map(expr, also, args)?;
        let buffers = operands
            .iter()
            .map(|o| raw(o))
            .collect::<Result<Vec<_>>>()?;
        let dtypes: Vec<_> = operands.iter().map(|o| o.dtype).collect();
        let scalars: Vec<_> = ops.scalars.iter().map(|s| s.dtype()).collect();
        let caps = self.gpu.caps;
        for piece in &plan.pieces {
            let sig = map::MapSig::of(expr, also, piece, dtypes.clone(), scalars.clone());
            let pipeline = self.maps.get(&sig, |sig| {
                // Dtypes inside the tree (an f64 intermediate, say) are checked once, here.
                let mut used = std::collections::BTreeSet::new();
                prelude::dtypes_of(&sig.expr, &mut used);
                for d in used {
                    self.check_dtype(d)?;
                }
                self.gpu.pipeline(&map::source(sig, caps)?, operands.len())
            })?;
            let bindings: Vec<Binding> = buffers
                .iter()
                .zip(&piece.operands)
                .map(|(&buffer, o)| Binding {
                    buffer,
                    window: o.window.expect("the wgpu target binds windows"),
                })
                .collect();
            let params = map::params(&sig, piece, ops.scalars);
            self.gpu
                .dispatch(&pipeline, &params, &bindings, piece.work)?;
        }
        Ok(())
    }

    /// The WGSL of each piece of the map `expr` (and the further outputs `also`; one piece
    /// unless binding windows split it).
    pub(crate) fn map_source_of(
        &self,
        expr: &Expr,
        also: &[Expr],
        args: &KernelArgs,
    ) -> Result<Option<KernelSource>> {
        let (ops, operands, plan) = self.plan_map(expr, also, args)?;
        let Some(first) = plan.pieces.first() else {
            return Ok(None);
        };
        let dtypes: Vec<_> = operands.iter().map(|o| o.dtype).collect();
        let scalars: Vec<_> = ops.scalars.iter().map(|s| s.dtype()).collect();
        let sig = map::MapSig::of(expr, also, first, dtypes, scalars);
        let pieces = plan.pieces.len();
        Ok(Some(KernelSource {
            language: "WGSL".into(),
            launch: format!(
                "{} invocations in workgroups of 256{}",
                first.work,
                if pieces > 1 {
                    format!(", first of {pieces} dispatches (binding windows)")
                } else {
                    String::new()
                }
            ),
            source: map::source(&sig, self.gpu.caps)?,
        }))
    }
}
