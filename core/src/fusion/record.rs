//! An elementwise op's result: pending work where the device defers, or a kernel launched now.
//! The op has checked everything an eager launch would check, so an `Err` always comes from
//! the user's line; only the launch waits.

use super::splice::{add_leaf, add_leaves, address, count_nodes, MAX_NODES};
use crate::device::{Device, StreamHandle};
use crate::dtype::Scalar;
use crate::error::{Error, Result};
use crate::ir::{Expr, Kernel};
use crate::layout::Layout;
use crate::tensor::{launch, Leaves, Pending, PendingWork, Storage, Tensor, Tree};
use std::sync::Arc;

/// The elementwise result `expr` over `inputs` (views with `layout`'s shape) and `scalars`:
/// pending work where `device` defers (fusion on, blocking mode off), else a new tensor of
/// `layout` (dense, offset 0) computed now. `op` names the user op, for `explain`. The one
/// place an elementwise op decides between deferring and launching.
#[track_caller]
pub(crate) fn defer_or_launch(
    expr: Expr,
    layout: Layout,
    inputs: Vec<Tensor>,
    scalars: Vec<Scalar>,
    device: &Device,
    op: &'static str,
) -> Result<Tensor> {
    device.backend().check_dtype(expr.dtype)?;
    let op = crate::backward_scope::op_name(op);
    if !device.defers() {
        let out = Tensor::alloc_with_layout(layout, expr.dtype, device)?;
        let refs: Vec<&Tensor> = inputs.iter().collect();
        launch(Kernel::map(expr), &out, &refs, scalars)?;
        return Ok(out);
    }
    // Pending on the current stream: a tensor of `layout` (dense, offset 0) and `expr.dtype`.
    let stream = device.current_handle();
    let (nodes, leaves) = tree_size(&expr, &inputs, device, &stream)?;
    let dtype = expr.dtype;
    let bytes = layout
        .numel()
        .checked_mul(dtype.itemsize())
        .ok_or_else(|| {
            Error::Shape(format!(
                "{:?} of {dtype} overflows the byte count",
                layout.shape()
            ))
        })?;
    let pending = Pending {
        work: PendingWork::Tree(Tree {
            expr,
            inputs,
            scalars,
            nodes,
            leaves,
        }),
        layout: layout.clone(),
        dtype,
        stream,
        op,
        call_site: std::panic::Location::caller(),
    };
    let storage = Arc::new(Storage::new_pending(pending, bytes, device.clone()));
    if let Some(tree) = storage.pending().as_ref().and_then(Pending::tree) {
        for t in &tree.inputs {
            t.storage.add_reader(&storage);
        }
    }
    super::run::register(device, &storage);
    Ok(Tensor {
        storage,
        layout,
        dtype,
        autograd: None,
    })
}

/// The nodes and distinct leaves of the tree `expr` over `inputs` becomes with every pending
/// input on `stream` (read in its own layout) spliced in; an input pending elsewhere runs
/// first. Past the limits (`MAX_NODES`, the target's bindings) every input runs first and
/// the tree is `expr` alone. The leaves are worked out only when something is spliced (a
/// chain): `None` for an op on realized tensors, which binds its inputs.
fn tree_size(
    expr: &Expr,
    inputs: &[Tensor],
    device: &Device,
    stream: &Arc<StreamHandle>,
) -> Result<(usize, Option<Leaves>)> {
    let mut nodes = count_nodes(expr);
    let mut leaves: Option<Leaves> = None;
    let mut direct = smallvec::SmallVec::<[bool; 4]>::new(); // inputs read as leaves
    for t in inputs {
        let child = t.storage.pending();
        match child.as_ref() {
            Some(c) if Arc::ptr_eq(&c.stream, stream) && super::splice::reads_alike(c, t) => {
                if let PendingWork::Tree(tree) = &c.work {
                    // Spliced in: its nodes replace the input's, its leaves join ours.
                    nodes += tree.nodes - 1;
                    add_leaves(&mut leaves, tree);
                    direct.push(false);
                    continue;
                }
            }
            // Read in another layout: it runs first and is read as a leaf.
            Some(c) if Arc::ptr_eq(&c.stream, stream) => {}
            Some(_) => {
                // Pending on another stream: it runs there, ordered by the usual events.
                drop(child);
                t.realize()?;
            }
            None => {}
        }
        direct.push(true);
    }
    if leaves.is_some() {
        for (t, _) in inputs.iter().zip(&direct).filter(|(_, &d)| d) {
            add_leaf(&mut leaves, address(&t.storage), &t.layout, t.dtype);
        }
        // One kernel binds its leaves and its output.
        let target = device.backend().target();
        if nodes > MAX_NODES || leaves.as_ref().is_some_and(|l| !target.binds(l.len() + 1)) {
            for t in inputs {
                t.realize()?;
            }
            return Ok((count_nodes(expr), None));
        }
    }
    Ok((nodes, leaves))
}

/// `file:line` of a call site; empty for a notebook cell's own code, whose place is a line of
/// the crate evcxr generates (`src/lib.rs:114`), which means nothing to the reader.
pub(crate) fn place(l: &std::panic::Location<'_>) -> String {
    if l.file() == "src/lib.rs" && in_evcxr() {
        return String::new();
    }
    format!("{}:{}", l.file(), l.line())
}

/// True in the process evcxr runs notebook cells in (it sets `EVCXR_IS_RUNTIME` there).
fn in_evcxr() -> bool {
    static IN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *IN.get_or_init(|| std::env::var_os("EVCXR_IS_RUNTIME").is_some())
}

/// A pending tree's value as a map over its leaves, for a kernel that writes it into another
/// tensor (`assign`): its expression (every pending tree it reads element for element
/// spliced in), the leaves and the launch scalars.
pub(crate) struct TreeAsMap {
    pub(crate) expr: Expr,
    pub(crate) leaves: Vec<Tensor>,
    pub(crate) scalars: Vec<Scalar>,
}

/// `t` as a map ([`TreeAsMap`]) when it is a pending tree read whole, issued on the current
/// stream, that no one but `t` holds: its value is then needed by this one kernel only, so
/// it never runs on its own (`t.assign(tree)` is one kernel, not the tree's and a copy).
/// Leaves the tree pending (and `None`) otherwise. (An intermediate still alive that reads
/// `t` — a temporary of the same statement, `t.assign(t.mul(0.9)?.add(1.0)?)` — runs first,
/// on the old values, as any tensor someone holds: bind the tree alone.)
///
/// ```
/// use strata_core::{Device, DType, Tensor};
/// let dev = Device::cpu();
/// let r = Tensor::ones([4], DType::F32, &dev)?;
/// let p = dev.profile(|| {
///     let new = r.mul(0.9)?.add(1.0)?;
///     r.assign(new)
/// })?;
/// let kernels = p.records.iter().filter(|r| r.kind == strata_core::RecordKind::Kernel);
/// assert_eq!(kernels.count(), if dev.fusion() { 1 } else { 3 });
/// assert_eq!(r.to_vec::<f32>()?, vec![1.9; 4]);
/// # Ok::<(), strata_core::Error>(())
/// ```
pub(crate) fn tree_as_map(t: &Tensor) -> Result<Option<TreeAsMap>> {
    // (`t` alone: no other tensor, tree or deferred reduction may read its value later.)
    if !t.storage.is_pending() || Arc::strong_count(&t.storage) != 1 {
        return Ok(None);
    }
    let stream = t.device().current_handle();
    let guard = t.storage.pending();
    let Some(p) = guard.as_ref() else {
        return Ok(None);
    };
    let Some(tree) = p.tree() else {
        return Ok(None);
    };
    if p.layout != t.layout || !Arc::ptr_eq(&p.stream, &stream) {
        return Ok(None);
    }
    let mut fused = super::splice::Fused::new(tree, &p.stream, 0);
    let expr = fused.splice(p, true)?;
    Ok(Some(TreeAsMap {
        expr,
        leaves: fused.inputs,
        scalars: fused.scalars,
    }))
}
