//! One fused kernel assembled from pending trees: every pending input read element for
//! element on the same stream is spliced into the tree that reads it, the others become
//! leaves; held intermediates may become further outputs. Splicing moves each child's
//! expression into its parent, so it is linear in the nodes.

use crate::device::StreamHandle;
use crate::dtype::{DType, Scalar};
use crate::error::Result;
use crate::ir::{Expr, Node, PhiloxWord};
use crate::layout::Layout;
use crate::target::Target;
use crate::tensor::{Leaves, Pending, PendingWork, RunRecord, Storage, Tensor, Tree};
use std::panic::Location;
use std::sync::{Arc, MutexGuard};

/// Adds the leaf `(a, l, d)` to `leaves` unless it is there.
pub(super) fn add_leaf(leaves: &mut Option<Leaves>, a: usize, l: &Layout, d: DType) {
    let known = |set: &Leaves| set.iter().any(|(k, m, e)| *k == a && *e == d && m == l);
    if !leaves.as_ref().is_some_and(known) {
        Arc::make_mut(leaves.get_or_insert_with(Default::default)).push((a, l.clone(), d));
    }
}

/// Adds every leaf of the spliced tree `child` to `leaves` (sharing `child`'s set when
/// `leaves` is empty).
pub(super) fn add_leaves(leaves: &mut Option<Leaves>, child: &Tree) {
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

/// The most expression nodes one fused kernel holds. Past it, the inputs are run first, so
/// every tree (and every walk of one) stays small however long a chain is.
pub const MAX_NODES: usize = 192;

/// Nodes of an expression tree (trees are bounded by `MAX_NODES`: recursion stays shallow).
pub(super) fn count_nodes(e: &Expr) -> usize {
    1 + e.children().map(count_nodes).sum::<usize>()
}

/// The address of a storage, its identity while the walk holds the tree.
pub(super) fn address(s: &Arc<Storage>) -> usize {
    Arc::as_ptr(s) as usize
}

/// `t`'s pending work when a tree issued on `stream` splices it in: a tree on the same
/// stream, read element for element (the same layout) or a constant (see [`reads_alike`]).
pub(super) fn spliceable<'g>(
    t: &Tensor,
    guard: &'g MutexGuard<'_, Option<Pending>>,
    stream: &Arc<StreamHandle>,
) -> Option<&'g Pending> {
    guard
        .as_ref()
        .filter(|c| reads_alike(c, t) && Arc::ptr_eq(&c.stream, stream) && c.tree().is_some())
}

/// `t`'s pending work when a tree issued on `stream` splices it in read through a broadcast:
/// a small tree on the same stream (one value a row, say: a layer norm's mean or
/// `rsqrt(var + eps)`) whose output `t` views broadcast to a larger shape, that reads neither
/// the position nor random draws, over inputs of its own shape. Spliced, each of its inputs
/// is read through the same broadcast and its nodes are computed again at every element: no
/// kernel of its own, the same values.
pub(super) fn broadcast_spliceable<'g>(
    t: &Tensor,
    guard: &'g MutexGuard<'_, Option<Pending>>,
    stream: &Arc<StreamHandle>,
) -> Option<&'g Pending> {
    guard.as_ref().filter(|c| {
        let Some(tree) = c.tree() else {
            return false;
        };
        c.layout != t.layout
            && Arc::ptr_eq(&c.stream, stream)
            && c.layout
                .broadcast_to(t.layout.shape())
                .is_ok_and(|b| b == t.layout)
            && count_nodes(&tree.expr) <= MAX_BROADCAST_NODES
            && !tree.expr.reads_linear_index()
            && !tree.expr.draws_random()
            && tree
                .inputs
                .iter()
                .all(|u| u.layout.shape() == c.layout.shape())
    })
}

/// The most nodes of a tree spliced through a broadcast ([`broadcast_spliceable`]), whose
/// nodes every element computes again.
const MAX_BROADCAST_NODES: usize = 8;

/// The source of `c` where `c` is a deferred reduction of a pending tree issued on `stream`.
fn of_tree_on<'c>(c: &'c Pending, stream: &Arc<StreamHandle>) -> Option<&'c Tensor> {
    match &c.work {
        PendingWork::Reduce(d) if Arc::ptr_eq(&c.stream, stream) && d.source.is_pending() => {
            Some(&d.source)
        }
        _ => None,
    }
}

/// True when reading `t` element by element reads `c`'s values as its tree computes them
/// there: `t` has `c`'s layout, or `c` is a constant (a tree of no tensor input that does not
/// read the element's position: the ones a backward pass starts from), the same through any
/// view.
pub(super) fn reads_alike(c: &Pending, t: &Tensor) -> bool {
    c.layout == t.layout
        || c.tree().is_some_and(|tree| {
            tree.inputs.is_empty() && !tree.expr.reads_linear_index() && !tree.expr.draws_random()
        })
}

/// True when the pending tree `t` reads `storage`, through the pending trees and deferred
/// reductions it reads (each storage visited once, at most `MAX_NODES` of them).
pub(super) fn reads_storage(t: &Tensor, storage: &Arc<Storage>) -> bool {
    let mut todo = vec![t.storage.clone()];
    let mut seen: Vec<usize> = Vec::new();
    while let Some(s) = todo.pop() {
        if Arc::ptr_eq(&s, storage) {
            return true;
        }
        let at = address(&s);
        if seen.contains(&at) || seen.len() > MAX_NODES {
            continue;
        }
        seen.push(at);
        let guard = s.pending();
        match guard.as_ref().map(|p| &p.work) {
            Some(PendingWork::Tree(tree)) => {
                todo.extend(tree.inputs.iter().map(|u| u.storage.clone()))
            }
            Some(PendingWork::Reduce(d)) => todo.push(d.source.storage.clone()),
            None => {}
        }
    }
    false
}

/// True when only pending trees hold `storage` (nobody can read it but through them): a flush
/// leaves it to the trees, which splice it in, instead of writing it to memory. `extra`: the
/// caller's own references.
pub(super) fn held_only_by_trees(storage: &Arc<Storage>, extra: usize) -> bool {
    trees_alone_hold(storage, extra, true) == Some(true)
}

/// [`held_only_by_trees`], taking each reader's lock only if it is free unless `wait`: `None`
/// where one is busy.
pub(super) fn trees_alone_hold(storage: &Arc<Storage>, extra: usize, wait: bool) -> Option<bool> {
    let mut by_trees = 0;
    for r in storage.live_readers() {
        let guard = if wait { r.pending() } else { r.try_pending()? };
        by_trees += guard.as_ref().and_then(Pending::tree).map_or(0, |t| {
            t.inputs
                .iter()
                .filter(|t| Arc::ptr_eq(&t.storage, storage))
                .count()
        });
    }
    Some(Arc::strong_count(storage) == by_trees + extra)
}

/// How far a [`Fused`] had grown, to undo a splice that did not fit ([`Fused::rollback`]).
pub(super) struct Mark([usize; 7]);

/// One fused kernel being assembled: its inputs (deduplicated), scalars, user ops, and the
/// pending intermediates it stores as further outputs.
#[derive(Default)]
pub(crate) struct Fused {
    pub(crate) inputs: Vec<Tensor>,
    pub(crate) scalars: Vec<Scalar>,
    /// The user ops it holds, in the order they were called.
    pub(crate) ops: Vec<&'static str>,
    /// Where each op was called.
    pub(crate) call_sites: Vec<&'static Location<'static>>,
    /// Multi-output fusion: pending intermediates someone else still holds (the user, or a
    /// tree outside this kernel), each with its expression here; the kernel stores them too.
    pub(crate) also: Vec<(Tensor, Expr)>,
    /// How many intermediates may become outputs (0: none, as for a reduction's map).
    max_stored: usize,
    /// The pending storages spliced in: this kernel computes their values (weak: a count
    /// of who holds a storage must not see this list).
    pub(crate) computed: Vec<std::sync::Weak<Storage>>,
    /// References to each spliceable pending storage from the trees of this kernel.
    internal: Vec<(usize, usize)>,
    /// Pending storages spliced so far (by address, with the layout they were read with)
    /// and their expressions: a tree read twice element for element is spliced once, so its
    /// scalars are not repeated and a shared node stays shared.
    spliced: Vec<(usize, Layout, Expr)>,
    /// Deferred reductions read as leaves stay pending (a reduction's map: its kernel may
    /// compute them, see [`row_prologue_of`](super::reduce::row_prologue_of)); otherwise
    /// they run first.
    pub(super) keep_reductions: bool,
}

impl Fused {
    /// What this kernel, computing `expr` into an output of `output`, is made of (for
    /// `explain`); takes its ops and call sites.
    pub(super) fn record(&mut self, expr: &Expr, output: (Layout, DType)) -> RunRecord {
        RunRecord {
            expr: expr.clone(),
            inputs: self
                .inputs
                .iter()
                .map(|t| (t.layout.clone(), t.dtype))
                .collect(),
            output,
            also: self
                .also
                .iter()
                .map(|(t, e)| (e.clone(), t.layout.clone(), t.dtype))
                .collect(),
            scalars: self.scalars.len(),
            ops: std::mem::take(&mut self.ops),
            call_sites: std::mem::take(&mut self.call_sites),
        }
    }

    /// A kernel for `tree` that may store up to `max_stored` intermediates as well.
    pub(super) fn new(tree: &Tree, stream: &Arc<StreamHandle>, max_stored: usize) -> Fused {
        Fused::with_roots(&[tree], stream, max_stored)
    }

    /// A kernel for the trees `roots` (the first its output, the others further outputs:
    /// [`siblings`](super::siblings)) that may store up to `max_stored` values besides the
    /// first.
    pub(super) fn with_roots(
        roots: &[&Tree],
        stream: &Arc<StreamHandle>,
        max_stored: usize,
    ) -> Fused {
        let mut fused = Fused {
            max_stored,
            ..Fused::default()
        };
        // Only a tree with spliced inputs has internal references to count.
        if roots.iter().any(|t| t.leaves.is_some()) {
            fused.count_internal(roots, stream);
        }
        fused
    }

    /// Counts, over every distinct tree spliced into the kernel of `roots`, the references
    /// each spliceable pending storage gets from them (iteratively: trees are bounded, but
    /// walks need no stack). The tree of a deferred reduction they read counts too: the
    /// kernel may be that reduction's epilogue, which computes its tree as well, and
    /// otherwise the reduction runs first, so an intermediate both read is never worth
    /// storing for it (softmax's backward: the gradient `g` in `Σ g·y` and `y·(g − Σ g·y)`;
    /// log-softmax's: `g` itself, summed, in `g − exp(y)·Σ g`).
    fn count_internal(&mut self, roots: &[&Tree], stream: &Arc<StreamHandle>) {
        let mut seen: Vec<usize> = Vec::new();
        let mut todo: Vec<Arc<Storage>> = Vec::new();
        let mut visit =
            |p: &Tree, todo: &mut Vec<Arc<Storage>>, internal: &mut Vec<(usize, usize)>| {
                for t in &p.inputs {
                    let guard = t.storage.pending();
                    // A spliceable tree, or the tree of a deferred reduction (whose own
                    // reference to it counts as well).
                    let storage = match guard.as_ref().and_then(|c| of_tree_on(c, stream)) {
                        Some(d) => &d.storage,
                        None if spliceable(t, &guard, stream).is_some() => &t.storage,
                        None => continue,
                    };
                    let a = address(storage);
                    match internal.iter_mut().find(|(k, _)| *k == a) {
                        Some((_, n)) => *n += 1,
                        None => internal.push((a, 1)),
                    }
                    if !seen.contains(&a) {
                        seen.push(a);
                        todo.push(storage.clone());
                    }
                }
            };
        for root in roots {
            visit(root, &mut todo, &mut self.internal);
        }
        while let Some(s) = todo.pop() {
            let guard = s.pending();
            if let Some(p) = guard.as_ref().and_then(Pending::tree) {
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

    /// `p`'s expression (`p` holds a tree) with every pending input read element for element
    /// (the same layout, the same stream) spliced in, recursively, and every other input made
    /// a leaf, realized first when `run`. A spliced input that someone outside this kernel
    /// still holds becomes a further output while there is room (it is computed here anyway,
    /// so storing it costs one write and saves running it again); past that it stays pending
    /// and its nodes are only recomputed here. An input only this kernel's trees hold is never
    /// written.
    pub(super) fn splice(&mut self, p: &Pending, run: bool) -> Result<Expr> {
        self.splice_as(p, None, run)
    }

    /// [`splice`](Fused::splice) of `p`'s tree read through a broadcast to `shape` where
    /// given: each of its inputs read through the same broadcast.
    fn splice_as(&mut self, p: &Pending, shape: Option<&[usize]>, run: bool) -> Result<Expr> {
        let PendingWork::Tree(tree) = &p.work else {
            return Err(crate::error::Error::Invalid(
                "internal error: only a pending tree is spliced".into(),
            ));
        };
        // Each input's expression, moved into the result at its last use (a chain's subtrees
        // are not copied again at every level: splicing is linear in the nodes).
        let mut subst = smallvec::SmallVec::<[Expr; 4]>::new();
        for t in &tree.inputs {
            let viewed;
            let t = match shape {
                Some(shape) => {
                    viewed = t.with_layout(t.layout.broadcast_to(shape)?);
                    &viewed
                }
                None => t,
            };
            if t.storage.is_pending() {
                let a = address(&t.storage);
                // (Another view of a spliced tree, a transposed one say, is no match: it is
                // realized below and read as a leaf.)
                let same = |(k, l, _): &&(usize, Layout, Expr)| *k == a && *l == t.layout;
                if let Some((_, _, e)) = self.spliced.iter().find(same) {
                    subst.push(e.clone());
                    continue;
                }
                let child = t.storage.pending();
                if let Some(c) = spliceable(t, &child, &p.stream) {
                    let same_layout = c.layout == t.layout;
                    let e = self.splice(c, run)?;
                    drop(child);
                    self.computed.push(Arc::downgrade(&t.storage));
                    let internal = self
                        .internal
                        .iter()
                        .find(|(k, _)| *k == a)
                        .map_or(usize::MAX, |&(_, n)| n);
                    // (A constant read through another view is not stored: its shape is
                    // not this kernel's.)
                    if self.also.len() < self.max_stored
                        && same_layout
                        && Arc::strong_count(&t.storage) > internal
                    {
                        self.also.push((t.clone(), e.clone()));
                    }
                    // Kept for a second reference only (a storage read once is not).
                    if internal > 1 {
                        self.spliced.push((a, t.layout.clone(), e.clone()));
                    }
                    subst.push(e);
                    continue;
                }
                if let Some(c) = broadcast_spliceable(t, &child, &p.stream) {
                    let e = self.splice_as(c, Some(t.layout.shape()), run)?;
                    drop(child);
                    self.computed.push(Arc::downgrade(&t.storage));
                    subst.push(e);
                    continue;
                }
                let reduction = child.as_ref().is_some_and(|c| c.tree().is_none());
                drop(child);
                if run && !(self.keep_reductions && reduction) {
                    t.realize()?;
                }
            }
            subst.push(Expr::input(self.leaf(t), t.dtype));
        }
        let base = self.scalars.len();
        self.scalars.extend(tree.scalars.iter().cloned());
        self.ops.push(p.op);
        self.call_sites.push(p.call_site);
        let mut uses = smallvec::SmallVec::<[usize; 4]>::from_elem(0, subst.len());
        count_uses(&tree.expr, &mut uses);
        let mut subst: smallvec::SmallVec<[(Expr, usize); 4]> =
            subst.into_iter().zip(uses).collect();
        Ok(substitute(&tree.expr, &mut subst, base))
    }

    /// Where this kernel stands now.
    pub(super) fn mark(&self) -> Mark {
        Mark([
            self.inputs.len(),
            self.scalars.len(),
            self.ops.len(),
            self.call_sites.len(),
            self.computed.len(),
            self.spliced.len(),
            self.also.len(),
        ])
    }

    /// Back to `mark`: everything spliced since is forgotten (splicing only appends, and a
    /// tree spliced and forgotten stays pending).
    pub(super) fn rollback(&mut self, mark: Mark) {
        let [inputs, scalars, ops, call_sites, computed, spliced, also] = mark.0;
        self.inputs.truncate(inputs);
        self.scalars.truncate(scalars);
        self.ops.truncate(ops);
        self.call_sites.truncate(call_sites);
        self.computed.truncate(computed);
        self.spliced.truncate(spliced);
        self.also.truncate(also);
    }

    /// True while this kernel's outputs fit `target`: at most `max_stored` besides the first,
    /// all of them and the inputs bound together.
    pub(super) fn fits(&self, target: &Target) -> bool {
        self.also.len() <= self.max_stored && target.binds(1 + self.also.len() + self.inputs.len())
    }

    /// Drops further outputs past what one kernel may bind on `target` (inputs and outputs
    /// together) and any that ran meanwhile (a view of one read elsewhere in the tree
    /// realizes it).
    pub(super) fn fit_outputs(&mut self, target: &Target) {
        self.also.retain(|(t, _)| t.storage.is_pending());
        let bindings = target
            .max_bindings
            .map_or(usize::MAX, |m| m.saturating_sub(1 + self.inputs.len()));
        self.also.truncate(bindings);
    }
}

/// Adds to `uses[k]` the reads of input `k` in `e`.
fn count_uses(e: &Expr, uses: &mut [usize]) {
    match &e.node {
        Node::Input(k) => uses[*k] += 1,
        _ => e.children().for_each(|c| count_uses(c, uses)),
    }
}

/// `e` with input `k` replaced by `inputs[k].0` and scalar indices shifted by `base`;
/// `inputs[k].1` counts the reads of input `k` still to come: the last one takes the
/// expression, the others copy it.
pub(super) fn substitute(e: &Expr, inputs: &mut [(Expr, usize)], base: usize) -> Expr {
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
        Node::Philox(w) => Node::Philox(PhiloxWord {
            key: w.key + base,
            counter: w.counter + base,
            ..*w
        }),
        _ => return e.map_children(|c| substitute(c, inputs, base)),
    };
    Expr {
        dtype: e.dtype,
        node,
    }
}

/// `expr` with input `k` renamed `to[k]`, for `dtypes[k]`.
pub(super) fn renumber_inputs(expr: &Expr, to: &[usize], dtypes: &[DType]) -> Expr {
    // Leaves are copied at every read (no use is the last: a copy of a leaf is cheap).
    let mut inputs: Vec<(Expr, usize)> = to
        .iter()
        .zip(dtypes)
        .map(|(&k, &d)| (Expr::input(k, d), usize::MAX))
        .collect();
    substitute(expr, &mut inputs, 0)
}
