//! Copies from another CUDA device of this process without the host. Every CUDA allocation
//! of a 64-bit process lives in one unified address space, so a copy names the source by its
//! address and the driver moves it device to device: directly over NVLink or PCIe where the
//! pair has peer access (enabled here once per pair, as PyTorch does), else staged by the
//! driver itself.

use crate::driver::{check, Gpu};
use cudarc::driver::{sys, CudaContext};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use strata_core::sync::LockUnpoisoned;
use strata_core::Result;

/// Peer access this device's context has to others, by ordinal: the peer's primary context
/// (kept retained while the access is in use), or `None` where the pair cannot have it.
#[derive(Default)]
pub(crate) struct Peers {
    enabled: Mutex<HashMap<usize, Option<Arc<CudaContext>>>>,
}

impl Peers {
    /// Whether this device's kernels and copies reach `peer`'s memory directly, enabling it
    /// on first use. A pair without peer access still copies, through the driver's staging.
    pub(crate) fn reach(&self, gpu: &Gpu, peer: usize) -> bool {
        if peer == gpu.ordinal {
            return true;
        }
        let mut enabled = self.enabled.lock_unpoisoned();
        if let Some(known) = enabled.get(&peer) {
            return known.is_some();
        }
        let context = enable(gpu, peer).ok().flatten();
        let reached = context.is_some();
        enabled.insert(peer, context);
        reached
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

/// Enables `gpu`'s context to reach `peer`'s memory; `None` where the pair cannot.
fn enable(gpu: &Gpu, peer: usize) -> Result<Option<Arc<CudaContext>>> {
    if !can_access(gpu.ordinal, peer)? {
        return Ok(None);
    }
    // The peer's primary context (the one its strata device uses); opening it binds it.
    let context = CudaContext::new(peer).map_err(|e| {
        strata_core::Error::Backend(format!("cuda:{peer}: {}", crate::driver::describe(e.0)))
    })?;
    gpu.bind()?;
    // SAFETY: this device's context is current; the peer's context is live (held above).
    let status = unsafe { sys::cuCtxEnablePeerAccess(context.cu_ctx(), 0) };
    if status != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        check(status, "cuCtxEnablePeerAccess")?;
    }
    Ok(Some(context))
}

/// Enqueues on `stream` (of `gpu`) a copy of `len` bytes from the unified address `src` to
/// `dst`. The caller has bound nothing; ordering is the caller's.
pub(crate) fn copy(gpu: &Gpu, dst: u64, src: u64, len: usize, stream: sys::CUstream) -> Result<()> {
    gpu.bind()?;
    // SAFETY: both addresses are live device memory of this process for `len` bytes (the
    // caller checked the destination's range and holds the source), `stream` is live.
    check(
        unsafe { sys::cuMemcpyAsync(dst, src, len, stream) },
        "cuMemcpyAsync (from another device)",
    )
}
