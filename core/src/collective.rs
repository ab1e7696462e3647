//! Collectives over the devices of one process (issue 41): all-reduce, broadcast, reduce,
//! all-gather and reduce-scatter, one tensor per device, as `torch.cuda.nccl` takes them.
//! Core checks the operands (one per device, in order; one shape and dtype; contiguous),
//! realizes pending work, and orders each device's part on its current stream after the last
//! writes of what it reads (and the reads of what it writes); a [`CollectiveEngine`] from a
//! backend crate (NCCL on CUDA: `strata::collective::nccl`) enqueues the calls, with no host
//! wait. Results read like any tensor: a host read waits for the stream.
//!
//! ```
//! use strata_core::collective::ReduceOp;
//! assert_eq!(ReduceOp::Avg.to_string(), "avg");
//! ```

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::fmt::Debug;
use std::sync::Arc;

/// How values from every device combine.
///
/// ```
/// assert_eq!(strata_core::collective::ReduceOp::Sum.to_string(), "sum");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum.
    Sum,
    /// The product.
    Prod,
    /// The largest value.
    Max,
    /// The smallest value.
    Min,
    /// The mean (the sum divided by the number of devices; integers truncate, as NCCL's).
    Avg,
}

impl std::fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
        };
        f.write_str(name)
    }
}

/// Which collective a group of calls runs.
///
/// ```
/// use strata_core::collective::{Collective, ReduceOp};
/// assert_eq!(Collective::AllReduce(ReduceOp::Sum).name(), "all_reduce");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective {
    /// Every device ends with the reduction of all devices' values.
    AllReduce(ReduceOp),
    /// Every device ends with device `root`'s values.
    Broadcast {
        /// The index of the device whose values are sent.
        root: usize,
    },
    /// Device `root` ends with the reduction of all devices' values.
    Reduce {
        /// The index of the device that receives.
        root: usize,
        /// How the values combine.
        op: ReduceOp,
    },
    /// Every device ends with every device's values, in device order.
    AllGather,
    /// Device `k` ends with block `k` of the reduction of all devices' values.
    ReduceScatter(ReduceOp),
}

impl Collective {
    /// The name of the collective, as the methods of [`Communicator`] are named.
    pub fn name(&self) -> &'static str {
        match self {
            Collective::AllReduce(_) => "all_reduce",
            Collective::Broadcast { .. } => "broadcast",
            Collective::Reduce { .. } => "reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter(_) => "reduce_scatter",
        }
    }
}

/// One device's part of a collective: the addresses it sends from and receives into, the
/// element count of its call (the whole buffer for all-reduce, broadcast and reduce; what one
/// device contributes for all-gather; what one device receives for reduce-scatter), and the
/// native stream it runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankCall {
    /// Address of the values sent.
    pub send: u64,
    /// Address of the values received.
    pub recv: u64,
    /// Elements per the collective's count (see above).
    pub count: usize,
    /// The device's native stream (a `CUstream`; 0 on the CPU, which has none).
    pub stream: u64,
}

/// What runs collectives for a [`Communicator`]: a backend crate's (NCCL on CUDA).
pub trait CollectiveEngine: Send + Sync + Debug {
    /// Whether the engine moves `dtype`; `Err` naming what it moves otherwise.
    fn check_dtype(&self, dtype: DType) -> Result<()>;
    /// Enqueues `collective` over the `calls` of this process's devices (in the communicator's
    /// order; a root is a rank) as one group, without waiting.
    fn run(&self, collective: Collective, calls: &[RankCall], dtype: DType) -> Result<()>;
}

/// A group of devices that run collectives together: the devices of this process, one tensor
/// per device in the group's order, each with its rank among all the group's devices (those
/// of other processes too, where each process holds its own part).
#[derive(Debug, Clone)]
pub struct Communicator {
    devices: Vec<Device>,
    ranks: Vec<usize>,
    world: usize,
    engine: Arc<dyn CollectiveEngine>,
}

impl Communicator {
    /// A communicator over `devices`, all of this process (ranks 0, 1, … in order), whose
    /// collectives `engine` runs (a backend crate makes both: `strata::collective::nccl`).
    /// `Err` for no device or a device twice.
    pub fn new(devices: Vec<Device>, engine: Arc<dyn CollectiveEngine>) -> Result<Communicator> {
        let n = devices.len();
        Communicator::with_ranks(devices, (0..n).collect(), n, engine)
    }

    /// This process's part of a communicator of `world` devices: `devices` with their
    /// `ranks` (the others are other processes'; `strata::collective::nccl_rank`). `Err` for
    /// no device, a device or rank twice, or a rank not below `world`.
    pub fn with_ranks(
        devices: Vec<Device>,
        ranks: Vec<usize>,
        world: usize,
        engine: Arc<dyn CollectiveEngine>,
    ) -> Result<Communicator> {
        if devices.is_empty() || devices.len() != ranks.len() {
            return Err(Error::Invalid(format!(
                "a communicator needs at least one device and one rank per device: {} devices, \
                 {} ranks",
                devices.len(),
                ranks.len()
            )));
        }
        for (k, d) in devices.iter().enumerate() {
            if devices[..k].contains(d) || ranks[..k].contains(&ranks[k]) || ranks[k] >= world {
                return Err(Error::Invalid(format!(
                    "a communicator of {world} takes each device and rank once, ranks below \
                     {world}: {} has rank {}, ranks {ranks:?}",
                    d.name(),
                    ranks[k]
                )));
            }
        }
        Ok(Communicator {
            devices,
            ranks,
            world,
            engine,
        })
    }

    /// This process's devices, in the order collectives take their tensors.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// The rank of each of [`devices`](Self::devices) in the whole group.
    pub fn ranks(&self) -> &[usize] {
        &self.ranks
    }

    /// How many devices the whole group has (of all its processes).
    pub fn world(&self) -> usize {
        self.world
    }

    /// Replaces every tensor's values (in place) with the reduction `op` of all of them.
    pub fn all_reduce(&self, tensors: &[Tensor], op: ReduceOp) -> Result<()> {
        self.check(tensors, "all_reduce")?;
        let n = tensors[0].numel();
        self.launch(Collective::AllReduce(op), tensors, tensors, n)
    }

    /// Copies the tensor of the device of rank `root` into every other device's tensor.
    pub fn broadcast(&self, tensors: &[Tensor], root: usize) -> Result<()> {
        self.check(tensors, "broadcast")?;
        self.check_root(root, "broadcast")?;
        let n = tensors[0].numel();
        self.launch(Collective::Broadcast { root }, tensors, tensors, n)
    }

    /// Replaces the tensor of the device of rank `root` with the reduction `op` of all the
    /// tensors; the others keep their values.
    pub fn reduce(&self, tensors: &[Tensor], root: usize, op: ReduceOp) -> Result<()> {
        self.check(tensors, "reduce")?;
        self.check_root(root, "reduce")?;
        let n = tensors[0].numel();
        self.launch(Collective::Reduce { root, op }, tensors, tensors, n)
    }

    /// Every device's tensor stacked along a new first axis, in rank order, on each device:
    /// shape `[world, ...shape]`.
    pub fn all_gather(&self, tensors: &[Tensor]) -> Result<Vec<Tensor>> {
        self.check(tensors, "all_gather")?;
        let mut shape = vec![self.world];
        shape.extend_from_slice(tensors[0].shape());
        let outs = self.outputs(&shape, tensors[0].dtype())?;
        let n = tensors[0].numel();
        self.launch(Collective::AllGather, tensors, &outs, n)?;
        Ok(outs)
    }

    /// The reduction `op` of all the tensors, split along the first axis into one block per
    /// device: the device of rank `k` gets block `k`, of shape `[len / world, ...rest]`. The
    /// first axis must divide evenly.
    pub fn reduce_scatter(&self, tensors: &[Tensor], op: ReduceOp) -> Result<Vec<Tensor>> {
        self.check(tensors, "reduce_scatter")?;
        let world = self.world;
        let shape = tensors[0].shape();
        let Some((&first, rest)) = shape.split_first().filter(|(&f, _)| f % world == 0) else {
            return Err(Error::Shape(format!(
                "reduce_scatter splits the first axis into {world} equal blocks: shape {shape:?} \
                 has none that divides"
            )));
        };
        let mut block = vec![first / world];
        block.extend_from_slice(rest);
        let outs = self.outputs(&block, tensors[0].dtype())?;
        let n = outs[0].numel();
        self.launch(Collective::ReduceScatter(op), tensors, &outs, n)?;
        Ok(outs)
    }

    /// An `Err` unless `tensors` holds one contiguous tensor per device, in order, all of one
    /// shape and a dtype the engine moves.
    fn check(&self, tensors: &[Tensor], what: &str) -> Result<()> {
        if tensors.len() != self.devices.len() {
            return Err(Error::Invalid(format!(
                "{what}: one tensor per device of the communicator ({}), got {}",
                self.devices.len(),
                tensors.len()
            )));
        }
        let (shape, dtype) = (tensors[0].shape(), tensors[0].dtype());
        self.engine.check_dtype(dtype)?;
        for (k, (t, d)) in tensors.iter().zip(&self.devices).enumerate() {
            if t.device() != d {
                return Err(Error::DeviceMismatch(format!(
                    "{what}: tensor {k} is on {}, but the communicator's device {k} is {}",
                    t.device().name(),
                    d.name()
                )));
            }
            if t.shape() != shape || t.dtype() != dtype {
                return Err(Error::Shape(format!(
                    "{what}: every tensor has one shape and dtype: tensor 0 is {shape:?} {dtype}, \
                     tensor {k} {:?} {}",
                    t.shape(),
                    t.dtype()
                )));
            }
            if !t.is_contiguous() {
                return Err(Error::Invalid(format!(
                    "{what}: tensor {k} (shape {:?}, strides {:?}) is not contiguous: call \
                     contiguous() first",
                    t.shape(),
                    t.strides()
                )));
            }
        }
        Ok(())
    }

    fn check_root(&self, root: usize, what: &str) -> Result<()> {
        if root >= self.world {
            return Err(Error::Invalid(format!(
                "{what}: root {root} is not a rank of this communicator of {}",
                self.world
            )));
        }
        Ok(())
    }

    /// A new tensor of `shape` on each device.
    fn outputs(&self, shape: &[usize], dtype: DType) -> Result<Vec<Tensor>> {
        self.devices
            .iter()
            .map(|d| Tensor::empty(shape, dtype, d))
            .collect()
    }

    /// Orders each device's part on its current stream, then runs the group: each stream
    /// waits for the last writes of what it reads and writes (and for the reads of what it
    /// writes), and afterwards the outputs are written there.
    fn launch(
        &self,
        collective: Collective,
        inputs: &[Tensor],
        outputs: &[Tensor],
        count: usize,
    ) -> Result<()> {
        let mut calls = Vec::with_capacity(inputs.len());
        for (input, output) in inputs.iter().zip(outputs) {
            let device = input.device();
            // Pending work runs first (on its own stream), then the ordering sees its write.
            let address = |t: &Tensor| -> Result<u64> {
                let buffer = t.realized_buffer()?;
                Ok(device.backend().buffer_address(buffer.as_ref())?
                    + (t.offset() * t.dtype().itemsize()) as u64)
            };
            let (send, recv) = (address(input)?, address(output)?);
            let current = device.current_handle();
            input.order_access(&current, false)?;
            output.order_access(&current, true)?;
            // 0 on the CPU, which has no native streams and runs in order; elsewhere a
            // failure to hand the stream over is the caller's error, not the legacy stream.
            let stream = match device.backend().native_stream(current.id) {
                Ok(s) => s,
                Err(_) if device.kind() == crate::backend::BackendKind::Cpu => 0,
                Err(e) => return Err(e),
            };
            calls.push(RankCall {
                send,
                recv,
                count,
                stream,
            });
        }
        self.engine.run(collective, &calls, inputs[0].dtype())?;
        for (input, output) in inputs.iter().zip(outputs) {
            let current = input.device().current_handle();
            input.storage.note_read(&current);
            output.storage.note_write(&current);
        }
        Ok(())
    }
}
