//! DLPack exchange (augpy's `export_dltensor` / `import_dltensor`): a tensor's memory lent to
//! another library, or another library's memory seen as a strata tensor, without a copy.
//!
//! Built on the `dlpark` crate's ABI types (versioned capsules, the legacy ones as a fallback).
//! Export hands out the view as it is: shape, strides in elements (negative and zero strides
//! included: DLPack allows both, though a consumer such as PyTorch may refuse negative ones),
//! the data pointer at the view's first element. The buffer stays alive, and out of the
//! allocator's reuse, until the consumer's deleter runs. Import wraps the producer's memory
//! and calls its deleter when the last strata view is gone and strata's work on it is done.
//!
//! ```
//! use strata_core::{s, Device, DType, Tensor};
//! let dev = Device::cpu();
//! let t = Tensor::arange(0, 6, 1, DType::I32, &dev)?.reshape([2, 3])?;
//! let capsule = t.slice(s![.., ..;-1])?.to_dlpack()?; // a view: strides [3, -1]
//! let back = Tensor::from_dlpack(capsule, &dev)?;
//! assert_eq!(back.to_vec::<i32>()?, vec![2, 1, 0, 5, 4, 3]);
//! back.fill(7)?; // the same memory
//! assert_eq!(t.to_vec::<i32>()?, vec![7; 6]);
//! # Ok::<(), strata_core::Error>(())
//! ```

use crate::backend::ForeignOwner;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::tensor::Tensor;
pub use dlpark::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType};
pub use dlpark::ffi::{DLManagedTensor, DLManagedTensorVersioned};
pub use dlpark::{DlpackFlags, Managed, ManagedTensorBase};

/// A versioned DLPack tensor (`DLManagedTensorVersioned`, the `dltensor_versioned` capsule):
/// dropping it calls its deleter.
pub type Dlpack = dlpark::versioned::Dlpack;

/// A legacy DLPack tensor (`DLManagedTensor`, the `dltensor` capsule), for consumers that
/// predate DLPack 1.0.
pub type LegacyDlpack = dlpark::legacy::Dlpack;

/// The stream a DLPack consumer will use the tensor on (the `stream` of `__dlpack__`).
///
/// ```
/// use strata_core::dlpack::ConsumerStream;
/// assert_eq!(ConsumerStream::from_protocol(None), ConsumerStream::Unnamed);
/// assert_eq!(ConsumerStream::from_protocol(Some(-1)), ConsumerStream::NoSync);
/// assert_eq!(ConsumerStream::from_protocol(Some(7)), ConsumerStream::Native(7));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConsumerStream {
    /// None named: on CUDA the protocol's default, the legacy default stream.
    #[default]
    Unnamed,
    /// `-1`: no synchronization; the consumer orders its work itself.
    NoSync,
    /// A native stream handle: on CUDA `1` (legacy default), `2` (per-thread default) or a
    /// `CUstream`.
    Native(u64),
}

impl ConsumerStream {
    /// The Python protocol's value: `None`, `-1`, or a handle.
    ///
    /// ```
    /// use strata_core::dlpack::ConsumerStream;
    /// assert_eq!(ConsumerStream::from_protocol(Some(1)), ConsumerStream::Native(1));
    /// ```
    pub fn from_protocol(stream: Option<i64>) -> ConsumerStream {
        match stream {
            None => ConsumerStream::Unnamed,
            Some(-1) => ConsumerStream::NoSync,
            Some(h) => ConsumerStream::Native(h as u64),
        }
    }
}

/// How to export: the arguments of the Python protocol's `__dlpack__`.
///
/// ```
/// use strata_core::dlpack::ExportOptions;
/// let o = ExportOptions { copy: Some(true), ..Default::default() };
/// assert_eq!(o.device, None);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportOptions {
    /// Where the consumer reads it: the consumer's stream waits for the tensor's pending work
    /// (an event, no host wait).
    pub stream: ConsumerStream,
    /// `Some(true)`: always a copy; `Some(false)`: never (an `Err` where sharing is
    /// impossible); `None`: a copy only to reach the requested `device`.
    pub copy: Option<bool>,
    /// The device the consumer wants the tensor on (`None`: where it is). Only the tensor's
    /// own device or the CPU (a copy) can be reached.
    pub device: Option<DLDevice>,
}

/// A DLPack device's name for messages: `cpu`, `cuda:0`, `device type 7:0`.
///
/// ```
/// use strata_core::dlpack::{device_name, DLDevice};
/// assert_eq!(device_name(DLDevice::cuda(1)), "cuda:1");
/// ```
pub fn device_name(d: DLDevice) -> String {
    let kind = match d.device_type {
        DLDeviceType::CPU => return "cpu".into(),
        DLDeviceType::CUDA => "cuda".into(),
        DLDeviceType::CUDAHOST => "cuda_host".into(),
        other => format!("device type {}", other.0),
    };
    format!("{kind}:{}", d.device_id)
}

impl Tensor {
    /// This tensor's device as DLPack names it, or `None` where its memory cannot be
    /// shared (wgpu).
    ///
    /// ```
    /// use strata_core::{dlpack::DLDevice, Device, DType, Tensor};
    /// let t = Tensor::zeros([2], DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.dlpack_device(), Some(DLDevice::CPU));
    /// ```
    pub fn dlpack_device(&self) -> Option<DLDevice> {
        self.device().backend().dlpack_device()
    }

    /// The address of the first element as another library sees it (a host pointer on the
    /// CPU, a device pointer on CUDA), like `torch.Tensor.data_ptr()`; `Err` on wgpu, whose
    /// buffers have no address outside the graphics API. Realizes pending work.
    ///
    /// ```
    /// use strata_core::{s, Device, DType, Tensor};
    /// let t = Tensor::zeros([4], DType::F32, &Device::cpu()).unwrap();
    /// let tail = t.slice(s![1..]).unwrap();
    /// assert_eq!(tail.data_ptr().unwrap(), t.data_ptr().unwrap() + 4);
    /// ```
    pub fn data_ptr(&self) -> Result<u64> {
        let buffer = self.realized_buffer()?;
        let base = self.device().backend().buffer_address(buffer.as_ref())?;
        Ok(base + (self.offset() * self.itemsize()) as u64)
    }

    /// Lends this view to another library as a versioned DLPack tensor, without a copy,
    /// ordered for a consumer on the default stream. See [`Tensor::to_dlpack_with`].
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::ones([2, 3], DType::F16, &Device::cpu()).unwrap();
    /// let d = t.to_dlpack().unwrap();
    /// let desc = d.validate().unwrap();
    /// assert_eq!(desc.shape(), &[2, 3]);
    /// assert_eq!(desc.strides(), Some(&[3i64, 1][..]));
    /// ```
    pub fn to_dlpack(&self) -> Result<Dlpack> {
        self.to_dlpack_with(&ExportOptions::default())
    }

    /// Lends this view (or a copy, as `options` ask) as a versioned DLPack tensor. Pending
    /// work is realized first; the consumer's stream waits for the tensor's last write. The
    /// storage stays alive until the returned value (or the consumer holding it) calls the
    /// deleter.
    ///
    /// `Err` when the consumer wants another device than the tensor's or the CPU, when a
    /// copy is needed and `copy` is `Some(false)`, for a wgpu tensor unless a copy is allowed
    /// (`copy: Some(true)`, or the CPU as `device`), and for a stream on a CPU tensor.
    ///
    /// ```
    /// use strata_core::dlpack::{DlpackFlags, ExportOptions};
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::ones([4], DType::I64, &Device::cpu()).unwrap();
    /// let copy = ExportOptions { copy: Some(true), ..Default::default() };
    /// let d = t.to_dlpack_with(&copy).unwrap();
    /// assert!(d.flags().contains(DlpackFlags::IS_COPIED));
    /// ```
    pub fn to_dlpack_with(&self, options: &ExportOptions) -> Result<Dlpack> {
        self.export(options)
    }

    /// [`Tensor::to_dlpack_with`] in the legacy ABI (`DLManagedTensor`, no flags), for
    /// consumers that predate DLPack 1.0.
    ///
    /// ```
    /// use strata_core::dlpack::ExportOptions;
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::ones([4], DType::I64, &Device::cpu()).unwrap();
    /// let legacy = t.to_legacy_dlpack_with(&ExportOptions::default()).unwrap();
    /// assert_eq!(legacy.validate().unwrap().shape(), &[4]);
    /// ```
    pub fn to_legacy_dlpack_with(&self, options: &ExportOptions) -> Result<LegacyDlpack> {
        self.export(options)
    }

    /// The export of either ABI.
    fn export<M: ManagedTensorBase>(&self, options: &ExportOptions) -> Result<Managed<M>> {
        self.realize()?;
        let own = self.dlpack_device();
        let here = || own.map_or_else(|| self.device().name(), device_name);
        let to_host = match options.device {
            Some(d) if Some(d) != own => {
                if d != DLDevice::CPU {
                    return Err(Error::DeviceMismatch(format!(
                        "DLPack export: the consumer asked for {} but the tensor is on {}; \
                         only a copy to the CPU can be made",
                        device_name(d),
                        here()
                    )));
                }
                true
            }
            _ => false,
        };
        let must_copy = to_host || own.is_none();
        if !must_copy && options.copy != Some(true) {
            return self.lend(options.stream, false);
        }
        if options.copy == Some(false) {
            return Err(Error::Unsupported(format!(
                "DLPack export with copy=false: a tensor on {} {}",
                here(),
                if own.is_none() {
                    "cannot be shared (its buffers live inside the graphics API)".to_string()
                } else {
                    "reaches the CPU only through a copy".to_string()
                }
            )));
        }
        if own.is_none() && options.copy.is_none() && options.device.is_none() {
            return Err(Error::Unsupported(format!(
                "DLPack export: a tensor on {} cannot be shared (wgpu buffers live inside the \
                 graphics API); allow a host copy with copy=true, or ask for the CPU device",
                here()
            )));
        }
        let copy = if must_copy {
            self.to_device(&Device::cpu())?
        } else {
            self.copy()?
        };
        copy.lend(options.stream, true)
    }

    /// Exports this view of its own storage.
    fn lend<M: ManagedTensorBase>(
        &self,
        stream: ConsumerStream,
        copied: bool,
    ) -> Result<Managed<M>> {
        let backend = self.device().backend();
        let device = backend.dlpack_device().ok_or_else(|| {
            Error::Unsupported(format!("{}: no DLPack device", self.device().name()))
        })?;
        let buffer = self.realized_buffer()?;
        let data = self.data_ptr()?;
        if device.device_type == DLDeviceType::CPU {
            if let ConsumerStream::Native(h) = stream {
                return Err(Error::Invalid(format!(
                    "DLPack export: a CPU tensor takes no stream (got {h}); pass None"
                )));
            }
        } else {
            // DLPack: an unnamed stream means the legacy default stream, handle 1.
            let foreign = match stream {
                ConsumerStream::NoSync => None,
                ConsumerStream::Unnamed => Some(1),
                ConsumerStream::Native(0) => {
                    return Err(Error::Invalid(
                        "DLPack export: stream 0 is ambiguous on CUDA; use 1 for the legacy \
                         default stream or 2 for the per-thread one"
                            .into(),
                    ))
                }
                ConsumerStream::Native(h) => Some(h),
            };
            if let Some(foreign) = foreign {
                backend.foreign_waits_for(foreign, self.storage_last_writer())?;
            }
        }
        let shape: Vec<i64> = self.shape().iter().map(|&d| d as i64).collect();
        let strides: Vec<i64> = self.strides().iter().map(|&s| s as i64).collect();
        let (code, bits, lanes) = self.dtype.dlpack();
        let owner: Box<std::sync::Arc<dyn crate::backend::DeviceBuffer>> = Box::new(buffer);
        let mut init = dlpark::metadata::Dynamic::new(shape, strides)
            .initialize_as::<M>(owner)
            .map_err(|e| Error::Invalid(format!("DLPack export: {e}")))?;
        init.set_data(data as usize as *mut std::ffi::c_void)
            .set_device(device)
            .set_dtype(DLDataType::new(DLDataTypeCode(code), bits, lanes));
        let mut flags = DlpackFlags::empty();
        if self.storage.read_only {
            flags |= DlpackFlags::READ_ONLY;
        }
        if copied {
            flags |= DlpackFlags::IS_COPIED;
        }
        // SAFETY: IS_COPIED only on a fresh copy that nothing else references; READ_ONLY as
        // the storage says; the legacy ABI ignores flags.
        unsafe { init.set_flags_unchecked(flags) };
        // SAFETY: the data pointer is the view's first element inside `buffer`, which the
        // context keeps alive; shape and strides are copied into the managed allocation and
        // describe elements inside the buffer (the layout was checked when the view was made).
        Ok(unsafe { init.finish() })
    }

    /// Takes a DLPack tensor of either ABI as a strata tensor on `device`, without a copy:
    /// the producer's memory, its shape and strides (negative and zero strides too), read-only
    /// when the producer says so (a write is then an `Err`). The producer's deleter runs when
    /// the last view is dropped and strata's work on the memory is done.
    ///
    /// `Err` for a dtype strata lacks (or lanes ≠ 1), a producer on another device than
    /// `device` (another CUDA ordinal included), a device whose memory cannot be shared
    /// (wgpu: copy through the CPU with [`Tensor::from_dlpack_copy`]), a misaligned pointer.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let t = Tensor::from_slice(&[1.5f32, 2.5], [2], &dev).unwrap();
    /// let u = Tensor::from_dlpack(t.to_dlpack().unwrap(), &dev).unwrap();
    /// assert_eq!(u.to_vec::<f32>().unwrap(), vec![1.5, 2.5]);
    /// ```
    pub fn from_dlpack<M: ManagedTensorBase + 'static>(
        dlpack: Managed<M>,
        device: &Device,
    ) -> Result<Tensor> {
        let backend = device.backend();
        let desc = dlpack
            .validate()
            .map_err(|e| Error::Invalid(format!("DLPack import: a malformed tensor: {e}")))?;
        let theirs = desc.device();
        let ours = backend.dlpack_device();
        if ours != Some(theirs) {
            return Err(Error::DeviceMismatch(format!(
                "DLPack import: the tensor is on {}, the device asked for is {}{}",
                device_name(theirs),
                device.name(),
                if ours.is_none() {
                    " (wgpu cannot wrap foreign memory: use Tensor::from_dlpack_copy)"
                } else {
                    ""
                }
            )));
        }
        let dt = desc.dtype();
        if dt.lanes != 1 {
            return Err(Error::DType(format!(
                "DLPack import: {} lanes per element (a vector dtype, code {} of {} bits); \
                 strata's dtypes have one lane",
                dt.lanes, dt.code.0, dt.bits
            )));
        }
        let dtype = DType::from_dlpack(dt.code.0, dt.bits, dt.lanes)?;
        let itemsize = dtype.itemsize();
        let shape: Vec<usize> = desc.shape().iter().map(|&d| d as usize).collect();
        let strides: Vec<isize> = desc
            .strides_or_compact()
            .map_err(|e| Error::Invalid(format!("DLPack import: {e}")))?
            .iter()
            .map(|&s| s as isize)
            .collect();
        // The elements reach from the lowest to the highest offset the strides give.
        let overflow = || Error::Shape(format!("DLPack import: strides {strides:?} overflow"));
        let (mut low, mut high) = (0isize, 0isize);
        let empty = shape.contains(&0);
        for (&n, &s) in shape.iter().zip(&strides) {
            if n > 0 {
                let reach = (n as isize - 1).checked_mul(s).ok_or_else(overflow)?;
                let end = if reach < 0 { &mut low } else { &mut high };
                *end = end.checked_add(reach).ok_or_else(overflow)?;
            }
        }
        let first = desc.data_ptr() as usize as u64 + desc.byte_offset();
        let start = first.wrapping_add_signed(low as i64 * itemsize as i64);
        let bytes = if empty {
            0
        } else {
            (high as usize)
                .checked_add(low.unsigned_abs() + 1)
                .and_then(|n| n.checked_mul(itemsize))
                .ok_or_else(overflow)?
        };
        if !start.is_multiple_of(itemsize as u64) {
            return Err(Error::Invalid(format!(
                "DLPack import: the data at {first:#x} is not aligned to its {itemsize}-byte \
                 {dtype} elements"
            )));
        }
        let read_only = dlpack.flags().contains(DlpackFlags::READ_ONLY);
        let layout = Layout::new(shape, strides, if empty { 0 } else { (-low) as usize })?;
        let owner: ForeignOwner = Box::new(dlpack);
        let buffer = backend.wrap_foreign(start, bytes, owner)?;
        Ok(Tensor::from_foreign(
            buffer, layout, dtype, device, read_only,
        ))
    }

    /// Takes a DLPack tensor onto `device` through a copy: for a device whose memory cannot
    /// be shared (wgpu), or to own the values. A CPU or same-device producer is wrapped
    /// first, then copied; the producer's deleter runs at once.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let t = Tensor::from_slice(&[3u8, 4], [2], &dev).unwrap();
    /// let u = Tensor::from_dlpack_copy(t.to_dlpack().unwrap(), &dev).unwrap();
    /// assert!(!u.shares_storage(&t));
    /// assert_eq!(u.to_vec::<u8>().unwrap(), vec![3, 4]);
    /// ```
    pub fn from_dlpack_copy<M: ManagedTensorBase + 'static>(
        dlpack: Managed<M>,
        device: &Device,
    ) -> Result<Tensor> {
        let theirs = dlpack
            .validate()
            .map_err(|e| Error::Invalid(format!("DLPack import: a malformed tensor: {e}")))?
            .device();
        if device.backend().dlpack_device() == Some(theirs) {
            return Tensor::from_dlpack(dlpack, device)?.copy();
        }
        if theirs != DLDevice::CPU {
            return Err(Error::DeviceMismatch(format!(
                "DLPack import: a tensor on {} can be copied to {} only from the CPU",
                device_name(theirs),
                device.name()
            )));
        }
        Tensor::from_dlpack(dlpack, &Device::cpu())?.to_device(device)
    }

    /// True for a tensor whose producer lent it read-only (a DLPack import with the
    /// `READ_ONLY` flag): writes into it are an `Err`.
    ///
    /// ```
    /// let t = strata_core::Tensor::zeros([1], strata_core::DType::F32, &strata_core::Device::cpu()).unwrap();
    /// assert!(!t.is_read_only());
    /// ```
    pub fn is_read_only(&self) -> bool {
        self.storage.read_only
    }
}
