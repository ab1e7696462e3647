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
//! locked first. Locks taken beside the running tree (a candidate, its readers, its inputs)
//! are only tried: one another thread holds makes the candidate no sibling, since waiting
//! there, not from a tree to its inputs, could deadlock. Whether a sibling fits the kernel's
//! outputs and bindings is decided after its splice (`run`), which is undone where it does not.

use super::splice::{address, spliceable, trees_alone_hold, MAX_NODES};
use crate::device::StreamHandle;
use crate::tensor::{Pending, Storage, Tree};
use std::sync::{Arc, MutexGuard};

/// The pending trees `tree` (the work of the pending storage `me`, whose lock the caller
/// holds, run at a flush with `room` further outputs) takes as siblings: newest readers
/// first, at most `room`, within [`MAX_NODES`] together. Empty where the tree reads a pending
/// input another way (a deferred reduction, which may take the tree as its epilogue, or
/// another view): that runs first.
pub(super) fn siblings(
    me: &Arc<Storage>,
    p: &Pending,
    tree: &Tree,
    room: usize,
) -> Vec<Arc<Storage>> {
    if room == 0 {
        return Vec::new();
    }
    let Some((mine, leaves)) = closure(tree, &p.stream, &[address(me)], Walk::Inputs) else {
        return Vec::new();
    };
    let mut nodes = tree.nodes;
    let mut roots = vec![address(me)];
    let mut looked = roots.clone();
    let mut chosen: Vec<(Arc<Storage>, Storages)> = Vec::new();
    for shared in mine.iter().chain(&leaves) {
        for r in shared.live_readers().into_iter().rev() {
            if chosen.len() == room {
                return chosen.into_iter().map(|(r, _)| r).collect();
            }
            let a = address(&r);
            if looked.contains(&a) {
                continue;
            }
            looked.push(a);
            let inside = |c: &[Arc<Storage>]| c.iter().any(|s| Arc::ptr_eq(s, &r));
            // An intermediate of a root is stored by the splice, not as a sibling; one the tree
            // being run reads is its input (and counting who holds it would take `me`'s lock).
            // One only trees hold is left to them.
            if inside(&mine)
                || chosen.iter().any(|(_, c)| inside(c))
                || r.live_readers().iter().any(|x| Arc::ptr_eq(x, me))
                || trees_alone_hold(&r, 1, false) != Some(false)
            {
                continue;
            }
            let Some(guard) = r.try_pending() else {
                continue;
            };
            let Some(t) = guard
                .as_ref()
                .filter(|c| alike(c, p))
                .and_then(Pending::tree)
            else {
                continue;
            };
            if nodes + t.nodes > MAX_NODES || t.expr.reads_linear_index() {
                continue;
            }
            let Some((its, _)) = closure(t, &p.stream, &roots, Walk::Beside) else {
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
fn alike(c: &Pending, p: &Pending) -> bool {
    c.layout == p.layout && Arc::ptr_eq(&c.stream, &p.stream)
}

/// Storages a walk found.
type Storages = Vec<Arc<Storage>>;

/// `s`'s pending work locked as `walk` takes it: waiting, or only if it is free.
fn lock(s: &Storage, walk: Walk) -> Option<MutexGuard<'_, Option<Pending>>> {
    match walk {
        Walk::Inputs => Some(s.pending()),
        Walk::Beside => s.try_pending(),
    }
}

/// How [`closure`] walks a tree.
#[derive(Clone, Copy, PartialEq)]
enum Walk {
    /// The running tree's own: from a tree to its inputs, waiting for each lock.
    Inputs,
    /// A candidate sibling's: each lock only tried, and no tree that reads the position or
    /// draws.
    Beside,
}

/// The pending storages `tree` splices in (every pending input read element for element, and
/// theirs, recursively), and the other storages they read; `None` when it reads a pending
/// storage any other way, or one at an address in `roots`, or (walking beside) a tree that
/// reads the position or draws, or whose lock is busy.
fn closure(
    tree: &Tree,
    stream: &Arc<StreamHandle>,
    roots: &[usize],
    walk: Walk,
) -> Option<(Storages, Storages)> {
    let mut found = Storages::new();
    let mut leaves = Storages::new();
    let mut visit = |t: &Tree, found: &mut Storages| -> Option<()> {
        for input in &t.inputs {
            if !input.storage.is_pending() {
                if !leaves.iter().any(|s| Arc::ptr_eq(s, &input.storage)) {
                    leaves.push(input.storage.clone());
                }
                continue;
            }
            if roots.contains(&address(&input.storage)) {
                return None;
            }
            let guard = lock(&input.storage, walk)?;
            if guard.is_none() {
                continue; // (it ran meanwhile: a leaf)
            }
            spliceable(input, &guard, stream)?;
            if !found.iter().any(|s| Arc::ptr_eq(s, &input.storage)) {
                found.push(input.storage.clone());
            }
        }
        Some(())
    };
    visit(tree, &mut found)?;
    let mut next = 0;
    while next < found.len() {
        let s = found[next].clone();
        next += 1;
        let guard = lock(&s, walk)?;
        if let Some(t) = guard.as_ref().and_then(Pending::tree) {
            if walk == Walk::Beside && t.expr.reads_linear_index() {
                return None;
            }
            visit(t, &mut found)?;
        }
    }
    Some((found, leaves))
}
