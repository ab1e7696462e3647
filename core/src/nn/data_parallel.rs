//! Data-parallel training over the devices of a [`Communicator`] (issue 41): the parameters
//! replicated on every device, each batch split along its first axis into one shard per
//! device, and the gradients averaged across devices in buckets (one collective per bucket,
//! not per parameter), each as soon as the backward passes have finished it (post-accumulate
//! hooks on the replicas' parameters), overlapped with the rest of the passes as PyTorch's
//! DistributedDataParallel does; so every replica takes the same step and the replicas stay
//! identical. With shards of equal size and a loss that is a mean over the batch, the
//! averaged gradient is the gradient of the whole batch on one device.
//!
//! ```
//! use strata_core::nn::DataParallel;
//! use strata_core::{Device, DType, Tensor};
//! # use strata_core::collective::{Collective, CollectiveEngine, Communicator, RankCall};
//! # use strata_core::Result;
//! # #[derive(Debug)] struct One;
//! # impl CollectiveEngine for One {
//! #     fn check_dtype(&self, _: DType) -> Result<()> { Ok(()) }
//! #     fn run(&self, _: Collective, _: &[RankCall], _: DType) -> Result<()> { Ok(()) }
//! # }
//! let dev = Device::cpu();
//! // A communicator over one device (a backend crate makes real ones: strata::collective).
//! let comm = Communicator::new(vec![dev.clone()], std::sync::Arc::new(One))?;
//! let w = Tensor::ones([2], DType::F32, &dev)?;
//! let dp = DataParallel::new(comm, &[w])?;
//! assert_eq!(dp.replica(0)[0].to_vec::<f32>()?, vec![1.0, 1.0]);
//! assert!(dp.replica(0)[0].requires_grad());
//! # Ok::<(), strata_core::Error>(())
//! ```

use crate::autograd::HookHandle;
use crate::collective::{Communicator, ReduceOp};
use crate::device::{Device, Stream};
use crate::error::{Error, Result};
use crate::sync::LockUnpoisoned;
use crate::tensor::Tensor;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Gradients averaged in one collective until a bucket holds this many bytes (PyTorch's
/// DistributedDataParallel buckets 25 MiB)...
const BUCKET_BYTES: usize = 25 << 20;
/// ...except the first, which closes once it holds 1 MiB, so that averaging starts early in
/// the backward pass (DistributedDataParallel's first bucket is 1 MiB).
const FIRST_BUCKET_BYTES: usize = 1 << 20;

/// Parameters replicated on every device of a communicator, with their gradients averaged
/// across devices during and after each backward pass.
#[derive(Debug)]
pub struct DataParallel {
    shared: Arc<Shared>,
    /// Each replica parameter's post-accumulate hook, removed on drop.
    hooks: Vec<HookHandle>,
}

/// What the hooks reach (weakly: a hook outliving its `DataParallel` does nothing).
#[derive(Debug)]
struct Shared {
    comm: Communicator,
    replicas: Vec<Vec<Tensor>>,
    /// Each bucket's parameters: consecutive, from the last parameter back (a backward pass
    /// reaches the last layers first), one dtype each.
    buckets: Vec<Vec<usize>>,
    /// Each parameter's bucket and place in it.
    slot_of: Vec<(usize, usize)>,
    /// Where the averaging stands in the current step. Held while a bucket is averaged, so
    /// buckets go one at a time and in order.
    state: Mutex<Progress>,
    /// False inside [`DataParallel::no_sync`]: the hooks do nothing.
    syncing: AtomicBool,
    /// A stream of each device for the averaging (DDP's communication stream): a bucket's
    /// flattening, all-reduce and write-back run beside the backward kernels still to come,
    /// ordered after the gradients' writes and before the optimizer's reads by the streams'
    /// events.
    streams: Vec<Stream>,
}

/// The current step's progress (a step ends with [`DataParallel::average_gradients`]).
#[derive(Debug)]
struct Progress {
    /// For each bucket, replica and member: how many backward passes have reported the
    /// member's gradient final.
    reports: Vec<Vec<Vec<u32>>>,
    /// For each bucket: how many times it has been averaged. Bucket `b` is averaged for the
    /// `r`-th time once every report of it has reached `r` and bucket `b − 1` has been
    /// averaged `r` times: the same order on every rank, which keeps NCCL's calls matched
    /// across processes.
    averaged: Vec<u32>,
}

impl DataParallel {
    /// Copies `params` onto every device of `comm` (replica `k` on device `k`), each copy a
    /// leaf that requires a gradient and owns its memory. The parameters may live anywhere
    /// and are not changed by training the replicas.
    pub fn new(comm: Communicator, params: &[Tensor]) -> Result<DataParallel> {
        let replicas = comm
            .devices()
            .iter()
            .map(|d| {
                params
                    .iter()
                    .map(|p| {
                        // Each replica owns its memory (the parameters' own device included).
                        let copied = if p.device() == d {
                            p.detach().copy()?
                        } else {
                            p.detach().to_device(d)?
                        };
                        copied.requires_grad_(true)
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        let buckets = buckets(params);
        let mut slot_of = vec![(0, 0); params.len()];
        for (b, members) in buckets.iter().enumerate() {
            for (at, &i) in members.iter().enumerate() {
                slot_of[i] = (b, at);
            }
        }
        let state = Progress {
            reports: buckets
                .iter()
                .map(|m| vec![vec![0; m.len()]; replicas.len()])
                .collect(),
            averaged: vec![0; buckets.len()],
        };
        let streams = comm
            .devices()
            .iter()
            .map(|d| d.new_stream())
            .collect::<Result<Vec<_>>>()?;
        let shared = Arc::new(Shared {
            streams,
            comm,
            replicas,
            buckets,
            slot_of,
            state: Mutex::new(state),
            syncing: AtomicBool::new(true),
        });
        let mut hooks = Vec::new();
        for (k, replica) in shared.replicas.iter().enumerate() {
            for (i, p) in replica.iter().enumerate() {
                let weak: Weak<Shared> = Arc::downgrade(&shared);
                hooks.push(p.register_post_accumulate_grad_hook(move |_| {
                    weak.upgrade().map_or(Ok(()), |s| s.ready(k, i))
                })?);
            }
        }
        Ok(DataParallel { shared, hooks })
    }

    /// The parameters on device `k` (in the order given to [`new`](Self::new)): build that
    /// device's forward pass from them, and give them to that device's optimizer.
    pub fn replica(&self, k: usize) -> &[Tensor] {
        &self.shared.replicas[k]
    }

    /// The communicator the gradients are averaged over.
    pub fn communicator(&self) -> &Communicator {
        &self.shared.comm
    }

    /// `batch` split along its first axis into one shard per device, each moved to its
    /// device. `Err` unless the first axis splits evenly (equal shards keep the average of
    /// the shards' mean losses equal to the whole batch's).
    pub fn scatter(&self, batch: &Tensor) -> Result<Vec<Tensor>> {
        let devices = self.shared.comm.devices();
        let n = devices.len();
        let rows = batch.shape().first().copied().unwrap_or(0);
        if batch.ndim() == 0 || rows % n != 0 {
            return Err(Error::Shape(format!(
                "scatter splits the first axis into {n} equal shards: shape {:?} has none that \
                 divides",
                batch.shape()
            )));
        }
        let per = rows / n;
        devices
            .iter()
            .enumerate()
            .map(|(k, d)| batch.narrow(0, k * per, per)?.to_device(d))
            .collect()
    }

    /// Makes every replica's gradients their average across devices and ends the step; call
    /// it after every device's backward passes, before the optimizers step. Most of the work
    /// has usually happened by then: as soon as the backward passes have finished a bucket's
    /// gradients on every replica (a bucket: consecutive parameters' gradients from the last
    /// parameter back, closed once it holds 25 MiB, the first 1 MiB), the pass that finished
    /// it flattens them into one tensor per device, averages it in one all-reduce on the
    /// averaging streams, and writes the averages back as the parameters' gradients, while
    /// the pass goes on with the layers before. This call averages whatever is left (buckets
    /// a pass did not finish, gradients set with `set_grad` after `autograd::grad`, passes run
    /// under [`no_sync`](Self::no_sync)). With several passes a step (gradient
    /// accumulation), each replica should run as many as the others; averaging after each is
    /// exact, as the average is linear. A parameter without a gradient on every device is an
    /// `Err` (a device skipped its backward pass).
    pub fn average_gradients(&self) -> Result<()> {
        let mut state = self.shared.state.lock_unpoisoned();
        let Progress { reports, averaged } = &mut *state;
        let mut result = Ok(());
        for (b, done) in averaged.iter_mut().enumerate() {
            let newest = reports[b].iter().flatten().copied().max().unwrap_or(0);
            if *done == 0 || newest > *done {
                result = self.shared.average(b);
                if result.is_err() {
                    break;
                }
            }
        }
        // The step ends, failed or not: the next pass starts counting afresh.
        reports.iter_mut().flatten().for_each(|r| r.fill(0));
        averaged.fill(0);
        result
    }

    /// Runs `f` with the averaging during backward passes off (PyTorch DDP's `no_sync`): the
    /// gradients of passes run inside accumulate on each replica, and the next averaging (a
    /// pass outside, or [`average_gradients`](Self::average_gradients)) averages the sums.
    /// It holds for every thread while `f` runs.
    ///
    /// ```
    /// # use strata_core::collective::{Collective, CollectiveEngine, Communicator, RankCall};
    /// # #[derive(Debug)] struct One;
    /// # impl CollectiveEngine for One {
    /// #     fn check_dtype(&self, _: strata_core::DType) -> strata_core::Result<()> { Ok(()) }
    /// #     fn run(&self, _: Collective, _: &[RankCall], _: strata_core::DType) -> strata_core::Result<()> { Ok(()) }
    /// # }
    /// use strata_core::{nn::DataParallel, ops::Axes, Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let comm = Communicator::new(vec![dev.clone()], std::sync::Arc::new(One))?;
    /// let dp = DataParallel::new(comm, &[Tensor::ones([2], DType::F32, &dev)?])?;
    /// let w = &dp.replica(0)[0];
    /// dp.no_sync(|| w.mul(2.0)?.sum(Axes::All, false)?.backward())?; // accumulates only
    /// w.mul(3.0)?.sum(Axes::All, false)?.backward()?; // averages the sum
    /// assert_eq!(w.grad().unwrap().to_vec::<f32>()?, vec![5.0, 5.0]);
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn no_sync<R>(&self, f: impl FnOnce() -> R) -> R {
        struct On<'a>(&'a AtomicBool);
        impl Drop for On<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        self.shared.syncing.store(false, Ordering::SeqCst);
        let _on = On(&self.shared.syncing);
        f()
    }
}

impl Drop for DataParallel {
    fn drop(&mut self) {
        for hook in self.hooks.drain(..) {
            hook.remove();
        }
    }
}

/// The parameters split into buckets: consecutive from the last one back, a new bucket at a
/// change of dtype or once the bucket holds its bytes (at least one parameter each).
fn buckets(params: &[Tensor]) -> Vec<Vec<usize>> {
    let mut buckets: Vec<Vec<usize>> = Vec::new();
    let mut bytes = 0;
    for i in (0..params.len()).rev() {
        let cap = if buckets.len() == 1 {
            FIRST_BUCKET_BYTES
        } else {
            BUCKET_BYTES
        };
        let fits = buckets
            .last()
            .is_some_and(|last| params[last[0]].dtype() == params[i].dtype() && bytes < cap);
        if !fits {
            buckets.push(Vec::new());
            bytes = 0;
        }
        bytes += params[i].numel() * params[i].dtype().itemsize();
        buckets.last_mut().expect("pushed above").push(i);
    }
    buckets
}

impl Shared {
    /// A hook's report: replica `k`'s parameter `i` has its whole gradient from one more
    /// pass. Averages every bucket that is then due, in order.
    fn ready(&self, k: usize, i: usize) -> Result<()> {
        if !self.syncing.load(Ordering::SeqCst) {
            return Ok(());
        }
        let (b, at) = self.slot_of[i];
        let mut state = self.state.lock_unpoisoned();
        state.reports[b][k][at] += 1;
        loop {
            let mut moved = false;
            for b in 0..state.averaged.len() {
                let round = state.averaged[b] + 1;
                let before_done = b == 0 || state.averaged[b - 1] >= round;
                if before_done && state.reports[b].iter().flatten().all(|&r| r >= round) {
                    self.average(b)?;
                    state.averaged[b] = round;
                    moved = true;
                }
            }
            if !moved {
                return Ok(());
            }
        }
    }

    /// Averages bucket `b`'s gradients across the replicas: flattened into one tensor per
    /// device, one all-reduce, written back; on the averaging streams (each device's current
    /// stream restored after, an error included).
    fn average(&self, b: usize) -> Result<()> {
        /// Puts each device's stream back when dropped.
        struct Restore(Vec<(Device, Stream)>);
        impl Drop for Restore {
            fn drop(&mut self) {
                for (d, s) in &self.0 {
                    // The stream was the device's current one a moment ago: it is valid.
                    let _ = d.set_stream(s);
                }
            }
        }
        let devices = self.comm.devices();
        let _restore = Restore(
            devices
                .iter()
                .map(|d| (d.clone(), d.current_stream()))
                .collect(),
        );
        for (d, s) in devices.iter().zip(&self.streams) {
            d.set_stream(s)?;
        }
        self.average_here(b)
    }

    /// [`average`](Self::average) on the current streams.
    fn average_here(&self, b: usize) -> Result<()> {
        let members = &self.buckets[b];
        let mut flat = Vec::with_capacity(self.replicas.len());
        for (k, replica) in self.replicas.iter().enumerate() {
            let grads = members
                .iter()
                .map(|&i| {
                    let p = &replica[i];
                    let g = p.grad().ok_or_else(|| {
                        Error::Invalid(format!(
                            "average_gradients: parameter {i} on device {k} ({}) has no \
                             gradient: run every device's backward pass first",
                            p.device().name()
                        ))
                    })?;
                    g.reshape([g.numel()])
                })
                .collect::<Result<Vec<_>>>()?;
            let refs: Vec<&Tensor> = grads.iter().collect();
            flat.push(Tensor::cat(&refs, 0)?);
        }
        self.comm.all_reduce(&flat, ReduceOp::Avg)?;
        for (replica, bucket) in self.replicas.iter().zip(&flat) {
            let mut at = 0;
            for &i in members {
                let p = &replica[i];
                let n = p.numel();
                let averaged = bucket.narrow(0, at, n)?.reshape(p.shape().to_vec())?;
                p.set_grad(Some(averaged))?;
                at += n;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::buckets;
    use crate::{DType, Device, Tensor};

    #[test]
    fn buckets_run_from_the_last_parameter_with_a_small_first_one() {
        let dev = Device::cpu();
        let t = |n: usize, dtype| Tensor::zeros([n], dtype, &dev).unwrap();
        let (f32, f16) = (DType::F32, DType::F16);
        // A change of dtype starts a bucket.
        let params = [
            t(10, f32),
            t(300_000, f32),
            t(10, f16),
            t(100, f16),
            t(200_000, f32),
            t(10, f32),
        ];
        assert_eq!(buckets(&params), vec![vec![5, 4], vec![3, 2], vec![1, 0]]);
        // The first bucket closes at 1 MiB, the next ones at 25 MiB.
        let params = [
            t(10, f32),
            t(7_000_000, f32),
            t(300_000, f32),
            t(300_000, f32),
        ];
        assert_eq!(buckets(&params), vec![vec![3], vec![2, 1], vec![0]]);
    }
}
