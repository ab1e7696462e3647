//! Collectives through NCCL, the library every framework runs them on, loaded at run time
//! like the other CUDA libraries: a communicator over CUDA devices of this process
//! (`ncclCommInitAll`), each collective one group of calls (`ncclGroupStart` … `End`) from
//! the calling thread, each device's call on its current stream. Core checks the operands and
//! orders the streams ([`strata_core::collective`]).

use crate::driver::Raw;
use cudarc::nccl::sys;
use std::sync::Mutex;
use strata_core::collective::{Collective, CollectiveEngine, RankCall, ReduceOp};
use strata_core::sync::LockUnpoisoned;
use strata_core::{DType, Error, Result};

/// NCCL communicators, one per device, in the order the devices were given.
pub struct Nccl {
    comms: Vec<Raw<sys::ncclComm_t>>,
    ordinals: Vec<usize>,
    /// A communicator takes one group at a time.
    group: Mutex<()>,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Nccl(cuda {:?})", self.ordinals)
    }
}

/// An NCCL status as an `Err` naming the call.
fn check(status: sys::ncclResult_t, call: &str) -> Result<()> {
    if status == sys::ncclResult_t::ncclSuccess {
        return Ok(());
    }
    // SAFETY: ncclGetErrorString returns a static string for any status.
    let text = unsafe { std::ffi::CStr::from_ptr(sys::ncclGetErrorString(status)) };
    Err(Error::Backend(format!(
        "{call} failed: {status:?} ({})",
        text.to_string_lossy()
    )))
}

impl Nccl {
    /// Communicators over the CUDA devices `ordinals` (each once), or `Err` saying why not:
    /// NCCL not found (it is loaded as `libnccl.so` from the library path; pip's
    /// `nvidia-nccl-cu13` installs `libnccl.so.2`, which needs a `libnccl.so` link beside it),
    /// or NCCL's own error.
    pub fn new(ordinals: &[usize]) -> Result<Nccl> {
        loadable()?;
        let devices: Vec<i32> = ordinals.iter().map(|&o| o as i32).collect();
        let mut comms = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: `comms` has room for one communicator per device; `devices` lists them.
        check(
            unsafe {
                sys::ncclCommInitAll(comms.as_mut_ptr(), devices.len() as i32, devices.as_ptr())
            },
            "ncclCommInitAll",
        )?;
        Ok(Nccl {
            comms: comms.into_iter().map(Raw).collect(),
            ordinals: ordinals.to_vec(),
            group: Mutex::new(()),
        })
    }
}

/// An `Err` unless NCCL can be loaded.
fn loadable() -> Result<()> {
    // SAFETY: only asks the loader whether the library can be opened.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::DeviceUnavailable(
            "NCCL not found: put libnccl.so on the library path (pip's nvidia-nccl-cu13 \
             installs libnccl.so.2: link it as libnccl.so)"
                .into(),
        ));
    }
    Ok(())
}

impl Nccl {
    /// A new NCCL unique id (128 bytes): what every process of a communicator is given, with
    /// its rank and the world size, to find the others (`ncclGetUniqueId`).
    pub fn unique_id() -> Result<[u8; 128]> {
        loadable()?;
        let mut id = sys::ncclUniqueId { internal: [0; 128] };
        // SAFETY: `id` is written by NCCL.
        check(unsafe { sys::ncclGetUniqueId(&mut id) }, "ncclGetUniqueId")?;
        Ok(id.internal.map(|c| c as u8))
    }

    /// This process's part of a communicator of `world` ranks across processes: CUDA device
    /// `ordinal` as rank `rank`, all ranks given the same `id` ([`Nccl::unique_id`]).
    /// Blocks until every rank has joined (`ncclCommInitRank`).
    pub fn new_rank(ordinal: usize, rank: usize, world: usize, id: [u8; 128]) -> Result<Nccl> {
        loadable()?;
        // NCCL takes the device whose context is current.
        let _bound = cudarc::driver::CudaContext::new(ordinal).map_err(|e| {
            Error::DeviceUnavailable(format!("cuda:{ordinal}: {}", crate::driver::describe(e.0)))
        })?;
        let id = sys::ncclUniqueId {
            internal: id.map(|b| b as std::ffi::c_char),
        };
        let mut comm = std::ptr::null_mut();
        // SAFETY: `comm` is written by NCCL; the id came from ncclGetUniqueId (via the launcher).
        check(
            unsafe { sys::ncclCommInitRank(&mut comm, world as i32, id, rank as i32) },
            "ncclCommInitRank",
        )?;
        Ok(Nccl {
            comms: vec![Raw(comm)],
            ordinals: vec![ordinal],
            group: Mutex::new(()),
        })
    }
}

/// NCCL's name for `dtype`, or `None` where it has none.
fn nccl_type(dtype: DType) -> Option<sys::ncclDataType_t> {
    use sys::ncclDataType_t::*;
    Some(match dtype {
        DType::I8 => ncclInt8,
        DType::U8 => ncclUint8,
        DType::I32 => ncclInt32,
        DType::U32 => ncclUint32,
        DType::I64 => ncclInt64,
        DType::U64 => ncclUint64,
        DType::F16 => ncclFloat16,
        DType::BF16 => ncclBfloat16,
        DType::F32 => ncclFloat32,
        DType::F64 => ncclFloat64,
        DType::Bool | DType::U16 | DType::I16 => return None,
    })
}

fn nccl_op(op: ReduceOp) -> sys::ncclRedOp_t {
    use sys::ncclRedOp_t::*;
    match op {
        ReduceOp::Sum => ncclSum,
        ReduceOp::Prod => ncclProd,
        ReduceOp::Max => ncclMax,
        ReduceOp::Min => ncclMin,
        ReduceOp::Avg => ncclAvg,
    }
}

impl CollectiveEngine for Nccl {
    fn check_dtype(&self, dtype: DType) -> Result<()> {
        match nccl_type(dtype) {
            Some(_) => Ok(()),
            None => Err(Error::Unsupported(format!(
                "NCCL has no {dtype}: collectives move i8, u8, i32, u32, i64, u64, f16, bf16, \
                 f32 and f64 (cast first)"
            ))),
        }
    }

    fn run(&self, collective: Collective, calls: &[RankCall], dtype: DType) -> Result<()> {
        let Some(datatype) = nccl_type(dtype) else {
            return self.check_dtype(dtype);
        };
        if calls.len() != self.comms.len() {
            return Err(Error::Invalid(format!(
                "{}: {} calls for {} communicators",
                collective.name(),
                calls.len(),
                self.comms.len()
            )));
        }
        let _one_group = self.group.lock_unpoisoned();
        // SAFETY: group calls; each enqueues on a live stream of its device with addresses core
        // took from live buffers of that device, sized for `count` (core checked the shapes).
        unsafe {
            check(sys::ncclGroupStart(), "ncclGroupStart")?;
            let mut first_error = Ok(());
            for (rank, (call, comm)) in calls.iter().zip(&self.comms).enumerate() {
                let (send, recv) = (
                    call.send as usize as *const std::ffi::c_void,
                    call.recv as usize as *mut std::ffi::c_void,
                );
                let stream = call.stream as usize as sys::cudaStream_t;
                let status = match collective {
                    Collective::AllReduce(op) => sys::ncclAllReduce(
                        send,
                        recv,
                        call.count,
                        datatype,
                        nccl_op(op),
                        comm.0,
                        stream,
                    ),
                    Collective::Broadcast { root } => sys::ncclBroadcast(
                        send,
                        recv,
                        call.count,
                        datatype,
                        root as i32,
                        comm.0,
                        stream,
                    ),
                    Collective::Reduce { root, op } => sys::ncclReduce(
                        send,
                        recv,
                        call.count,
                        datatype,
                        nccl_op(op),
                        root as i32,
                        comm.0,
                        stream,
                    ),
                    Collective::AllGather => {
                        sys::ncclAllGather(send, recv, call.count, datatype, comm.0, stream)
                    }
                    Collective::ReduceScatter(op) => sys::ncclReduceScatter(
                        send,
                        recv,
                        call.count,
                        datatype,
                        nccl_op(op),
                        comm.0,
                        stream,
                    ),
                };
                if first_error.is_ok() {
                    first_error =
                        check(status, &format!("nccl {} (rank {rank})", collective.name()));
                }
            }
            // The group ends whatever a call said, so no device is left inside it.
            let ended = check(sys::ncclGroupEnd(), "ncclGroupEnd");
            first_error.and(ended)
        }
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        for comm in &self.comms {
            // SAFETY: each communicator was made by ncclCommInitAll and is destroyed once.
            unsafe {
                sys::ncclCommDestroy(comm.0);
            }
        }
    }
}
