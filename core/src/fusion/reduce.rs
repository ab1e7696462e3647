//! Fusion around reductions. Map→reduce: a reduction of a pending tree reads the tree
//! directly ([`reduce_map_of`]). Row prologues: a maximum or minimum of a realized tensor is
//! kept pending ([`defer_reduce`]), so that a later reduction of the same rows that reads it
//! (`(x - x.max(-1, true)).exp().sum(-1)`) computes both in one kernel ([`row_prologue_of`]).
//! Row epilogues: that later reduction is kept pending too ([`defer_map_reduce`]), so that
//! elementwise work over the same rows that reads its result (`e / s`, softmax from its
//! primitives) runs in its kernel last ([`epilogue_of`]): each row read once, written once.

use super::splice::{renumber_inputs, substitute, Fused};
use crate::dtype::{DType, Scalar};
use crate::error::Result;
use crate::ir::{Expr, ReduceOp, RowEpilogue, RowPrologue};
use crate::layout::Layout;
use crate::lower::operands::{per_output_layout, per_position_layout};
use crate::tensor::{DeferredReduce, Pending, PendingWork, Storage, Tensor};
use std::sync::Arc;

/// The reduction `op` of `t`'s axes in `order` (kept, then the last `reduced_axes`) into a new
/// tensor of `out_shape`, kept pending where a later reduction of the same rows may take it
/// in: a maximum or minimum (order-free: the fused kernel computes the eager value), or a
/// float sum over the trailing axes where the backend adds a prologue in the eager order
/// ([`fuses_sum_prologue`](crate::target::Target::fuses_sum_prologue): a mean), of a
/// realized tensor, accumulated in its own dtype, on a device that defers and fuses row
/// prologues. `None`: the reduction runs now.
#[track_caller]
pub(crate) fn defer_reduce(
    op: ReduceOp,
    t: &Tensor,
    order: &[usize],
    reduced_axes: usize,
    out_shape: &[usize],
    (acc, out_dtype): (DType, DType),
) -> Result<Option<Tensor>> {
    let device = t.device();
    let target = device.backend().target();
    // A float sum over the trailing axes (a mean) where the backend adds a prologue's terms in
    // the eager order.
    let trailing = order.iter().enumerate().all(|(k, &a)| k == a);
    let sums = op == ReduceOp::Sum && acc.is_float() && trailing && target.fuses_sum_prologue;
    let defer = (op.is_order_free() || sums)
        && device.defers()
        && target.fuses_row_prologue
        && !t.is_pending()
        && acc == out_dtype;
    if !defer {
        return Ok(None);
    }
    let source = t.with_layout(t.layout.permuted(order)?);
    let work = DeferredReduce {
        op,
        reduced_axes,
        acc,
        order: (0..source.ndim()).collect(),
        source,
    };
    pending_reduction(work, out_shape, out_dtype).map(Some)
}

/// The reduction `op` of the pending tree `t`'s last `reduced_axes` axes into a new tensor of
/// `out_shape`, kept pending so that elementwise work over the same rows that reads its result
/// may run in its kernel ([`epilogue_of`]): where the backend fuses row epilogues, `t` is a
/// tree read whole on the current stream, and its map reads a deferred maximum or minimum
/// (the reduction would stage its rows with that prologue) or the backend stages rows of its
/// length without one ([`stages_row_epilogue_alone`](crate::target::Target::stages_row_epilogue_alone)).
/// `None`: the reduction runs now.
#[track_caller]
pub(crate) fn defer_map_reduce(
    op: ReduceOp,
    t: &Tensor,
    reduced_axes: usize,
    out_shape: &[usize],
    (acc, out_dtype): (DType, DType),
) -> Result<Option<Tensor>> {
    let device = t.device();
    let target = device.backend().target();
    let stream = device.current_handle();
    let stages_alone = || {
        let row: usize = t.shape()[t.ndim() - reduced_axes.min(t.ndim())..]
            .iter()
            .product();
        target.stages_row_epilogue_alone
            && row * t.dtype().itemsize() <= target.row_stage_bytes
            && is_tree_on(t, &stream)
    };
    let defer = device.defers()
        && target.fuses_row_epilogue
        && target.fuses_map_into_reduce
        && target.fuses_row_prologue
        && !op.returns_index()
        && (stages_alone() || reads_deferred_reduction(t, &stream, &mut Vec::new()));
    if !defer {
        return Ok(None);
    }
    let work = DeferredReduce {
        op,
        reduced_axes,
        acc,
        source: t.clone(),
        order: (0..t.ndim()).collect(),
    };
    pending_reduction(work, out_shape, out_dtype).map(Some)
}

/// The reduction `op` of the pending tree `t` (its axes read in `order`: kept, then the last
/// `reduced_axes`) into a new tensor of `out_shape`, kept pending so that a read of the tree
/// itself runs both in one kernel that stores the tree as it reduces it
/// (`Kernel::Reduce { stores_map }`, see `fusion::run`): where the backend stores a
/// reduction's map, `t` is a tree read whole on the current stream and `op` is no arg op. A
/// reduction read first runs as it would have (the tree stays pending). `None`: the reduction
/// runs now.
#[track_caller]
pub(crate) fn defer_stored_map_reduce(
    op: ReduceOp,
    t: &Tensor,
    order: &[usize],
    reduced_axes: usize,
    out_shape: &[usize],
    (acc, out_dtype): (DType, DType),
) -> Result<Option<Tensor>> {
    let device = t.device();
    let target = device.backend().target();
    let defer = device.defers()
        && target.stores_reduce_map
        && target.fuses_map_into_reduce
        && !op.returns_index()
        && is_tree_on(t, &device.current_handle())
        && leaves_laid_like(t, order, &Layout::contiguous(out_shape)?)?;
    if !defer {
        return Ok(None);
    }
    let work = DeferredReduce {
        op,
        reduced_axes,
        acc,
        source: t.clone(),
        order: order.to_vec(),
    };
    pending_reduction(work, out_shape, out_dtype).map(Some)
}

/// True when the leaf `u` is laid out like a pending tree's `(layout, item size)` as a
/// reduction plans over it: the same shape, strides and item size, and an offset as aligned as
/// the tree's fresh buffer (16 bytes, the widest vector a plan takes).
fn laid_like(u: &Tensor, (layout, item): &(Layout, usize)) -> bool {
    u.layout.shape() == layout.shape()
        && u.layout.strides() == layout.strides()
        && u.dtype.itemsize() == *item
        && (u.layout.offset() * item).is_multiple_of(16)
}

/// True when every leaf of the pending tree `t` that a fused reduction into `out` (reading
/// `t`'s axes in `order`) would read element by element is laid out like `t` ([`laid_like`]),
/// the others holding one value per output or one value per position in a row: the reduction
/// then plans alike whether it reads the leaves or `t` realized (a flush may store `t` before
/// the reduction runs), so it adds in the same order either way, bit for bit.
fn leaves_laid_like(t: &Tensor, order: &[usize], out: &Layout) -> Result<bool> {
    let like = (t.layout.clone(), t.dtype.itemsize());
    let rows = t.layout.permuted(order)?;
    let stream = t.device().current_handle();
    let mut todo = vec![t.clone()];
    let mut seen: Vec<usize> = Vec::new();
    while let Some(u) = todo.pop() {
        let at = super::splice::address(&u.storage);
        if seen.contains(&at) {
            continue;
        }
        if seen.len() > super::MAX_NODES {
            return Ok(false);
        }
        seen.push(at);
        let guard = u.storage.pending();
        // A tree read whole is spliced: its inputs are the leaves (or trees again).
        let tree = guard
            .as_ref()
            .filter(|p| p.layout == u.layout && Arc::ptr_eq(&p.stream, &stream));
        if let Some(tree) = tree.and_then(Pending::tree) {
            todo.extend(tree.inputs.iter().cloned());
            continue;
        }
        let permuted = u.layout.permuted(order)?;
        let kept = out.ndim();
        if !laid_like(&u, &like)
            && !per_output_layout(&permuted, out, kept)
            && !per_position_layout(&permuted, &rows, kept)
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A new tensor of `out_shape` and `out_dtype` whose value is the deferred reduction `work`,
/// registered for the flush; a write into its source runs it first, like any pending reader.
#[track_caller]
fn pending_reduction(
    work: DeferredReduce,
    out_shape: &[usize],
    out_dtype: DType,
) -> Result<Tensor> {
    let device = work.source.device().clone();
    let layout = Layout::contiguous(out_shape)?;
    let bytes = layout.numel() * out_dtype.itemsize();
    let source = work.source.storage.clone();
    let pending = Pending {
        op: op_name(work.op),
        work: PendingWork::Reduce(work),
        layout: layout.clone(),
        dtype: out_dtype,
        stream: device.current_handle(),
        call_site: std::panic::Location::caller(),
    };
    let storage = Arc::new(Storage::new_pending(pending, bytes, device.clone()));
    source.add_reader(&storage);
    super::run::register(&device, &storage);
    Ok(Tensor {
        storage,
        layout,
        dtype: out_dtype,
        autograd: None,
    })
}

/// The user-facing name of a reduction op (what `explain` and the profile show).
fn op_name(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum => "sum",
        ReduceOp::Prod => "prod",
        ReduceOp::Max => "max",
        ReduceOp::Min => "min",
        ReduceOp::Any => "any",
        ReduceOp::All => "all",
        ReduceOp::ArgMax => "argmax",
        ReduceOp::ArgMin => "argmin",
    }
}

/// True when `t` is a pending tree read whole, issued on `stream`.
fn is_tree_on(t: &Tensor, stream: &Arc<crate::device::StreamHandle>) -> bool {
    let guard = t.storage.pending();
    guard.as_ref().is_some_and(|p| {
        matches!(p.work, PendingWork::Tree(_))
            && p.layout == t.layout
            && Arc::ptr_eq(&p.stream, stream)
    })
}

/// True when `t` is a pending tree (read whole, issued on `stream`) whose expression reads,
/// through pending trees, a deferred maximum or minimum.
fn reads_deferred_reduction(
    t: &Tensor,
    stream: &Arc<crate::device::StreamHandle>,
    visited: &mut Vec<usize>,
) -> bool {
    // Each storage once: a tree that reads one input twice at every step is a chain, not
    // 2^depth paths.
    let at = super::splice::address(&t.storage);
    if visited.contains(&at) || visited.len() > super::splice::MAX_NODES {
        return false;
    }
    visited.push(at);
    let guard = t.storage.pending();
    let Some(p) = guard.as_ref() else {
        return false;
    };
    match &p.work {
        PendingWork::Reduce(d) => !d.source.is_pending(),
        PendingWork::Tree(tree) => {
            // (Read whole, or through a broadcast: see `splice::broadcast_spliceable`.)
            let viewed = p.layout == t.layout
                || p.layout
                    .broadcast_to(t.shape())
                    .is_ok_and(|b| b == t.layout);
            viewed
                && Arc::ptr_eq(&p.stream, stream)
                && tree
                    .inputs
                    .iter()
                    .any(|u| reads_deferred_reduction(u, stream, visited))
        }
    }
}

/// Row-prologue fusion: among the inputs of a fused reduction into `out` (arranged for
/// `Kernel::Reduce { map }`), a deferred reduction of the same rows (its source is one of
/// the inputs read element by element, and it is read one value per output) issued on the
/// current stream. Its work is taken over: its storage gets its buffer and is no longer
/// pending, and the reduction's kernel computes it first and writes it (output 1). Returns
/// the prologue and that output.
pub(crate) fn row_prologue_of(
    inputs: &[Tensor],
    out: &Tensor,
    reduced_axes: usize,
) -> Result<Option<(RowPrologue, Tensor)>> {
    let stream = out.device().current_handle();
    let kept = out.ndim();
    for (result, t) in inputs.iter().enumerate() {
        // Another pending input that reads it (a variance centred by the mean this kernel
        // would take in) runs before the kernel, and would read it unwritten: it runs first.
        // (Walked before `t`'s lock is taken, and only for a deferred reduction.)
        let deferred = |t: &Tensor| {
            let guard = t.storage.pending();
            matches!(
                guard.as_ref().map(|p| &p.work),
                Some(PendingWork::Reduce(_))
            )
        };
        if !deferred(t) || pending_reader(inputs, t) {
            continue;
        }
        let mut guard = t.storage.pending();
        let Some(p) = guard.as_ref() else {
            continue;
        };
        let PendingWork::Reduce(d) = &p.work else {
            continue;
        };
        let source = inputs.iter().position(|u| {
            u.shares_storage(&d.source)
                && u.layout == d.source.layout
                && u.dtype == d.source.dtype
                && !per_output_layout(&u.layout, &out.layout, kept)
        });
        let fits = Arc::ptr_eq(&p.stream, &stream)
            && d.reduced_axes == reduced_axes
            && t.dtype == p.dtype
            && t.layout.offset() == 0 // reads output o's value at o, where the kernel writes it
            && per_output_layout(&t.layout, &out.layout, kept);
        let (Some(source), true) = (source, fits) else {
            continue;
        };
        let prologue = RowPrologue {
            op: d.op,
            source,
            result,
        };
        let buffer = out.device().allocate_buffer(t.storage.bytes, p.stream.id)?;
        t.storage.set_buffer(buffer);
        let written = Tensor {
            storage: t.storage.clone(),
            layout: p.layout.clone(),
            dtype: p.dtype,
            autograd: None,
        };
        *guard = None;
        return Ok(Some((prologue, written)));
    }
    Ok(None)
}

/// True when one of `inputs` other than `t`'s storage is pending and reads `t` (through the
/// pending trees and deferred reductions it reads): it runs before a kernel that reads
/// `inputs`, so it must not read a result that kernel writes.
pub(crate) fn pending_reader(inputs: &[Tensor], t: &Tensor) -> bool {
    inputs.iter().any(|u| {
        !u.shares_storage(t)
            && u.storage.is_pending()
            && super::splice::reads_storage(u, &t.storage)
    })
}

/// A pending tree as a reduction reads it (`Kernel::Reduce { map }`).
pub(crate) struct MapForReduce {
    /// The element reduced at each position, over `inputs` and `scalars`.
    pub(crate) expr: Expr,
    /// The tree's leaves, permuted and arranged as the kernel reads them.
    pub(crate) inputs: Vec<Tensor>,
    /// The launch scalars.
    pub(crate) scalars: Vec<Scalar>,
    /// The pending storages spliced into `expr` (the kernel computes their values).
    pub(crate) computed: Vec<std::sync::Weak<Storage>>,
    /// The user ops of the tree, in the order they were called, and where.
    pub(crate) ops: Vec<&'static str>,
    pub(crate) call_sites: Vec<&'static std::panic::Location<'static>>,
}

/// Map→reduce fusion: the reduction into `out` of the pending tensor `t`, whose axes it reads
/// in `order` (kept, then reduced), reads `t`'s tree directly instead of its values: the tree
/// (renumbered) with its leaves permuted and arranged for `Kernel::Reduce { map }` (first a
/// leaf read element by element, then the others, each laid out like it or holding one value
/// per output), and the launch scalars. Only when `t` is read whole (not through a view), on
/// the stream it was issued on, the device fuses into reductions and the kernel fits its
/// binding limits; pending inputs read through another view run first. `None`: the reduction
/// reads `t` realized.
pub(crate) fn reduce_map_of(
    t: &Tensor,
    order: &[usize],
    out: &Tensor,
    in_order: bool,
) -> Result<Option<MapForReduce>> {
    let device = t.device();
    let target = device.backend().target();
    if !device.defers() || !target.fuses_map_into_reduce {
        return Ok(None);
    }
    let guard = t.storage.pending();
    let Some(p) = guard.as_ref() else {
        return Ok(None);
    };
    if p.layout != t.layout || !Arc::ptr_eq(&p.stream, &device.current_handle()) {
        return Ok(None);
    }
    let Some(m) = map_of_pending(p, order, out, in_order)? else {
        return Ok(None);
    };
    let id = super::run::kernel_id();
    super::run::mark_computed(id, [&t.storage, &out.storage], &m.computed);
    Ok(Some(m))
}

/// [`reduce_map_of`] for the pending work `p` (a tree, whose lock the caller holds, read
/// whole), without marking what the kernel computes: `None` where its tree does not fit a
/// reduction's map. `in_order`: the result depends on the order the elements are combined in
/// (a float sum or product), so the leaves must be laid out like the tree.
pub(crate) fn map_of_pending(
    p: &Pending,
    order: &[usize],
    out: &Tensor,
    in_order: bool,
) -> Result<Option<MapForReduce>> {
    let PendingWork::Tree(tree) = &p.work else {
        return Ok(None);
    };
    let target = out.device().backend().target();
    let mut fused = Fused::new(tree, &p.stream, 0);
    fused.keep_reductions = target.fuses_row_prologue;
    let expr = fused.splice(p, true)?;
    if fused.inputs.is_empty() || expr.reads_linear_index() {
        return Ok(None);
    }
    let Some((expr, inputs)) = arrange_reduce_inputs(&expr, &fused.inputs, order, out)? else {
        return Ok(None);
    };
    // The plan follows input 0's layout: where a float sum's leaves are laid out otherwise
    // than the tree (a transposed leaf made contiguous, a cast's narrower leaf), the
    // reduction reads the tree realized, so it adds in the eager order. (A maximum, `any`,
    // an integer sum: the same result in any order.)
    let tree = (p.layout.permuted(order)?, p.dtype.itemsize());
    let kept = out.ndim();
    let alike = !in_order
        || laid_like(&inputs[0], &tree)
            && inputs.iter().all(|u| {
                laid_like(u, &tree)
                    || per_output_layout(&u.layout, &out.layout, kept)
                    || per_position_layout(&u.layout, &tree.0, kept)
            });
    let bytes: Vec<usize> = inputs.iter().map(|t| t.storage.bytes).collect();
    if !alike || !target.binds_reduce(&bytes) {
        return Ok(None);
    }
    Ok(Some(MapForReduce {
        expr,
        inputs,
        scalars: fused.scalars,
        computed: fused.computed,
        ops: fused.ops,
        call_sites: fused.call_sites,
    }))
}

/// The leaves of a fused map permuted by `order` (kept axes, then reduced ones) and arranged
/// for `Kernel::Reduce { map }`: first a leaf read element by element, then the others, each
/// laid out like it or holding one value per output of `out` or one value per position in its
/// rows; the expression renumbered to match. `None` when the leaves do not fit that shape (the map then runs first).
fn arrange_reduce_inputs(
    expr: &Expr,
    leaves: &[Tensor],
    order: &[usize],
    out: &Tensor,
) -> Result<Option<(Expr, Vec<Tensor>)>> {
    let permuted = leaves
        .iter()
        .map(|t| Ok(t.with_layout(t.layout.permuted(order)?)))
        .collect::<Result<Vec<_>>>()?;
    let kept = out.ndim();
    // From the layouts alone: a deferred reduction among the leaves stays pending.
    let one_per_output: Vec<bool> = permuted
        .iter()
        .map(|t| per_output_layout(&t.layout, &out.layout, kept))
        .collect();
    // Input 0: the first leaf read element by element that the others are laid out like,
    // or hold one value per output or per position of its rows.
    let fits = |first: usize| {
        let (f, fd) = (&permuted[first].layout, permuted[first].dtype.itemsize());
        permuted.iter().zip(&one_per_output).all(|(t, &p)| {
            p || (&t.layout == f && t.dtype.itemsize() == fd)
                || per_position_layout(&t.layout, f, kept)
        })
    };
    let Some(first) = (0..permuted.len()).find(|&k| !one_per_output[k] && fits(k)) else {
        return Ok(None);
    };
    // Input `first` becomes input 0; the others keep their order after it.
    let mut to = vec![0; permuted.len()];
    let mut arranged = vec![permuted[first].clone()];
    for (k, t) in permuted.iter().enumerate() {
        if k != first {
            to[k] = arranged.len();
            arranged.push(t.clone());
        }
    }
    let dtypes: Vec<DType> = leaves.iter().map(|t| t.dtype()).collect();
    Ok(Some((renumber_inputs(expr, &to, &dtypes), arranged)))
}

/// Elementwise work over the rows of a deferred reduction that reads its result: a pending
/// tree being realized (see `fusion::run`), as its spliced expression, leaves and scalars.
pub(crate) struct EpilogueRequest {
    /// The value of each element, over `leaves` and `scalars`.
    pub(crate) expr: Expr,
    /// The tree's leaves; leaf `result` reads the reduction's output.
    pub(crate) leaves: Vec<Tensor>,
    /// The launch scalars of `expr`.
    pub(crate) scalars: Vec<Scalar>,
    /// The leaf that reads the reduction's output (one value per row).
    pub(crate) result: usize,
    /// The tensor the work writes, laid out over the rows: pending, its buffer allocated
    /// when a reduction takes the work.
    pub(crate) out: Tensor,
}

/// Row-epilogue fusion: `req`'s work as the epilogue of the reduction into `out` whose
/// inputs (arranged for `Kernel::Reduce { map }`) are `inputs` and whose map has `map_scalars`
/// scalars: the epilogue (its expression over the kernel's inputs, its scalars after the
/// map's) and the further inputs it needs (its own leaves laid out like input 0, holding
/// one value per output or one value per position in a row — a layer norm's weight — then
/// the view of the result). `None` when the work does not run
/// over the rows of input 0 (axes reduced last), reads the position or an operand laid out
/// otherwise, or the kernel would exceed the target's bindings.
pub(crate) fn epilogue_of(
    req: &EpilogueRequest,
    inputs: &[Tensor],
    map_scalars: usize,
    out: &Tensor,
) -> Result<Option<(RowEpilogue, Vec<Tensor>)>> {
    let Some((to, extra)) = match_leaves(&req.expr, &req.leaves, req.result, &req.out, inputs, out)
    else {
        return Ok(None);
    };
    let result = to[req.result];
    let mut leaves: Vec<(Expr, usize)> = req
        .leaves
        .iter()
        .zip(&to)
        .map(|(u, &k)| (Expr::input(k, u.dtype), usize::MAX))
        .collect();
    let expr = substitute(&req.expr, &mut leaves, map_scalars);
    Ok(Some((RowEpilogue { expr, result }, extra)))
}

/// How the leaves of elementwise work (`expr`, writing `work_out`, its leaf `result` reading
/// the reduction's output `out`) map onto a reduction's `inputs` as its epilogue: per leaf its
/// input number (the reduction's own, or one of the further inputs, numbered after them), and
/// those further inputs. `None` where it cannot be its epilogue (see [`epilogue_of`]).
fn match_leaves(
    expr: &Expr,
    leaves: &[Tensor],
    result: usize,
    work_out: &Tensor,
    inputs: &[Tensor],
    out: &Tensor,
) -> Option<(Vec<usize>, Vec<Tensor>)> {
    let kept = out.ndim();
    let rows = &inputs.first()?.layout;
    let fits = work_out.layout.shape() == rows.shape()
        && !expr.reads_linear_index()
        && leaves[result].shares_storage(out)
        && per_output_layout(&leaves[result].layout, &out.layout, kept);
    if !fits {
        return None;
    }
    let same =
        |u: &Tensor, v: &Tensor| u.shares_storage(v) && u.layout == v.layout && u.dtype == v.dtype;
    let mut extra: Vec<Tensor> = Vec::new();
    let mut to = Vec::with_capacity(leaves.len());
    for (k, u) in leaves.iter().enumerate() {
        // (Only the result's own leaf reads the output: the kernel writes it last.)
        if k != result && u.shares_storage(out) {
            return None;
        }
        let own = (k != result)
            .then(|| inputs.iter().position(|v| same(u, v)))
            .flatten();
        let at = match own {
            Some(at) => at,
            None => {
                let rowwise = u.layout == *rows && u.dtype.itemsize() == inputs[0].dtype.itemsize();
                let fits = rowwise
                    || per_output_layout(&u.layout, &out.layout, kept)
                    || per_position_layout(&u.layout, rows, kept);
                if k != result && !fits {
                    return None;
                }
                extra.push(u.clone());
                inputs.len() + extra.len() - 1
            }
        };
        to.push(at);
    }
    let target = out.device().backend().target();
    let bytes: Vec<usize> = inputs
        .iter()
        .chain(&extra)
        .chain([work_out])
        .map(|t| t.storage.bytes)
        .collect();
    target.binds_reduce(&bytes).then_some((to, extra))
}

/// For `explain`, without running anything: true when the tree `expr` over `leaves` (writing
/// `work_out`) would run as the epilogue of the deferred reduction its leaf `result` reads
/// (pending work `p` of that leaf's storage): the same checks as [`epilogue_of`], over the
/// reduction's inputs as its map would arrange them.
pub(crate) fn epilogue_would_fit(
    expr: &Expr,
    leaves: &[Tensor],
    result: usize,
    work_out: &Tensor,
    p: &Pending,
) -> Result<bool> {
    let PendingWork::Reduce(d) = &p.work else {
        return Ok(false);
    };
    let guard = d.source.storage.pending();
    let Some(sp) = guard.as_ref() else {
        return Ok(false);
    };
    let PendingWork::Tree(tree) = &sp.work else {
        return Ok(false);
    };
    let mut fused = Fused::new(tree, &sp.stream, 0);
    let map = fused.splice(sp, false)?;
    drop(guard);
    let out = Tensor {
        storage: leaves[result].storage.clone(),
        layout: p.layout.clone(),
        dtype: p.dtype,
        autograd: None,
    };
    let order: Vec<usize> = (0..d.source.ndim()).collect();
    let Some((_, inputs)) = arrange_reduce_inputs(&map, &fused.inputs, &order, &out)? else {
        return Ok(false);
    };
    Ok(match_leaves(expr, leaves, result, work_out, &inputs, &out).is_some())
}
