//! Launch batching. On the GPU machine one `cuLaunchKernel` costs more host time than all
//! the rest of a tiny op (BENCHMARKS.md), so a map small enough for one thread block is not
//! launched alone: it is appended to its stream's pending batch, and one launch of the kernel's
//! batched form (`strata_map_batch`, see `render::map`) runs the whole batch in one block, op
//! after op with a barrier between them. Within a batch the ops therefore keep stream order,
//! even when one reads what an earlier one wrote.
//!
//! A batch holds the launches of one kernel; a launch of another kernel on that stream sends the
//! batch first. It is sent when full, and before anything else touches its stream: another
//! launch, a copy, an event, a synchronization. Until it is sent it keeps its operands' buffers
//! alive, so no buffer is freed or reused before the ops that use it have run.
//! `STRATA_CUDA_BATCH=0` turns batching off.
//!
//! A kernel's batched form is a program of its own, compiled on the compiler's background
//! thread from the kernel's second launch small enough for a batch ([`BatchedForm`]): small
//! launches run alone until it is loaded, so no call waits for it.

use crate::compile::Compiler;
use crate::driver::{check, Gpu, Raw};
use crate::function::{BatchedForm, Function};
use crate::launch::{Grid, Launch};
use crate::render::batch_capacity;
use cudarc::driver::sys;
use std::sync::{Arc, Mutex};
use strata_core::backend::KernelArgs;
use strata_core::sync::LockUnpoisoned;
use strata_core::{DeviceBuffer, Result, StreamId};

/// Launches whose work is at most this many items are batched: the batch's one block of 256
/// threads runs each in at most 8 rounds.
pub(crate) const MAX_BATCHED_WORK: usize = 2048;

/// Threads of the block that runs a batch.
const BATCH_THREADS: u32 = 256;

/// The pending batches of a device, one per stream that has one.
pub(crate) struct Batches {
    pending: Mutex<Vec<(StreamId, OpenBatch)>>,
    enabled: bool,
}

/// The launches of one kernel waiting on one stream.
struct OpenBatch {
    kernel: Raw<sys::CUfunction>,
    stream: Raw<sys::CUstream>,
    /// Argument words per launch.
    per_launch: usize,
    /// The kernel's `Batch<N, CAP>` argument: the count, then CAP slots of N words.
    words: Vec<u64>,
    /// The buffers the pending launches use, kept alive until the batch runs.
    keep: Vec<Arc<dyn DeviceBuffer>>,
}

impl OpenBatch {
    fn count(&self) -> usize {
        self.words[0] as usize
    }

    fn is_full(&self) -> bool {
        self.count() == batch_capacity(self.per_launch)
    }

    /// Launches the batch and empties it; returns the buffers it kept, to be dropped by the
    /// caller once the lock is released.
    fn send(&mut self) -> Result<Vec<Arc<dyn DeviceBuffer>>> {
        if self.count() == 0 {
            return Ok(Vec::new());
        }
        let mut params = [self.words.as_mut_ptr() as *mut std::ffi::c_void];
        // SAFETY: the kernel takes one `Batch<N, CAP>` argument, exactly these words (the
        // capacity and N are the ones its source was generated with); every pointer in them is
        // a live buffer of this context, kept alive by `keep` until this launch is enqueued
        // (its stream-ordered free comes after it).
        let launched = check(
            unsafe {
                sys::cuLaunchKernel(
                    self.kernel.0,
                    1,
                    1,
                    1,
                    BATCH_THREADS,
                    1,
                    1,
                    0,
                    self.stream.0,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel (batch)",
        );
        self.words[0] = 0;
        let kept = std::mem::take(&mut self.keep);
        launched.map(|()| kept)
    }
}

impl Batches {
    /// Batching on unless `STRATA_CUDA_BATCH=0`.
    pub(crate) fn new() -> Batches {
        Batches {
            pending: Mutex::new(Vec::new()),
            enabled: std::env::var("STRATA_CUDA_BATCH").map_or(true, |v| v != "0"),
        }
    }

    /// `f`'s batched form when a launch with `plan` is small enough for a batch.
    pub(crate) fn form<'f>(&self, f: &'f Function, plan: &Launch) -> Option<&'f Arc<BatchedForm>> {
        let small = matches!(plan.grid, Grid::Linear { work, .. } if work <= MAX_BATCHED_WORK);
        let form = f.batch.as_ref()?;
        (self.enabled && small && plan.args.0.len() == f.words).then_some(form)
    }

    /// Appends the launch of `f` with `plan` to `stream`'s batch when it is small enough and
    /// `f`'s batched form is compiled or due ([`BatchedForm::for_launch`]); `false` when it
    /// must be launched alone (after [`Batches::send`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add(
        &self,
        gpu: &Gpu,
        compiler: &Compiler,
        f: &Function,
        plan: &Launch,
        stream: StreamId,
        s: sys::CUstream,
        args: &KernelArgs,
    ) -> Result<bool> {
        let Some(form) = self.form(f, plan) else {
            return Ok(false);
        };
        let Some(kernel) = form.for_launch(compiler)? else {
            return Ok(false);
        };
        let words = &plan.args.0;
        let mut sent = Vec::new();
        let mut pending = self.pending.lock_unpoisoned();
        let slot = match pending.iter().position(|(id, _)| *id == stream) {
            Some(i) => i,
            None => {
                pending.push((stream, OpenBatch::empty(kernel, s, words.len())));
                pending.len() - 1
            }
        };
        let batch = &mut pending[slot].1;
        if batch.kernel.0 != kernel || batch.is_full() || batch.stream.0 != s {
            gpu.bind()?;
            sent = batch.send()?;
            if batch.per_launch == words.len() {
                // Reuse the argument block: slots past the count are never read.
                (batch.kernel, batch.stream) = (Raw(kernel), Raw(s));
            } else {
                *batch = OpenBatch::empty(kernel, s, words.len());
            }
        }
        let at = 1 + batch.count() * batch.per_launch;
        batch.words[at..at + words.len()].copy_from_slice(words);
        batch.words[0] += 1;
        let buffers = args.outputs.iter().chain(&args.inputs);
        batch.keep.extend(buffers.map(|op| op.buffer.clone()));
        drop(pending);
        drop(sent);
        Ok(true)
    }

    /// Launches `stream`'s pending batch, if it has one.
    pub(crate) fn send(&self, gpu: &Gpu, stream: StreamId) -> Result<()> {
        let mut pending = self.pending.lock_unpoisoned();
        let Some(batch) = pending
            .iter_mut()
            .find(|(id, p)| *id == stream && p.count() > 0)
        else {
            return Ok(());
        };
        gpu.bind()?;
        let sent = batch.1.send();
        drop(pending);
        sent.map(drop)
    }

    /// Launches every stream's pending batch (the first error is returned after all are sent).
    pub(crate) fn send_all(&self, gpu: &Gpu) -> Result<()> {
        let mut pending = self.pending.lock_unpoisoned();
        if pending.iter().all(|(_, p)| p.count() == 0) {
            return Ok(());
        }
        gpu.bind()?;
        let mut kept = Vec::new();
        let mut first_error = Ok(());
        for (_, batch) in pending.iter_mut() {
            match batch.send() {
                Ok(k) => kept.push(k),
                Err(e) => first_error = first_error.and(Err(e)),
            }
        }
        drop(pending);
        drop(kept);
        first_error
    }

    /// Forgets `stream`'s batch slot (the stream is being destroyed; send it first).
    pub(crate) fn remove(&self, stream: StreamId) {
        let mut pending = self.pending.lock_unpoisoned();
        pending.retain(|(id, _)| *id != stream);
    }
}

impl OpenBatch {
    fn empty(kernel: sys::CUfunction, s: sys::CUstream, per_launch: usize) -> OpenBatch {
        OpenBatch {
            kernel: Raw(kernel),
            stream: Raw(s),
            per_launch,
            words: vec![0; 1 + batch_capacity(per_launch) * per_launch],
            keep: Vec::new(),
        }
    }
}
