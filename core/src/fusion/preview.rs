//! What reading a pending tensor would run, planned without running or allocating anything:
//! the kernels of the pending inputs it reads through other views first, then its own fused
//! map, each over operands a backend can plan a launch for (a tensor not computed yet stands
//! as a [`PlannedBuffer`]). `explain` shows it.

use super::splice::{address, Fused};
use crate::backend::{DeviceBuffer, PlannedBuffer};
use crate::backend::{KernelArgs, Operand};
use crate::dtype::DType;
use crate::error::Result;
use crate::ir::ReduceOp;
use crate::layout::Layout;
use crate::lower::map_plan::iteration_order;
use crate::tensor::{PendingWork, RunRecord, Tensor};
use std::panic::Location;
use std::sync::Arc;

/// One kernel a read would run.
pub(crate) enum Preview {
    /// A fused map.
    Map(MapPreview),
    /// A deferred reduction run on its own.
    Reduce {
        op: ReduceOp,
        reduced_axes: usize,
        source: (Layout, DType),
        output: (Layout, DType),
        user_op: &'static str,
        call_site: &'static Location<'static>,
    },
}

/// A fused map a read would run.
pub(crate) struct MapPreview {
    /// What it is made of, as the record of a kernel that ran says it.
    pub(crate) record: RunRecord,
    /// Its operands as the launch passes them (axes in the output's memory order), buffers
    /// not computed yet standing as [`PlannedBuffer`]s: what a backend plans the launch for.
    pub(crate) args: KernelArgs,
}

/// The kernels a read of `t` would run now, in order; empty once it has run.
pub(crate) fn preview(t: &Tensor) -> Result<Vec<Preview>> {
    let mut kernels = Vec::new();
    let mut seen = Vec::new();
    preview_into(t, &mut kernels, &mut seen)?;
    Ok(kernels)
}

fn preview_into(t: &Tensor, kernels: &mut Vec<Preview>, seen: &mut Vec<usize>) -> Result<()> {
    let a = address(&t.storage);
    if seen.contains(&a) {
        return Ok(());
    }
    seen.push(a);
    let guard = t.storage.pending();
    let Some(p) = guard.as_ref() else {
        return Ok(());
    };
    let tree = match &p.work {
        PendingWork::Tree(tree) => tree,
        PendingWork::Reduce(d) => {
            kernels.push(Preview::Reduce {
                op: d.op,
                reduced_axes: d.reduced_axes,
                source: (d.source.layout.clone(), d.source.dtype),
                output: (p.layout.clone(), p.dtype),
                user_op: p.op,
                call_site: p.call_site,
            });
            return Ok(());
        }
    };
    let mut fused = Fused::new(tree, &p.stream, 0);
    let expr = fused.splice(p, false)?;
    let (layout, dtype) = (p.layout.clone(), p.dtype);
    drop(guard);
    // What this kernel reads that is pending runs first, as its own kernels.
    for input in &fused.inputs {
        preview_into(input, kernels, seen)?;
    }
    let operand = |t: &Tensor, layout: Layout| Operand {
        buffer: t.storage.buffer_if_realized().unwrap_or_else(|| {
            Arc::new(PlannedBuffer::new(t.storage.bytes)) as Arc<dyn DeviceBuffer>
        }),
        layout,
        dtype: t.dtype,
    };
    let order = iteration_order(expr.reads_linear_index(), &layout);
    let ordered = |l: &Layout| match &order {
        Some(o) => l.permuted(o),
        None => Ok(l.clone()),
    };
    let out = Operand {
        buffer: Arc::new(PlannedBuffer::new(t.storage.bytes)),
        layout: ordered(&layout)?,
        dtype,
    };
    let record = fused.record(&expr, (layout, dtype));
    let args = KernelArgs {
        outputs: vec![out],
        inputs: fused
            .inputs
            .iter()
            .map(|i| Ok(operand(i, ordered(&i.layout)?)))
            .collect::<Result<_>>()?,
        scalars: fused.scalars,
    };
    kernels.push(Preview::Map(MapPreview { record, args }));
    Ok(())
}
