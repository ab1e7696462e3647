//! Running pending work: one tensor's tree as one kernel when it is read ([`realize`]), or
//! every pending tree of a device at a synchronization point ([`flush`]), where each kernel
//! also stores the intermediates someone still holds.

use super::splice::{held_only_by_trees, Fused};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::ir::{Expr, Kernel, ReduceOp};
use crate::tensor::{launch_on, Pending, PendingWork, Storage, Tensor, Write};
use std::any::Any;
use std::sync::{Arc, Weak};

/// Runs a pending storage's work (its tree fused into one kernel) on the stream it was issued
/// on, for a read of this one tensor. Intermediates still pending stay pending: in a
/// one-statement chain (`(&a * &b)?.add(&c)?.to_vec()`) the temporaries are alive while the
/// chain runs, indistinguishable from tensors the user keeps, and storing them would add a
/// write each; they are recomputed here in registers, and run again only if read later.
/// Does nothing once it has run.
pub(crate) fn realize(storage: &Arc<Storage>) -> Result<()> {
    run(storage, 0)
}

impl Device {
    /// Runs every pending (deferred) op of this device, newest first: each tree runs as one
    /// kernel that also stores the pending intermediates someone still holds (multi-output
    /// fusion), so a held intermediate is computed once, by the kernel of the last tree that
    /// reads it; one that only other pending trees hold is spliced into their kernels (never
    /// written). Asynchronous like any launch. What did not run after an error stays pending
    /// for the next flush.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let t = Tensor::ones([2], DType::F32, &dev)?.neg()?;
    /// dev.flush()?;
    /// assert!(!t.is_pending());
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn flush(&self) -> Result<()> {
        flush(self)
    }
}

impl Storage {
    /// Runs this storage's pending work for a read of this one tensor ([`realize`]).
    pub(crate) fn run_pending_work(self: &Arc<Storage>) -> Result<()> {
        realize(self)
    }
}

/// Notes the new pending `storage` in its device's registry, for the flush.
pub(super) fn register(device: &Device, storage: &Arc<Storage>) {
    let mut pending = device.pending_registry();
    if pending.len() >= 64 && pending.len().is_power_of_two() {
        // A dropped storage is known from its count alone (no upgrade, no lock).
        pending.retain(|w| w.strong_count() > 0 && storage_of(w).is_some_and(|s| s.is_pending()));
    }
    let weak: Weak<dyn Any + Send + Sync> = Arc::downgrade(storage) as _;
    pending.push(weak);
}

/// The storage behind a registry entry, while it lives.
fn storage_of(weak: &Weak<dyn Any + Send + Sync>) -> Option<Arc<Storage>> {
    weak.upgrade()?.downcast::<Storage>().ok()
}

/// [`Device::flush`].
fn flush(device: &Device) -> Result<()> {
    let mut pending = std::mem::take(&mut *device.pending_registry());
    pending.reverse();
    let max_stored = device.backend().target().max_map_outputs.saturating_sub(1);
    for (k, weak) in pending.iter().enumerate() {
        // One strong reference at a time: holding them all would make every intermediate
        // look held by someone.
        let Some(storage) = storage_of(weak) else {
            continue;
        };
        if !storage.is_pending() || held_only_by_trees(&storage, 1) {
            continue;
        }
        // A deferred reduction of a tree this flush writes anyway runs in the tree's kernel.
        let ran = match tree_stored_with(&storage) {
            Some(tree) => run(&tree, max_stored),
            None => Ok(()),
        };
        if let Err(e) = ran.and_then(|_| run(&storage, max_stored)) {
            // Back in the registry, oldest first, before any registered since.
            let left = pending[k..].iter().rev().cloned();
            device.pending_registry().splice(0..0, left);
            return Err(e);
        }
    }
    Ok(())
}

/// The pending tree that the deferred reduction `storage` holds reads whole, where the
/// backend stores a reduction's map and someone besides pending trees and the reduction holds
/// the tree (a flush writes it): run first, its kernel takes the reduction in
/// ([`run_with_reduction`]).
fn tree_stored_with(storage: &Arc<Storage>) -> Option<Arc<Storage>> {
    if !storage.device.backend().target().stores_reduce_map {
        return None;
    }
    let tree = {
        let guard = storage.pending();
        let PendingWork::Reduce(d) = &guard.as_ref()?.work else {
            return None;
        };
        let reads_whole = d
            .source
            .storage
            .pending()
            .as_ref()
            .is_some_and(|p| p.tree().is_some() && p.layout == d.source.layout);
        if !reads_whole {
            return None;
        }
        d.source.storage.clone()
    };
    // (The reduction's reference and this one.)
    (!held_only_by_trees(&tree, 2)).then_some(tree)
}

/// Runs a pending storage's work as one kernel that may store up to `max_stored` held
/// intermediates as well.
fn run(storage: &Arc<Storage>, max_stored: usize) -> Result<()> {
    let mut guard = storage.pending();
    let Some(p) = guard.as_ref() else {
        return Ok(());
    };
    let device = &storage.device;
    let tree = match &p.work {
        PendingWork::Tree(tree) => tree,
        PendingWork::Reduce(_) => {
            // A deferred reduction read on its own: its kernel (with its prologue, if any).
            let ran = run_deferred_reduce(storage, p, None).map(|_| ());
            // (Out of memory before the launch leaves the work pending: a later read tries
            // again.)
            if storage.buffer_if_realized().is_some() {
                *guard = None;
            }
            return ran;
        }
    };
    let target = device.backend().target();
    // A deferred reduction of this tree takes it in: one kernel reduces it and stores it.
    if target.stores_reduce_map {
        if let Some(ran) = run_with_reduction(storage, p)? {
            *guard = None;
            return ran;
        }
    }
    // Trees over the same elements that share an input or intermediate with this one run in
    // its kernel too (locked from here to their splice, so nothing else runs them meanwhile;
    // one that ran since `siblings` looked, or whose lock is busy now, is left out).
    let siblings = super::siblings::siblings(storage, p, tree, max_stored);
    let sibling_work: Vec<_> = siblings
        .iter()
        .filter_map(|s| Some((s, s.try_pending()?)))
        .filter(|(_, g)| g.as_ref().is_some_and(|c| c.tree().is_some()))
        .collect();
    let mut roots = vec![tree];
    roots.extend(sibling_work.iter().filter_map(|(_, g)| g.as_ref()?.tree()));
    let mut fused = Fused::with_roots(&roots, &p.stream, max_stored);
    // Deferred reductions among the leaves stay pending: one may take this tree as its
    // epilogue.
    fused.keep_reductions = target.fuses_row_epilogue;
    let expr = fused.splice(p, true)?;
    fused.fit_outputs(target);
    if target.fuses_row_epilogue && fused.also.is_empty() && sibling_work.is_empty() {
        if let Some(ran) = run_as_epilogue(storage, p, &expr, &mut fused)? {
            *guard = None;
            return ran;
        }
    }
    for (s, g) in &sibling_work {
        let Some(sp) = g.as_ref() else {
            continue;
        };
        if fused.also.len() >= max_stored {
            break;
        }
        // A sibling whose outputs (its own held intermediates among them) or new inputs do
        // not fit is undone, and stays pending.
        let mark = fused.mark();
        let e = fused.splice(sp, true)?;
        let t = Tensor {
            storage: (*s).clone(),
            layout: sp.layout.clone(),
            dtype: sp.dtype,
            autograd: None,
        };
        fused.also.push((t, e));
        if !fused.fits(target) {
            fused.rollback(mark);
        }
    }
    drop(sibling_work);
    // A deferred reduction of a tree among the leaves runs now, before the leaves it takes
    // in as a prologue and before this kernel stores a tree it reads (an intermediate someone
    // holds): it computes that tree itself.
    for t in &fused.inputs {
        let reduction =
            t.storage.pending().as_ref().is_some_and(
                |c| matches!(&c.work, PendingWork::Reduce(d) if d.source.is_pending()),
            );
        if reduction {
            t.realize()?;
        }
    }
    // Out of memory here leaves the work pending: a later read tries again.
    let allocate = |bytes| {
        device
            .allocate_buffer(bytes, p.stream.id)
            .map_err(|e| deferred(e, p))
    };
    let buffer = allocate(storage.bytes)?;
    let mut also_buffers = Vec::with_capacity(fused.also.len());
    for (t, _) in &fused.also {
        also_buffers.push(allocate(t.storage.bytes)?);
    }
    storage.set_buffer(buffer);
    let out = Tensor {
        storage: storage.clone(),
        layout: p.layout.clone(),
        dtype: p.dtype,
        autograd: None,
    };
    // The stored intermediates have their buffers before the launch (it orders their writes
    // like any output's); their own trees are no longer needed. One that another thread ran
    // meanwhile is left out: this kernel would write its values over whatever came after.
    let mut stored = Vec::with_capacity(fused.also.len());
    for ((t, e), b) in std::mem::take(&mut fused.also)
        .into_iter()
        .zip(also_buffers)
    {
        let mut pending = t.storage.pending();
        if pending.is_none() {
            continue;
        }
        t.storage.set_buffer(b);
        *pending = None;
        drop(pending);
        stored.push((t, e));
    }
    fused.also = stored;
    let record = fused.record(&expr, (p.layout.clone(), p.dtype));
    for (t, _) in &fused.also {
        let _ = t.storage.ran.set(Box::new(record.clone()));
    }
    let _ = storage.ran.set(Box::new(record));
    let id = kernel_id();
    let stored = fused.also.iter().map(|(t, _)| &t.storage);
    mark_computed(id, std::iter::once(storage).chain(stored), &fused.computed);
    let inputs: Vec<&Tensor> = fused.inputs.iter().collect();
    let also_outputs: Vec<&Tensor> = fused.also.iter().map(|(t, _)| t).collect();
    let also: Vec<Expr> = fused.also.iter().map(|(_, e)| e.clone()).collect();
    let stream = p.stream.clone();
    let ran = launch_on(
        Kernel::Map { expr, also },
        &out,
        &also_outputs,
        &inputs,
        fused.scalars,
        &stream,
        Write::Fresh,
    );
    let ran = ran.map_err(|e| deferred(e, p));
    storage.filled(&ran);
    for t in &also_outputs {
        t.storage.filled(&ran);
    }
    // The tree (and every intermediate only it held) is released here.
    *guard = None;
    ran
}

/// Runs the deferred reduction `storage` holds (`p`, its pending work, whose lock the caller
/// holds), with `epilogue`'s work in its kernel where it fits: true when it did.
fn run_deferred_reduce(
    storage: &Arc<Storage>,
    p: &Pending,
    epilogue: Option<&crate::fusion::reduce::EpilogueRequest>,
) -> Result<bool> {
    let PendingWork::Reduce(d) = &p.work else {
        return Err(Error::Invalid(
            "internal error: a deferred reduction was expected".into(),
        ));
    };
    let buffer = storage.device.allocate_buffer(storage.bytes, p.stream.id);
    storage.set_buffer(buffer.map_err(|e| deferred(e, p))?);
    let out = Tensor {
        storage: storage.clone(),
        layout: p.layout.clone(),
        dtype: p.dtype,
        autograd: None,
    };
    let how = (d.op, d.reduced_axes, d.acc);
    let ran = crate::ops::reduce::launch_reduce(
        &d.source,
        how,
        &d.order,
        &out,
        &p.stream,
        Write::Fresh,
        epilogue,
    )
    .map_err(|e| deferred(e, p));
    storage.filled(&ran.as_ref().map(|_| ()).map_err(Clone::clone));
    ran
}

/// Runs the tree `p` (held by `storage`, spliced into `expr` over `fused`'s leaves) as the
/// epilogue of a deferred reduction of a tree among its leaves, whose result it reads one
/// value per row (`e / e.sum(-1, true)`): `None` when no such reduction takes it (the tree
/// then runs as a map), else the launch's result.
fn run_as_epilogue(
    storage: &Arc<Storage>,
    p: &Pending,
    expr: &Expr,
    fused: &mut Fused,
) -> Result<Option<Result<()>>> {
    for k in 0..fused.inputs.len() {
        if !fused.inputs[k].storage.is_pending() {
            continue;
        }
        let leaf = fused.inputs[k].clone();
        let of_tree = |lp: &Pending| {
            matches!(&lp.work, PendingWork::Reduce(d) if d.source.is_pending() && in_order(&d.order))
                && Arc::ptr_eq(&lp.stream, &p.stream)
        };
        // A reduction that another pending leaf reads (a layer norm's mean, which its
        // variance centres by) runs first, or as that one's prologue: it takes no work here
        // (its lock is held while the kernel's pending inputs run). Walked before the lock
        // is taken: a walk holding it could wait on a thread that waits on it.
        let candidate = leaf.storage.pending().as_ref().is_some_and(of_tree);
        if !candidate || crate::fusion::reduce::pending_reader(&fused.inputs, &leaf) {
            continue;
        }
        let mut guard = leaf.storage.pending();
        let Some(lp) = guard.as_ref().filter(|lp| of_tree(lp)) else {
            continue;
        };
        // (Its buffer is allocated where the reduction takes it: `launch_reduce`.)
        let req = crate::fusion::reduce::EpilogueRequest {
            expr: expr.clone(),
            leaves: fused.inputs.clone(),
            scalars: fused.scalars.clone(),
            result: k,
            out: Tensor {
                storage: storage.clone(),
                layout: p.layout.clone(),
                dtype: p.dtype,
                autograd: None,
            },
        };
        let ran = run_deferred_reduce(&leaf.storage, lp, Some(&req));
        if leaf.storage.buffer_if_realized().is_some() {
            *guard = None;
        }
        return match ran {
            Ok(true) => {
                let record = fused.record(expr, (p.layout.clone(), p.dtype));
                let _ = storage.ran.set(Box::new(record));
                let id = kernel_id();
                mark_computed(id, [storage, &leaf.storage], &fused.computed);
                storage.filled(&Ok(()));
                Ok(Some(Ok(())))
            }
            // The reduction ran alone: the tree runs as its map.
            Ok(false) => Ok(None),
            // A launch that failed with the tree's buffer given fails the tree too; one that
            // failed before (out of memory) leaves the tree pending, for a later read.
            Err(e) if storage.buffer_if_realized().is_some() => {
                storage.filled(&Err(e.clone()));
                Ok(Some(Err(e)))
            }
            Err(e) => Err(e),
        };
    }
    Ok(None)
}

/// True when `order` reads axes in order (a reduction of the trailing axes, whose rows an
/// epilogue can run over).
pub(super) fn in_order(order: &[usize]) -> bool {
    order.iter().enumerate().all(|(k, &a)| k == a)
}

/// Runs the tree `p` (held by `storage`, whose lock the caller holds) in the kernel of a
/// deferred reduction of it, issued on its stream, that reads it whole: the reduction's map
/// is the tree and the kernel stores each element's value too (`Kernel::Reduce
/// { stores_map }`), so the tree is computed once. `None` when no such reduction takes it
/// (one whose inputs are pending, or whose tree lays out otherwise than its first leaf).
fn run_with_reduction(storage: &Arc<Storage>, p: &Pending) -> Result<Option<Result<()>>> {
    for reader in storage.live_readers() {
        // (Not waiting: a reduction being run holds its lock and waits for this tree's.)
        let Some(mut guard) = reader.try_pending() else {
            continue;
        };
        let Some(rp) = guard.as_ref() else {
            continue;
        };
        let PendingWork::Reduce(d) = &rp.work else {
            continue;
        };
        let fits = Arc::ptr_eq(&d.source.storage, storage)
            && d.source.layout == p.layout
            && Arc::ptr_eq(&rp.stream, &p.stream)
            && !d.op.returns_index();
        if !fits {
            continue;
        }
        let out = Tensor {
            storage: reader.clone(),
            layout: rp.layout.clone(),
            dtype: rp.dtype,
            autograd: None,
        };
        let in_order = matches!(d.op, ReduceOp::Sum | ReduceOp::Prod) && d.acc.is_float();
        let Some(m) = super::reduce::map_of_pending(p, &d.order, &out, in_order)? else {
            continue;
        };
        let stored = Tensor {
            storage: storage.clone(),
            layout: p.layout.permuted(&d.order)?,
            dtype: p.dtype,
            autograd: None,
        };
        let first = &m.inputs[0].layout;
        let laid_alike =
            stored.layout.shape() == first.shape() && stored.layout.strides() == first.strides();
        if !laid_alike || m.inputs.iter().any(Tensor::is_pending) {
            continue;
        }
        // Out of memory here leaves both pending: a later read tries again.
        let allocate = |bytes, q: &Pending| {
            storage
                .device
                .allocate_buffer(bytes, q.stream.id)
                .map_err(|e| deferred(e, q))
        };
        let (reduced, tree) = (allocate(reader.bytes, rp)?, allocate(storage.bytes, p)?);
        reader.set_buffer(reduced);
        storage.set_buffer(tree);
        let record = crate::tensor::RunRecord {
            expr: m.expr.clone(),
            ops: m.ops,
            call_sites: m.call_sites,
            inputs: m
                .inputs
                .iter()
                .map(|t| (t.layout.clone(), t.dtype))
                .collect(),
            output: (stored.layout.clone(), p.dtype),
            also: Vec::new(),
            scalars: m.scalars.len(),
        };
        let _ = storage.ran.set(Box::new(record));
        mark_computed(kernel_id(), [storage, &reader], &m.computed);
        let kernel = Kernel::Reduce {
            op: d.op,
            reduced_axes: d.reduced_axes,
            acc: d.acc,
            map: Some(m.expr),
            prologue: None,
            epilogue: None,
            stores_map: true,
        };
        let inputs: Vec<&Tensor> = m.inputs.iter().collect();
        let ran = launch_on(
            kernel,
            &out,
            &[&stored],
            &inputs,
            m.scalars,
            &p.stream,
            Write::Fresh,
        );
        let ran = ran.map_err(|e| deferred(e, p));
        reader.filled(&ran);
        storage.filled(&ran);
        *guard = None;
        return Ok(Some(ran));
    }
    Ok(None)
}

/// `e`, from running `p`'s deferred work, saying which work that was: the op that recorded it
/// (the last of a fused chain) and the line that called it, since the read that ran it may be
/// far from there.
fn deferred(e: Error, p: &Pending) -> Error {
    let at = crate::fusion::place(p.call_site);
    let at = if at.is_empty() {
        String::new()
    } else {
        format!(" at {at}")
    };
    e.context(&format!("the deferred `{}` (called{at})", p.op))
}

/// A new number for a fused kernel (the graph picture groups the ops one kernel computed).
pub(super) fn kernel_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Notes that the kernel `id` computed the values of `storages` and of the live ones of
/// `spliced`.
pub(super) fn mark_computed<'s>(
    id: u64,
    storages: impl IntoIterator<Item = &'s std::sync::Arc<crate::tensor::Storage>>,
    spliced: &[std::sync::Weak<crate::tensor::Storage>],
) {
    for s in storages {
        let _ = s.computed_in.set(id);
    }
    for s in spliced.iter().filter_map(std::sync::Weak::upgrade) {
        let _ = s.computed_in.set(id);
    }
}
