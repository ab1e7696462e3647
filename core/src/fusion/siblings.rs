//! Sibling outputs: at a flush, a pending tree over the same elements as the tree being run,
//! that reads one of its tensors or splices in one of its pending intermediates, runs in the
//! same kernel as a further output. The backward of `relu(a*b + c)` leaves three gradients
//! that all read `relu'(a*b + c)`: a kernel per gradient reads `a`, `b` and `c` (or the stored
//! intermediate) again, one kernel for the three reads them once (6 passes over memory
//! instead of 8).
//!
//! A sibling must splice whole (every pending input read element for element, as a tree),
//! read no position and draw no random numbers (a map's draws and position reads are all in
//! its first tree: [`Kernel::Map`](crate::ir::Kernel::Map)), and no root of the kernel may be
//! inside another's tree: splicing locks each tree it enters, and the kernel's roots are
//! locked first.

use super::splice::{address, held_only_by_trees, spliceable, MAX_NODES};
use crate::device::StreamHandle;
use crate::tensor::{Pending, Storage, Tree};
use std::sync::Arc;

/// The pending trees `tree` (the work of the pending storage at `me`, run at a flush with
/// `room` further outputs) takes as siblings: newest readers first, at most `room`, within
/// [`MAX_NODES`] together. None where the tree reads a pending input another way (a deferred
/// reduction, which may take the tree as its epilogue, or another view): that runs first.
pub(super) fn siblings(
    me: &Arc<Storage>,
    p: &Pending,
    tree: &Tree,
    room: usize,
) -> Vec<Arc<Storage>> {
    if room == 0 {
        return Vec::new();
    }
    let Some((mine, leaves)) = closure(tree, &p.stream, &[address(me)], false) else {
        return Vec::new();
    };
    let mut nodes = tree.nodes;
    let mut roots = vec![address(me)];
    let mut looked = roots.clone();
    let mut chosen: Vec<(Arc<Storage>, Storages)> = Vec::new();
    for shared in mine.iter().chain(&leaves) {
        for r in shared.live_readers().into_iter().rev() {
            let a = address(&r);
            if chosen.len() == room || looked.contains(&a) {
                continue;
            }
            looked.push(a);
            let inside = |c: &[Arc<Storage>]| c.iter().any(|s| Arc::ptr_eq(s, &r));
            // An intermediate of a root is stored by the splice, not as a sibling; one the tree
            // being run reads is its input (and its lock, which the count of who holds `r`
            // would take, is held here).
            if inside(&mine)
                || chosen.iter().any(|(_, c)| inside(c))
                || r.live_readers().iter().any(|x| Arc::ptr_eq(x, me))
                || held_only_by_trees(&r, 1)
            {
                continue;
            }
            let guard = r.pending();
            let Some(t) = guard
                .as_ref()
                .filter(|c| alike(c, p))
                .and_then(Pending::tree)
            else {
                continue;
            };
            if nodes + t.nodes > MAX_NODES {
                continue;
            }
            if t.expr.reads_linear_index() {
                continue;
            }
            let Some((its, _)) = closure(t, &p.stream, &roots, true) else {
                continue;
            };
            nodes += t.nodes;
            drop(guard);
            roots.push(a);
            chosen.push((r, its));
        }
    }
    // (The closures' references go here: the splice counts who holds an intermediate.)
    chosen.into_iter().map(|(r, _)| r).collect()
}

/// True when the pending work `c` writes the elements `p` does, on its stream.
pub(super) fn alike(c: &Pending, p: &Pending) -> bool {
    c.layout == p.layout && Arc::ptr_eq(&c.stream, &p.stream)
}

/// Storages a walk found.
type Storages = Vec<Arc<Storage>>;

/// The pending storages `tree` splices in (every pending input read element for element, and
/// theirs, recursively), and the other storages they read; `None` when it reads a pending
/// storage any other way, or one at an address in `roots`, or (`positionless`) a tree that
/// reads the position or draws.
fn closure(
    tree: &Tree,
    stream: &Arc<StreamHandle>,
    roots: &[usize],
    positionless: bool,
) -> Option<(Storages, Storages)> {
    let mut found = Storages::new();
    let mut leaves = Storages::new();
    let mut next = 0;
    let mut visit = |t: &Tree, found: &mut Storages| -> bool {
        for input in &t.inputs {
            if !input.storage.is_pending() {
                if !leaves.iter().any(|s| Arc::ptr_eq(s, &input.storage)) {
                    leaves.push(input.storage.clone());
                }
                continue;
            }
            if roots.contains(&address(&input.storage)) {
                return false;
            }
            let guard = input.storage.pending();
            if guard.is_none() {
                continue; // (it ran meanwhile: a leaf)
            }
            if spliceable(input, &guard, stream).is_none() {
                return false;
            }
            if !found.iter().any(|s| Arc::ptr_eq(s, &input.storage)) {
                found.push(input.storage.clone());
            }
        }
        true
    };
    if !visit(tree, &mut found) {
        return None;
    }
    while next < found.len() {
        let s = found[next].clone();
        next += 1;
        let guard = s.pending();
        if let Some(t) = guard.as_ref().and_then(Pending::tree) {
            if (positionless && t.expr.reads_linear_index()) || !visit(t, &mut found) {
                return None;
            }
        }
    }
    Some((found, leaves))
}
