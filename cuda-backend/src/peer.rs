//! Copies from another CUDA device of this process without the host. strata allocates from
//! each device's stream-ordered memory pool, whose blocks another device may read only once
//! the pool grants it access (`cuMemPoolSetAccess`; a context's peer access does not reach
//! pool memory). For a pair that has peer access (NVLink or PCIe), the first copy enables it
//! both ways, context and pool, once (as PyTorch does for its pools); the copy is then one
//! `cuMemcpyPeerAsync`, device to device. A pair without peer access copies through the host.

use crate::driver::{check, Gpu};
use cudarc::driver::{sys, CudaContext};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use strata_core::sync::LockUnpoisoned;
use strata_core::Result;

/// Peer access between this device and others, by ordinal: the peer's primary context
/// (kept retained while the access is in use), or `None` where the pair cannot have it.
#[derive(Default)]
pub(crate) struct Peers {
    enabled: Mutex<HashMap<usize, Option<Arc<CudaContext>>>>,
}

impl Peers {
    /// The context of `peer` when this device and it reach each other's memory directly,
    /// enabling it on first use; `None` where the pair cannot (or enabling failed).
    pub(crate) fn reach(&self, gpu: &Gpu, peer: usize) -> Option<Arc<CudaContext>> {
        let mut enabled = self.enabled.lock_unpoisoned();
        if let Some(known) = enabled.get(&peer) {
            return known.clone();
        }
        let context = enable(gpu, peer).ok().flatten();
        enabled.insert(peer, context.clone());
        context
    }
}

/// Whether device `a` can reach device `b`'s memory directly (`cuDeviceCanAccessPeer`).
pub(crate) fn can_access(a: usize, b: usize) -> Result<bool> {
    let (mut da, mut db, mut can) = (0, 0, 0);
    // SAFETY: the outputs are written by the driver; the ordinals are checked by it.
    unsafe {
        check(sys::cuDeviceGet(&mut da, a as i32), "cuDeviceGet")?;
        check(sys::cuDeviceGet(&mut db, b as i32), "cuDeviceGet")?;
        check(
            sys::cuDeviceCanAccessPeer(&mut can, da, db),
            "cuDeviceCanAccessPeer",
        )?;
    }
    Ok(can != 0)
}

/// Enables `gpu` and `peer` to reach each other's memory: each context's peer access and
/// each device's default pool opened to the other (a copy reads one and writes the other).
/// `None` where the pair cannot; the same device needs nothing.
fn enable(gpu: &Gpu, peer: usize) -> Result<Option<Arc<CudaContext>>> {
    let context = CudaContext::new(peer).map_err(|e| {
        strata_core::Error::Backend(format!("cuda:{peer}: {}", crate::driver::describe(e.0)))
    })?;
    if peer == gpu.ordinal {
        gpu.bind()?;
        return Ok(Some(context));
    }
    if !can_access(gpu.ordinal, peer)? || !can_access(peer, gpu.ordinal)? {
        gpu.bind()?;
        return Ok(None);
    }
    for (from, to, to_context) in [(gpu.ordinal, peer, &context), (peer, gpu.ordinal, &gpu.ctx)] {
        from_reaches(from, to, to_context)?;
    }
    gpu.bind()?;
    Ok(Some(context))
}

/// Lets device `from` reach device `to`'s memory: `from`'s context gets peer access to
/// `to_context`, and `to`'s default pool grants `from` reads and writes.
fn from_reaches(from: usize, to: usize, to_context: &CudaContext) -> Result<()> {
    // Opening `from`'s context binds it: the calls below act for `from`.
    let _bound = CudaContext::new(from).map_err(|e| {
        strata_core::Error::Backend(format!("cuda:{from}: {}", crate::driver::describe(e.0)))
    })?;
    // SAFETY: `from`'s context is current (CudaContext::new binds it); `to_context` is live;
    // the pool handle and the access descriptor are written and read by the driver.
    unsafe {
        let status = sys::cuCtxEnablePeerAccess(to_context.cu_ctx(), 0);
        if status != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            check(status, "cuCtxEnablePeerAccess")?;
        }
        let (mut device, mut pool) = (0, std::ptr::null_mut());
        check(sys::cuDeviceGet(&mut device, to as i32), "cuDeviceGet")?;
        check(
            sys::cuDeviceGetDefaultMemPool(&mut pool, device),
            "cuDeviceGetDefaultMemPool",
        )?;
        let access = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: from as i32,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        check(
            sys::cuMemPoolSetAccess(pool, &access, 1),
            "cuMemPoolSetAccess",
        )?;
    }
    Ok(())
}

/// Enqueues on `stream` (of `gpu`) a copy of `len` bytes from `src`, memory of the device
/// whose context is `src_context`, to `dst` on `gpu`. Ordering is the caller's.
pub(crate) fn copy(
    gpu: &Gpu,
    dst: u64,
    src: u64,
    src_context: &CudaContext,
    len: usize,
    stream: sys::CUstream,
) -> Result<()> {
    gpu.bind()?;
    // SAFETY: both addresses are live device memory of their contexts for `len` bytes (the
    // caller checked the destination's range and holds the source), the pair reaches each
    // other (Peers::reach), `stream` is live.
    check(
        unsafe {
            sys::cuMemcpyPeerAsync(
                dst,
                gpu.ctx.cu_ctx(),
                src,
                src_context.cu_ctx(),
                len,
                stream,
            )
        },
        "cuMemcpyPeerAsync",
    )
}
