//! Lazy fusion: an elementwise op checks its operands at the call, then records its expression
//! instead of launching it. The result is a *pending* tensor whose storage has no buffer yet;
//! chains of pending tensors grow one expression tree, and the first use that needs the values
//! (a host read, a non-elementwise op, a write into a buffer the tree reads, an event, a
//! synchronize, [`Tensor::realize`], [`Device::flush`]) runs the whole tree as one `Map`
//! kernel. Each node keeps its own dtype and rounding, so fused results equal eager ones.
//!
//! ```
//! use strata_core::{Device, DType, Tensor};
//! let dev = Device::cpu();
//! let a = Tensor::arange(0, 4, 1, DType::F32, &dev)?;
//! let y = (&a * 2.0)?.add(1.0)?.relu()?; // three ops, nothing has run yet
//! assert!(y.is_pending() || !dev.fusion());
//! assert_eq!(y.to_vec::<f32>()?, vec![1.0, 3.0, 5.0, 7.0]); // one kernel ran
//! assert!(!y.is_pending());
//! # Ok::<(), strata_core::Error>(())
//! ```

use crate::device::{Device, StreamHandle};
use crate::dtype::{DType, Scalar};
use crate::error::{Error, Result};
use crate::explain::Ran;
use crate::ir::{Expr, Kernel, Node, PriorReduce, ReduceOp};
use crate::layout::Layout;
use crate::tensor::{launch_on, Storage, Tensor};
use std::sync::Arc;

/// The most expression nodes one fused kernel holds. Past it, the inputs are run first, so
/// every tree (and every walk of one) stays small however long a chain is.
pub const MAX_NODES: usize = 192;
/// The most tensor inputs one fused kernel reads: wgpu's default of 8 storage bindings per
/// shader stage, less the parameters and the output.
pub const MAX_INPUTS: usize = 6;

/// Deferred work: the expression that fills a pending storage.
pub(crate) struct Pending {
    /// The value of each element, over `inputs` and `scalars`.
    pub(crate) expr: Expr,
    /// Views the expression reads, with the result's shape (realized or pending).
    pub(crate) inputs: Vec<Tensor>,
    /// Launch scalars.
    pub(crate) scalars: Vec<Scalar>,
    /// The layout the result is written with (dense, offset 0).
    pub(crate) layout: Layout,
    /// The stream the op was issued on: the kernel runs there.
    pub(crate) stream: Arc<StreamHandle>,
    /// The user op that made this node (`add`, `relu`, ...), for `explain`.
    pub(crate) what: &'static str,
    /// Where the user called it (ops carry `#[track_caller]` down to `record`).
    pub(crate) at: &'static std::panic::Location<'static>,
    /// Expression nodes of the whole tree this node would fuse (an upper bound).
    nodes: usize,
    /// The distinct tensor inputs of that tree, as the kernel would bind them (a chain that
    /// reads one tensor at every step binds it once, so it grows until `MAX_NODES`); `None`:
    /// no input is spliced in, so they are `inputs` themselves.
    leaves: Option<Leaves>,
    /// A deferred reduction instead of an expression (`expr` is then a placeholder and
    /// `inputs` is empty): it never splices into a tree; it runs when read, or inside the
    /// kernel of a later reduction that reads it (see [`prior_of`]).
    reduce: Option<Box<DeferredReduce>>,
}

/// A reduction whose launch waits for its first use: a later reduction over the same rows
/// that reads it one value per output computes both in one kernel
/// ([`PriorReduce`](crate::ir::PriorReduce)), reading the rows once.
pub(crate) struct DeferredReduce {
    /// What it combines (an order-free op: the fused kernel computes the eager value).
    pub(crate) op: ReduceOp,
    /// Trailing axes of `source` reduced (it accumulates in its own dtype, the result's).
    pub(crate) reduced_axes: usize,
    /// The input, its axes permuted as the reduction reads them (kept, then reduced).
    pub(crate) source: Tensor,
}

/// A tensor input of a fused kernel: its storage (by address), view and dtype, as
/// [`Fused::leaf`] tells inputs apart.
type Leaf = (usize, Layout, DType);
/// The distinct leaves of a tree, at most [`MAX_INPUTS`] of them (past that it runs); shared
/// with a child whose leaves are all of them (a chain reading the same tensors copies none).
type Leaves = Arc<Vec<Leaf>>;

/// Adds the leaf `(a, l, d)` to `leaves` unless it is there.
fn add_leaf(leaves: &mut Option<Leaves>, a: usize, l: &Layout, d: DType) {
    let known = |set: &Leaves| set.iter().any(|(k, m, e)| *k == a && *e == d && m == l);
    if !leaves.as_ref().is_some_and(known) {
        Arc::make_mut(leaves.get_or_insert_with(Default::default)).push((a, l.clone(), d));
    }
}

/// Adds every leaf of the spliced tree `child` to `leaves` (sharing `child`'s set when
/// `leaves` is empty).
fn add_leaves(leaves: &mut Option<Leaves>, child: &Pending) {
    match (&*leaves, &child.leaves) {
        (None, Some(set)) => *leaves = Some(set.clone()),
        (Some(mine), Some(set)) if Arc::ptr_eq(mine, set) => {}
        (_, Some(set)) => {
            for (a, l, d) in set.iter() {
                add_leaf(leaves, *a, l, *d);
            }
        }
        (_, None) => {
            for t in &child.inputs {
                add_leaf(leaves, address(&t.storage), &t.layout, t.dtype);
            }
        }
    }
}

/// Nodes of an expression tree.
fn count_nodes(e: &Expr) -> usize {
    match &e.node {
        Node::Input(_) | Node::Scalar(_) | Node::Literal(_) | Node::LinearIndex => 1,
        Node::Philox(_) => 1,
        Node::Cast { arg, .. } | Node::Unary(_, arg) => 1 + count_nodes(arg),
        Node::Binary(_, a, b) => 1 + count_nodes(a) + count_nodes(b),
        Node::Fma(a, b, c) | Node::Where(a, b, c) => {
            1 + count_nodes(a) + count_nodes(b) + count_nodes(c)
        }
    }
}

/// True when `device` defers elementwise ops: fusion on and blocking mode off.
pub(crate) fn defers(device: &Device) -> bool {
    device.fusion() && !device.blocking()
}

/// A pending tensor of `layout` (dense, offset 0) and `expr.dtype` computing `expr` over
/// `inputs` (views with the layout's shape) and `scalars`, issued on the current stream.
/// Callers have checked everything an eager launch would check.
#[track_caller]
pub(crate) fn record(
    expr: Expr,
    layout: Layout,
    inputs: Vec<Tensor>,
    scalars: Vec<Scalar>,
    device: &Device,
    what: &'static str,
) -> Result<Tensor> {
    let stream = device.current_handle();
    let mut nodes = count_nodes(&expr);
    // The leaves are worked out only when a pending input is spliced in (a chain); an op on
    // realized tensors binds its inputs.
    let mut leaves: Option<Leaves> = None;
    let mut direct = smallvec::SmallVec::<[bool; 4]>::new(); // inputs read as leaves
    for t in &inputs {
        let child = t.storage.pending.lock().unwrap_or_else(|p| p.into_inner());
        match child.as_ref() {
            Some(c)
                if Arc::ptr_eq(&c.stream, &stream)
                    && c.layout == t.layout
                    && c.reduce.is_none() =>
            {
                // Spliced in: its nodes replace the input's, its leaves join ours.
                nodes += c.nodes - 1;
                add_leaves(&mut leaves, c);
                direct.push(false);
                continue;
            }
            // Read in another layout: it runs first and is read as a leaf.
            Some(c) if Arc::ptr_eq(&c.stream, &stream) => {}
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
        if nodes > MAX_NODES || leaves.as_ref().is_some_and(|l| l.len() > MAX_INPUTS) {
            for t in &inputs {
                t.realize()?;
            }
            nodes = count_nodes(&expr);
            leaves = None;
        }
    }
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
        expr,
        inputs,
        scalars,
        layout: layout.clone(),
        stream,
        what,
        at: std::panic::Location::caller(),
        nodes,
        leaves,
        reduce: None,
    };
    let storage = Arc::new(Storage::new_pending(pending, bytes, device.clone()));
    if let Some(p) = storage
        .pending
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
    {
        for t in &p.inputs {
            t.storage.add_reader(&storage);
        }
    }
    device.register_pending(&storage);
    Ok(Tensor {
        storage,
        layout,
        dtype,
    })
}

/// A pending tensor of the dense `layout` and `dtype` holding the reduction `op` of the
/// trailing `reduced_axes` axes of `source` (permuted: kept axes, then reduced ones), issued
/// on the current stream. Callers have checked everything an eager launch would check.
#[track_caller]
pub(crate) fn record_reduce(
    reduce: DeferredReduce,
    layout: Layout,
    dtype: DType,
    what: &'static str,
) -> Result<Tensor> {
    let device = reduce.source.device().clone();
    let bytes = layout.numel() * dtype.itemsize();
    let source = reduce.source.storage.clone();
    let pending = Pending {
        expr: Expr::input(0, dtype),
        inputs: Vec::new(),
        scalars: Vec::new(),
        layout: layout.clone(),
        stream: device.current_handle(),
        what,
        at: std::panic::Location::caller(),
        nodes: 1,
        leaves: None,
        reduce: Some(Box::new(reduce)),
    };
    let storage = Arc::new(Storage::new_pending(pending, bytes, device.clone()));
    // A write into the source runs it first, like any pending reader.
    source.add_reader(&storage);
    device.register_pending(&storage);
    Ok(Tensor {
        storage,
        layout,
        dtype,
    })
}

/// True when `t`'s storage is a deferred reduction that has not run.
fn is_deferred_reduce(t: &Tensor) -> bool {
    t.storage
        .pending
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .is_some_and(|p| p.reduce.is_some())
}

/// The deferred reduction behind a pending `storage`, for `explain`: its op, reduced axes,
/// source, and the user op with where it was called.
pub(crate) fn deferred_reduce(
    storage: &Arc<Storage>,
) -> Option<(ReduceOp, usize, Tensor, &'static str, String)> {
    let guard = storage.pending.lock().unwrap_or_else(|p| p.into_inner());
    let p = guard.as_ref()?;
    let d = p.reduce.as_ref()?;
    Some((
        d.op,
        d.reduced_axes,
        d.source.clone(),
        p.what,
        format!("{}:{}", p.at.file(), p.at.line()),
    ))
}

/// Prior-reduction fusion: among the inputs of a fused reduction into `out` (arranged for
/// `Kernel::Reduce { map }`), a deferred reduction of the same rows (its source is one of
/// the inputs read element by element, and it is read one value per output) issued on the
/// current stream. Its work is taken over: its storage gets its buffer and is no longer
/// pending, and the reduction's kernel computes it first and writes it (output 1). Returns
/// the prior and that output.
pub(crate) fn prior_of(
    inputs: &[Tensor],
    out: &Tensor,
    reduced_axes: usize,
) -> Result<Option<(PriorReduce, Tensor)>> {
    use crate::lower::operands::per_output_layout;
    let stream = out.device().current_handle();
    let kept = out.ndim();
    for (result, t) in inputs.iter().enumerate() {
        let mut guard = t.storage.pending.lock().unwrap_or_else(|p| p.into_inner());
        let Some(p) = guard.as_ref() else {
            continue;
        };
        let Some(d) = p.reduce.as_ref() else {
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
            && t.dtype == p.expr.dtype
            && t.layout.offset() == 0 // reads output o's value at o, where the kernel writes it
            && per_output_layout(&t.layout, &out.layout, kept);
        let (Some(source), true) = (source, fits) else {
            continue;
        };
        let prior = PriorReduce {
            op: d.op,
            source,
            result,
        };
        let buffer = out.device().allocate_buffer(t.storage.bytes, p.stream.id)?;
        t.storage.set_buffer(buffer);
        let written = Tensor {
            storage: t.storage.clone(),
            layout: p.layout.clone(),
            dtype: p.expr.dtype,
        };
        *guard = None;
        return Ok(Some((prior, written)));
    }
    Ok(None)
}

/// One fused kernel being assembled: its inputs (deduplicated), scalars, user ops, and the
/// pending intermediates it stores as further outputs.
#[derive(Default)]
pub(crate) struct Fused {
    pub(crate) inputs: Vec<Tensor>,
    pub(crate) scalars: Vec<Scalar>,
    pub(crate) ops: Vec<&'static str>,
    /// Where each op was called (`file:line`).
    pub(crate) sources: Vec<&'static std::panic::Location<'static>>,
    /// Multi-output fusion: pending intermediates someone else still holds (the user, or a
    /// tree outside this kernel), each with its expression here; the kernel stores them too.
    pub(crate) also: Vec<(Tensor, Expr)>,
    /// How many intermediates may become outputs (0: none, as for a reduction's map).
    room: usize,
    /// References to each spliceable pending storage from the trees of this kernel.
    internal: Vec<(usize, usize)>,
    /// Pending storages spliced so far (by address, with the layout they were read with)
    /// and their expressions: a tree read twice element for element is spliced once, so its
    /// scalars are not repeated and a shared node stays shared.
    spliced: Vec<(usize, Layout, Expr)>,
    /// Deferred reductions read as leaves stay pending (a reduction's map: its kernel may
    /// compute them, see [`prior_of`]); otherwise they run first.
    keep_reductions: bool,
}

/// The address of a storage, its identity while the walk holds the tree.
fn address(s: &Arc<Storage>) -> usize {
    Arc::as_ptr(s) as usize
}

/// `t`'s pending work when a tree `p` issued on `stream` splices it in: read element for
/// element (the same layout) on the same stream.
fn spliceable<'g>(
    t: &Tensor,
    guard: &'g std::sync::MutexGuard<'_, Option<Pending>>,
    stream: &Arc<StreamHandle>,
) -> Option<&'g Pending> {
    guard
        .as_ref()
        .filter(|c| c.layout == t.layout && Arc::ptr_eq(&c.stream, stream) && c.reduce.is_none())
}

impl Fused {
    /// A kernel for the tree `p` that may store up to `room` intermediates as well.
    fn new(p: &Pending, room: usize) -> Fused {
        let mut fused = Fused {
            room,
            ..Fused::default()
        };
        // Only a tree with spliced inputs has internal references to count.
        if p.leaves.is_some() {
            fused.count_internal(p);
        }
        fused
    }

    /// Counts, over every distinct tree spliced into `root`'s kernel, the references each
    /// spliceable pending storage gets from them (iteratively: trees are bounded, but walks
    /// need no stack).
    fn count_internal(&mut self, root: &Pending) {
        let mut seen: Vec<usize> = Vec::new();
        let mut todo: Vec<Arc<Storage>> = Vec::new();
        let mut visit =
            |p: &Pending, todo: &mut Vec<Arc<Storage>>, internal: &mut Vec<(usize, usize)>| {
                for t in &p.inputs {
                    let guard = t.storage.pending.lock().unwrap_or_else(|p| p.into_inner());
                    if spliceable(t, &guard, &p.stream).is_none() {
                        continue;
                    }
                    let a = address(&t.storage);
                    match internal.iter_mut().find(|(k, _)| *k == a) {
                        Some((_, n)) => *n += 1,
                        None => internal.push((a, 1)),
                    }
                    if !seen.contains(&a) {
                        seen.push(a);
                        todo.push(t.storage.clone());
                    }
                }
            };
        visit(root, &mut todo, &mut self.internal);
        while let Some(s) = todo.pop() {
            let guard = s.pending.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(p) = guard.as_ref() {
                visit(p, &mut todo, &mut self.internal);
            }
        }
    }

    /// The index of input `t`, added unless the same view is already an input.
    fn leaf(&mut self, t: &Tensor) -> usize {
        let same = |u: &Tensor| u.shares_storage(t) && u.layout == t.layout && u.dtype == t.dtype;
        if let Some(k) = self.inputs.iter().position(same) {
            return k;
        }
        self.inputs.push(t.clone());
        self.inputs.len() - 1
    }

    /// `p`'s expression with every pending input read element for element (the same layout,
    /// the same stream) spliced in, recursively, and every other input made a leaf, realized
    /// first when `run`. A spliced input that someone outside this kernel still holds becomes
    /// a further output while there is room (it is computed here anyway, so storing it costs
    /// one write and saves running it again); past that it stays pending and its nodes are
    /// only recomputed here. An input only this kernel's trees hold is never written.
    fn splice(&mut self, p: &Pending, run: bool) -> Result<Expr> {
        // Each input's expression, moved into the result at its last use (a chain's subtrees
        // are not copied again at every level: splicing is linear in the nodes).
        let mut subst = smallvec::SmallVec::<[Expr; 4]>::new();
        for t in &p.inputs {
            if t.storage.is_pending() {
                let a = address(&t.storage);
                // (Another view of a spliced tree, a transposed one say, is no match: it is
                // realized below and read as a leaf.)
                let same = |(k, l, _): &&(usize, Layout, Expr)| *k == a && *l == t.layout;
                if let Some((_, _, e)) = self.spliced.iter().find(same) {
                    subst.push(e.clone());
                    continue;
                }
                let child = t.storage.pending.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(c) = spliceable(t, &child, &p.stream) {
                    let e = self.splice(c, run)?;
                    drop(child);
                    let internal = self
                        .internal
                        .iter()
                        .find(|(k, _)| *k == a)
                        .map_or(usize::MAX, |&(_, n)| n);
                    if self.also.len() < self.room && Arc::strong_count(&t.storage) > internal {
                        self.also.push((t.clone(), e.clone()));
                    }
                    // Kept for a second reference only (a storage read once is not).
                    if internal > 1 {
                        self.spliced.push((a, t.layout.clone(), e.clone()));
                    }
                    subst.push(e);
                    continue;
                }
                drop(child);
                if run && !(self.keep_reductions && is_deferred_reduce(t)) {
                    t.realize()?;
                }
            }
            subst.push(Expr::input(self.leaf(t), t.dtype));
        }
        let base = self.scalars.len();
        self.scalars.extend(p.scalars.iter().cloned());
        self.ops.push(p.what);
        self.sources.push(p.at);
        let mut uses = smallvec::SmallVec::<[usize; 4]>::from_elem(0, subst.len());
        count_uses(&p.expr, &mut uses);
        let mut subst: smallvec::SmallVec<[(Expr, usize); 4]> =
            subst.into_iter().zip(uses).collect();
        Ok(substitute(&p.expr, &mut subst, base))
    }

    /// Drops further outputs past what one kernel may bind (inputs and outputs together) and
    /// any that ran meanwhile (a view of one read elsewhere in the tree realizes it).
    fn fit_outputs(&mut self) {
        self.also.retain(|(t, _)| t.storage.is_pending());
        let bindings = (MAX_INPUTS + 1).saturating_sub(1 + self.inputs.len());
        self.also.truncate(bindings);
    }
}

/// How many intermediates a fused kernel on `device` may store besides its result.
fn room(device: &Device) -> usize {
    device.backend().map_outputs().saturating_sub(1)
}

/// Adds to `uses[k]` the reads of input `k` in `e`.
fn count_uses(e: &Expr, uses: &mut [usize]) {
    match &e.node {
        Node::Input(k) => uses[*k] += 1,
        Node::Scalar(_) | Node::Philox(_) | Node::Literal(_) | Node::LinearIndex => {}
        Node::Cast { arg, .. } | Node::Unary(_, arg) => count_uses(arg, uses),
        Node::Binary(_, a, b) => {
            count_uses(a, uses);
            count_uses(b, uses);
        }
        Node::Fma(a, b, c) | Node::Where(a, b, c) => {
            count_uses(a, uses);
            count_uses(b, uses);
            count_uses(c, uses);
        }
    }
}

/// `e` with input `k` replaced by `inputs[k].0` and scalar indices shifted by `base`;
/// `inputs[k].1` counts the reads of input `k` still to come: the last one takes the
/// expression, the others copy it.
fn substitute(e: &Expr, inputs: &mut [(Expr, usize)], base: usize) -> Expr {
    let node = match &e.node {
        Node::Input(k) => {
            let (expr, left) = &mut inputs[*k];
            *left -= 1;
            if *left > 0 {
                return expr.clone();
            }
            let taken = Expr {
                dtype: expr.dtype,
                node: Node::LinearIndex,
            };
            return std::mem::replace(expr, taken);
        }
        Node::Scalar(k) => Node::Scalar(k + base),
        Node::Philox(w) => Node::Philox(crate::ir::PhiloxWord {
            key: w.key + base,
            counter: w.counter + base,
            ..*w
        }),
        Node::Literal(_) | Node::LinearIndex => e.node.clone(),
        Node::Cast { arg, saturate } => Node::Cast {
            arg: Box::new(substitute(arg, inputs, base)),
            saturate: *saturate,
        },
        Node::Unary(op, a) => Node::Unary(*op, Box::new(substitute(a, inputs, base))),
        Node::Binary(op, a, b) => Node::Binary(
            *op,
            Box::new(substitute(a, inputs, base)),
            Box::new(substitute(b, inputs, base)),
        ),
        Node::Fma(a, b, c) => Node::Fma(
            Box::new(substitute(a, inputs, base)),
            Box::new(substitute(b, inputs, base)),
            Box::new(substitute(c, inputs, base)),
        ),
        Node::Where(c, a, b) => Node::Where(
            Box::new(substitute(c, inputs, base)),
            Box::new(substitute(a, inputs, base)),
            Box::new(substitute(b, inputs, base)),
        ),
    };
    Expr {
        dtype: e.dtype,
        node,
    }
}

/// The kernel a read of `storage` would run now (its expression with its pending inputs
/// spliced in), without running anything: for `explain`. `None` once it has run.
pub(crate) fn plan(storage: &Arc<Storage>) -> Result<Option<(Expr, Fused, Layout, DType)>> {
    let guard = storage.pending.lock().unwrap_or_else(|p| p.into_inner());
    let Some(p) = guard.as_ref().filter(|p| p.reduce.is_none()) else {
        return Ok(None);
    };
    let mut fused = Fused::new(p, 0);
    let expr = fused.splice(p, false)?;
    Ok(Some((expr, fused, p.layout.clone(), p.expr.dtype)))
}

/// Map→reduce fusion: the expression and leaves of the pending tensor `t` for a reduction to
/// read directly, when `t` is read whole (not through a view), on the stream it was issued
/// on, and the device fuses into reductions (the caller checks the leaves' layouts). Pending
/// inputs read through another view run first. `None`: the reduction reads `t` realized.
pub(crate) fn reduce_prologue(t: &Tensor) -> Result<Option<(Expr, Fused)>> {
    let device = t.device();
    if !defers(device) || !device.backend().fuses_map_into_reduce() {
        return Ok(None);
    }
    let guard = t.storage.pending.lock().unwrap_or_else(|p| p.into_inner());
    let Some(p) = guard.as_ref().filter(|p| p.reduce.is_none()) else {
        return Ok(None);
    };
    if p.layout != t.layout || !Arc::ptr_eq(&p.stream, &device.current_handle()) {
        return Ok(None);
    }
    let mut fused = Fused::new(p, 0);
    fused.keep_reductions = device.backend().fuses_prior_reduce();
    let expr = fused.splice(p, true)?;
    if fused.inputs.is_empty() || fused.inputs.len() > MAX_INPUTS || expr.reads_linear_index() {
        return Ok(None);
    }
    Ok(Some((expr, fused)))
}

/// `expr` with input `k` renamed `to[k]`, for `dtypes[k]`.
pub(crate) fn renumber_inputs(expr: &Expr, to: &[usize], dtypes: &[DType]) -> Expr {
    // Leaves are copied at every read (no use is the last: a copy of a leaf is cheap).
    let mut inputs: Vec<(Expr, usize)> = to
        .iter()
        .zip(dtypes)
        .map(|(&k, &d)| (Expr::input(k, d), usize::MAX))
        .collect();
    substitute(expr, &mut inputs, 0)
}

/// True when only pending trees hold `storage` (nobody can read it but through them): a flush
/// leaves it to the trees, which splice it in, instead of writing it to memory.
pub(crate) fn held_only_by_trees(storage: &Arc<Storage>, extra: usize) -> bool {
    let by_trees: usize = storage
        .live_readers()
        .iter()
        .map(|r| {
            r.pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .map_or(0, |p| {
                    p.inputs
                        .iter()
                        .filter(|t| Arc::ptr_eq(&t.storage, storage))
                        .count()
                })
        })
        .sum();
    Arc::strong_count(storage) == by_trees + extra
}

/// Runs a pending storage's work (its tree fused into one kernel) on the stream it was issued
/// on, for a read of this one tensor. Intermediates still pending stay pending: in a
/// one-statement chain (`(&a * &b)?.add(&c)?.to_vec()`) the temporaries are alive while the
/// chain runs, indistinguishable from tensors the user keeps, and storing them would add a
/// write each; they are recomputed here in registers, and run again only if read later.
/// Does nothing once it has run.
pub(crate) fn realize(storage: &Arc<Storage>) -> Result<()> {
    run(storage, 0)
}

/// [`realize`] for a flush (statements are complete, so what is held is kept): the kernel
/// also stores every pending intermediate someone else still holds (the user, or a tree
/// outside it), as far as one kernel may bind outputs, so nothing is computed twice.
pub(crate) fn realize_storing_held(storage: &Arc<Storage>) -> Result<()> {
    run(storage, room(&storage.device))
}

/// Runs a pending storage's tree as one kernel that may store up to `room` held
/// intermediates as well.
fn run(storage: &Arc<Storage>, room: usize) -> Result<()> {
    let mut guard = storage.pending.lock().unwrap_or_else(|p| p.into_inner());
    let Some(p) = guard.as_ref() else {
        return Ok(());
    };
    let device = &storage.device;
    if let Some(d) = &p.reduce {
        // A deferred reduction read on its own: its plain kernel.
        storage.set_buffer(device.allocate_buffer(storage.bytes, p.stream.id)?);
        let out = Tensor {
            storage: storage.clone(),
            layout: p.layout.clone(),
            dtype: p.expr.dtype,
        };
        let kernel = Kernel::Reduce {
            op: d.op,
            reduced_axes: d.reduced_axes,
            acc: p.expr.dtype,
            map: None,
            prior: None,
        };
        let ran = launch_on(kernel, &out, &[], &[&d.source], vec![], &p.stream, true);
        if let Err(e) = &ran {
            let _ = storage.failed.set(e.to_string());
        }
        *guard = None;
        return ran;
    }
    let mut fused = Fused::new(p, room);
    let expr = fused.splice(p, true)?;
    fused.fit_outputs();
    let buffer = device.allocate_buffer(storage.bytes, p.stream.id)?;
    let mut also_buffers = Vec::with_capacity(fused.also.len());
    for (t, _) in &fused.also {
        also_buffers.push(device.allocate_buffer(t.storage.bytes, p.stream.id)?);
    }
    storage.set_buffer(buffer);
    let out = Tensor {
        storage: storage.clone(),
        layout: p.layout.clone(),
        dtype: p.expr.dtype,
    };
    let ran = Ran {
        expr: expr.clone(),
        inputs: fused
            .inputs
            .iter()
            .map(|t| (t.layout.clone(), t.dtype))
            .collect(),
        output: (p.layout.clone(), p.expr.dtype),
        also: fused
            .also
            .iter()
            .map(|(t, e)| (e.clone(), t.layout.clone(), t.dtype))
            .collect(),
        scalars: fused.scalars.len(),
        ops: std::mem::take(&mut fused.ops),
        sources: std::mem::take(&mut fused.sources),
    };
    // The stored intermediates have their buffers before the launch (it orders their writes
    // like any output's); their own trees are no longer needed.
    for ((t, _), b) in fused.also.iter().zip(also_buffers) {
        t.storage.set_buffer(b);
        let _ = t.storage.ran.set(Box::new(ran.clone()));
        *t.storage.pending.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
    let _ = storage.ran.set(Box::new(ran));
    let inputs: Vec<&Tensor> = fused.inputs.iter().collect();
    let extra: Vec<&Tensor> = fused.also.iter().map(|(t, _)| t).collect();
    let also: Vec<Expr> = fused.also.iter().map(|(_, e)| e.clone()).collect();
    let stream = p.stream.clone();
    let ran = launch_on(
        Kernel::Map { expr, also },
        &out,
        &extra,
        &inputs,
        fused.scalars,
        &stream,
        true,
    );
    if let Err(e) = &ran {
        let _ = storage.failed.set(e.to_string());
        for t in &extra {
            let _ = t.storage.failed.set(e.to_string());
        }
    }
    // The tree (and every intermediate only it held) is released here.
    *guard = None;
    ran
}

impl Tensor {
    /// True while this tensor's value is deferred work that has not run (lazy fusion).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let a = Tensor::ones([3], DType::F32, &dev)?;
    /// assert!(!a.is_pending()); // creation runs at once
    /// let b = a.exp()?;
    /// assert_eq!(b.is_pending(), dev.fusion());
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn is_pending(&self) -> bool {
        self.storage.is_pending()
    }

    /// Runs this tensor's deferred work now (one kernel for the whole pending tree behind
    /// it); does nothing for a tensor that has run. Like every launch it is asynchronous.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let b = Tensor::ones([3], DType::F32, &dev)?.mul(3.0)?;
    /// b.realize()?;
    /// assert!(!b.is_pending());
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn realize(&self) -> Result<()> {
        self.storage.buffer().map(|_| ())
    }
}
