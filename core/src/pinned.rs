//! Pinned (page-locked) host memory: tensors on a GPU's
//! [`pinned_host`](crate::Device::pinned_host) device copy to and from that GPU through the
//! copy engine directly, without staging and without the host waiting (PyTorch's
//! `pin_memory()` and `non_blocking=True`). Unlike PyTorch's, these copies are safe to use at
//! once: the pinned storage remembers the copy in flight (a `Fence`), and any host use of
//! its buffer — a read, an op, a write, its release — waits for that copy first.
//!
//! ```no_run
//! # fn main() -> strata_core::Result<()> {
//! # let gpu = strata_core::Device::cpu(); // a CUDA device in practice
//! use strata_core::{DType, Tensor};
//! let batch = Tensor::ones([1024, 1024], DType::F32, &gpu.pinned_host()?)?;
//! let on_gpu = batch.to_device(&gpu)?; // returns before the copy is done
//! let back = (&on_gpu * 2.0)?.to_device(&gpu.pinned_host()?)?; // so does this one
//! assert_eq!(back.to_vec::<f32>()?[0], 2.0); // the read waits for the copy
//! # Ok(()) }
//! ```

use crate::device::Device;
use crate::error::Result;
use crate::tensor::{Fence, Tensor};

/// The copy of `t` to `to` when one of them is the other's pinned host device: enqueued
/// without waiting. `None` for any other pair of devices.
pub(crate) fn copy_async(t: &Tensor, to: &Device) -> Option<Result<Tensor>> {
    if to.pinned_for() == Some(t.device()) {
        return Some(download(t, to));
    }
    if t.device().pinned_for() == Some(to) {
        return Some(upload(t, to));
    }
    None
}

/// Pinned host tensor `t` copied to `gpu` on its current stream.
fn upload(t: &Tensor, gpu: &Device) -> Result<Tensor> {
    let src = t.contiguous()?;
    let out = Tensor::alloc(src.shape(), src.dtype(), gpu)?;
    let bytes = src.nbytes();
    if bytes == 0 {
        return Ok(out);
    }
    // Waits for a copy still writing the source.
    let host = src.realized_buffer()?;
    let address = src.device().backend().buffer_address(host.as_ref())?
        + (src.offset() * src.itemsize()) as u64;
    let stream = gpu.current_stream().id();
    let dst = out.realized_buffer()?;
    let event = gpu.copy_pinned(true, bytes, stream, || {
        gpu.backend()
            .upload_pinned(dst.as_ref(), 0, address, bytes, stream)
    })?;
    src.storage.set_copy_fence(Fence::new(gpu.clone(), event))?;
    Ok(out)
}

/// GPU tensor `t` copied into a new tensor on `host` (its GPU's pinned host device), on the
/// stream that last wrote it.
fn download(t: &Tensor, host: &Device) -> Result<Tensor> {
    let gpu = t.device();
    let src = t.contiguous()?;
    let out = Tensor::alloc(src.shape(), src.dtype(), host)?;
    let bytes = src.nbytes();
    if bytes == 0 {
        return Ok(out);
    }
    let dst = host
        .backend()
        .buffer_address(out.realized_buffer()?.as_ref())?;
    let buffer = src.realized_buffer()?;
    let stream = src.storage_last_writer();
    let offset = src.offset() * src.itemsize();
    let event = gpu.copy_pinned(false, bytes, stream, || {
        gpu.backend()
            .download_pinned(buffer.as_ref(), offset, dst, bytes, stream)
    })?;
    out.storage.set_copy_fence(Fence::new(gpu.clone(), event))?;
    Ok(out)
}

impl Tensor {
    /// A copy of this tensor in page-locked host memory for `gpu` (on
    /// [`gpu.pinned_host()`](Device::pinned_host)), from which copies to `gpu` run at the
    /// copy engine's speed without the host waiting. `Err` when `gpu` has no page-locked
    /// memory (only CUDA devices have it).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::ones([4], DType::F32, &Device::cpu())?;
    /// let err = t.pin_memory(&Device::cpu()).unwrap_err();
    /// assert!(err.to_string().contains("pinned"));
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn pin_memory(&self, gpu: &Device) -> Result<Tensor> {
        self.to_device(&gpu.pinned_host()?)
    }

    /// True for a tensor in page-locked host memory (see [`pin_memory`](Tensor::pin_memory)).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// assert!(!Tensor::ones([4], DType::F32, &Device::cpu())?.is_pinned());
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn is_pinned(&self) -> bool {
        self.device().pinned_for().is_some()
    }
}
