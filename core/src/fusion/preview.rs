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
use crate::tensor::{Pending, PendingWork, RunRecord, Tensor};
use std::panic::Location;
use std::sync::Arc;

/// One kernel a read would run.
pub(crate) enum Preview {
    /// A fused map.
    Map(MapPreview),
    /// A deferred reduction: run on its own, or with the tree being read as its epilogue.
    Reduce {
        op: ReduceOp,
        reduced_axes: usize,
        source: (Layout, DType),
        output: (Layout, DType),
        user_op: &'static str,
        call_site: &'static Location<'static>,
        /// It reduces a fused map of a pending tree (taking in the deferred maxima or minima
        /// that tree reads as its prologue).
        map: bool,
        /// The tree being read, run last in its kernel (a row epilogue).
        epilogue: Option<Box<RunRecord>>,
        /// The tree being read, stored by the kernel as it reduces it
        /// (`Kernel::Reduce { stores_map }`).
        stores: Option<Box<RunRecord>>,
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
        PendingWork::Reduce(_) => {
            kernels.push(reduce_preview(p, seen, None, None)?);
            return Ok(());
        }
    };
    let mut fused = Fused::new(tree, &p.stream, 0);
    let expr = fused.splice(p, false)?;
    let (layout, dtype) = (p.layout.clone(), p.dtype);
    drop(guard);
    // A deferred reduction of a tree among the leaves that would take this tree as its
    // epilogue: one kernel, after what its other leaves need.
    if t.device().backend().target().fuses_row_epilogue {
        let work_out = t.with_layout(layout.clone());
        for k in 0..fused.inputs.len() {
            let leaf = fused.inputs[k].clone();
            let guard = leaf.storage.pending();
            let Some(lp) = guard.as_ref() else {
                continue;
            };
            let of_tree = matches!(&lp.work, PendingWork::Reduce(d) if d.source.is_pending() && super::run::in_order(&d.order));
            if !of_tree || !Arc::ptr_eq(&lp.stream, &p_stream(t)) {
                continue;
            }
            // (The first such reduction is the one a read offers the tree to, as `run` does.)
            if !super::reduce::epilogue_would_fit(&expr, &fused.inputs, k, &work_out, lp)? {
                break;
            }
            seen.push(address(&leaf.storage));
            let record = fused.record(&expr, (layout.clone(), dtype));
            let report = reduce_preview(lp, seen, Some(Box::new(record)), None)?;
            drop(guard);
            for (j, input) in fused.inputs.iter().enumerate() {
                if j != k {
                    preview_into(input, kernels, seen)?;
                }
            }
            kernels.push(report);
            return Ok(());
        }
    }
    // A deferred reduction of this tree that stores it as it reduces it: one kernel.
    if t.device().backend().target().stores_reduce_map {
        let stream = p_stream(t);
        for reader in t.storage.live_readers() {
            let guard = reader.pending();
            let Some(rp) = guard.as_ref() else {
                continue;
            };
            let PendingWork::Reduce(d) = &rp.work else {
                continue;
            };
            let takes = Arc::ptr_eq(&d.source.storage, &t.storage)
                && d.source.layout == layout
                && Arc::ptr_eq(&rp.stream, &stream)
                && fused.inputs.iter().all(|i| !i.is_pending());
            if !takes {
                continue;
            }
            seen.push(address(&reader));
            let record = fused.record(&expr, (layout.clone(), dtype));
            kernels.push(reduce_preview(rp, seen, None, Some(Box::new(record)))?);
            return Ok(());
        }
    }
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

/// The stream `t`'s pending work was issued on (the current one if it has none).
fn p_stream(t: &Tensor) -> Arc<crate::device::StreamHandle> {
    match t.storage.pending().as_ref() {
        Some(p) => p.stream.clone(),
        None => t.device().current_handle(),
    }
}

/// The preview of the deferred reduction `p` (its pending work), with `epilogue` run last
/// in its kernel, or storing the tree it reduces (`stores`). A reduction of a tree takes in the deferred maxima and minima that tree
/// reads (its prologue): they are marked `seen`, not listed on their own.
fn reduce_preview(
    p: &Pending,
    seen: &mut Vec<usize>,
    epilogue: Option<Box<RunRecord>>,
    stores: Option<Box<RunRecord>>,
) -> Result<Preview> {
    let PendingWork::Reduce(d) = &p.work else {
        return Err(crate::error::Error::Invalid(
            "internal error: a deferred reduction was expected".into(),
        ));
    };
    let map = d.source.is_pending();
    if map {
        mark_prologues(&d.source, seen, &mut Vec::new());
    }
    Ok(Preview::Reduce {
        op: d.op,
        reduced_axes: d.reduced_axes,
        source: (d.source.layout.permuted(&d.order)?, d.source.dtype),
        output: (p.layout.clone(), p.dtype),
        user_op: p.op,
        call_site: p.call_site,
        map,
        epilogue,
        stores,
    })
}

/// Marks `seen` the deferred reductions the pending tree `t` reads (through pending trees).
fn mark_prologues(t: &Tensor, seen: &mut Vec<usize>, visited: &mut Vec<usize>) {
    // Each storage once (a tree reading one input twice a step is a chain, not 2^depth paths).
    let at = address(&t.storage);
    if visited.contains(&at) || visited.len() > super::splice::MAX_NODES {
        return;
    }
    visited.push(at);
    let guard = t.storage.pending();
    let Some(p) = guard.as_ref() else {
        return;
    };
    match &p.work {
        PendingWork::Reduce(_) => seen.push(at),
        PendingWork::Tree(tree) => {
            for u in &tree.inputs {
                mark_prologues(u, seen, visited);
            }
        }
    }
}
