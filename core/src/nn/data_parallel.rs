//! Data-parallel training over the devices of a [`Communicator`] (issue 41): the parameters
//! replicated on every device, each batch split along its first axis into one shard per
//! device, and after each device's backward pass the gradients averaged across devices, in
//! buckets (one collective per bucket, not per parameter), so every replica takes the same
//! step and the replicas stay identical. With shards of equal size and a loss that is a mean
//! over the batch, the averaged gradient is the gradient of the whole batch on one device.
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

use crate::collective::{Communicator, ReduceOp};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Gradients averaged in one collective until a bucket holds this many bytes (PyTorch's
/// DistributedDataParallel buckets 25 MiB).
const BUCKET_BYTES: usize = 25 << 20;

/// Parameters replicated on every device of a communicator, with their gradients averaged
/// across devices after each backward pass.
#[derive(Debug)]
pub struct DataParallel {
    comm: Communicator,
    replicas: Vec<Vec<Tensor>>,
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
        Ok(DataParallel { comm, replicas })
    }

    /// The parameters on device `k` (in the order given to [`new`](Self::new)): build that
    /// device's forward pass from them, and give them to that device's optimizer.
    pub fn replica(&self, k: usize) -> &[Tensor] {
        &self.replicas[k]
    }

    /// The communicator the gradients are averaged over.
    pub fn communicator(&self) -> &Communicator {
        &self.comm
    }

    /// `batch` split along its first axis into one shard per device, each moved to its
    /// device. `Err` unless the first axis splits evenly (equal shards keep the average of
    /// the shards' mean losses equal to the whole batch's).
    pub fn scatter(&self, batch: &Tensor) -> Result<Vec<Tensor>> {
        let n = self.comm.devices().len();
        let rows = batch.shape().first().copied().unwrap_or(0);
        if batch.ndim() == 0 || rows % n != 0 {
            return Err(Error::Shape(format!(
                "scatter splits the first axis into {n} equal shards: shape {:?} has none that \
                 divides",
                batch.shape()
            )));
        }
        let per = rows / n;
        self.comm
            .devices()
            .iter()
            .enumerate()
            .map(|(k, d)| batch.narrow(0, k * per, per)?.to_device(d))
            .collect()
    }

    /// Replaces every replica's gradients with their average across devices: the gradients
    /// of consecutive parameters flattened into one bucket per device (up to 25 MiB), each
    /// bucket averaged in one all-reduce, then written back. A parameter without a gradient
    /// on every device is an `Err` (a device skipped its backward pass).
    pub fn average_gradients(&self) -> Result<()> {
        let count = self.replicas[0].len();
        let mut start = 0;
        while start < count {
            // The bucket: parameters from `start` while they fit (at least one).
            let mut end = start;
            let mut bytes = 0;
            while end < count && (end == start || bytes < BUCKET_BYTES) {
                let p = &self.replicas[0][end];
                bytes += p.numel() * p.dtype().itemsize();
                end += 1;
            }
            self.average_bucket(start..end)?;
            start = end;
        }
        Ok(())
    }

    /// Averages the gradients of parameters `range` (one dtype per bucket: a bucket of mixed
    /// dtypes is split by dtype).
    fn average_bucket(&self, range: std::ops::Range<usize>) -> Result<()> {
        let first = self.replicas[0][range.start].dtype();
        if let Some(split) = range
            .clone()
            .find(|&i| self.replicas[0][i].dtype() != first)
        {
            self.average_bucket(range.start..split)?;
            return self.average_bucket(split..range.end);
        }
        let mut buckets = Vec::with_capacity(self.replicas.len());
        for (k, replica) in self.replicas.iter().enumerate() {
            let grads = replica[range.clone()]
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let g = p.grad().ok_or_else(|| {
                        Error::Invalid(format!(
                            "average_gradients: parameter {} on device {k} ({}) has no gradient: \
                             run every device's backward pass first",
                            range.start + i,
                            p.device().name()
                        ))
                    })?;
                    g.reshape([g.numel()])
                })
                .collect::<Result<Vec<_>>>()?;
            let refs: Vec<&Tensor> = grads.iter().collect();
            buckets.push(Tensor::cat(&refs, 0)?);
        }
        self.comm.all_reduce(&buckets, ReduceOp::Avg)?;
        for (replica, bucket) in self.replicas.iter().zip(&buckets) {
            let mut at = 0;
            for p in &replica[range.clone()] {
                let n = p.numel();
                let averaged = bucket.narrow(0, at, n)?.reshape(p.shape().to_vec())?;
                p.set_grad(Some(averaged))?;
                at += n;
            }
        }
        Ok(())
    }
}
