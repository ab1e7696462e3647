//! Moving data between the host and devices, and converting dtypes.

use crate::device::Device;
use crate::dtype::{DType, Element, Scalar};
use crate::error::{Error, Result};
use crate::fusion::defer_or_launch;
use crate::ir::Expr;
use crate::layout::Layout;
use crate::tensor::Tensor;

impl Tensor {
    /// The elements in row-major order as raw little-endian bytes; waits only for the work
    /// that wrote this tensor.
    pub(crate) fn host_bytes(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.nbytes()];
        self.read_bytes_into(&mut out)?;
        Ok(out)
    }

    /// Writes the elements in row-major order into `out` (`nbytes()` long); waits only for
    /// the work that wrote this tensor.
    fn read_bytes_into(&self, out: &mut [u8]) -> Result<()> {
        if self.numel() == 0 {
            // A zero-size view may carry an offset past its (empty) storage.
            return Ok(());
        }
        let t = self.contiguous()?;
        let writer = t.storage_last_writer();
        t.device().download_bytes(
            t.realized_buffer()?.as_ref(),
            t.offset() * t.itemsize(),
            out,
            writer,
        )
    }

    fn check_element<T: Element>(&self) -> Result<()> {
        if T::DTYPE != self.dtype {
            return Err(Error::DTypeMismatch {
                actual: self.dtype,
                requested: T::DTYPE,
            });
        }
        Ok(())
    }

    /// The elements in row-major order. `T` must match the dtype (convert first with
    /// [`to_dtype`](Tensor::to_dtype)).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::arange(0, 3, 1, DType::I64, &Device::cpu()).unwrap();
    /// assert_eq!(t.to_vec::<i64>().unwrap(), vec![0, 1, 2]);
    /// assert!(t.to_vec::<f32>().unwrap_err().to_string().contains("i64"));
    /// ```
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.check_element::<T>()?;
        T::read_vec(self.numel(), &mut |bytes| self.read_bytes_into(bytes))
    }

    /// The elements as an ndarray array of the same shape.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::eye(2, DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.to_ndarray::<f32>().unwrap(), ndarray::array![[1.0, 0.0], [0.0, 1.0]].into_dyn());
    /// ```
    pub fn to_ndarray<T: Element>(&self) -> Result<ndarray::ArrayD<T>> {
        let data = self.to_vec::<T>()?;
        ndarray::ArrayD::from_shape_vec(self.shape(), data)
            .map_err(|e| Error::Shape(format!("to_ndarray of shape {:?}: {e}", self.shape())))
    }

    /// The value of a one-element tensor (any shape with one element). `T` must match the
    /// dtype.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1, 1], 2.5, DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.item::<f32>().unwrap(), 2.5);
    /// assert!(Tensor::zeros([2], DType::F32, &Device::cpu()).unwrap().item::<f32>().is_err());
    /// ```
    pub fn item<T: Element>(&self) -> Result<T> {
        self.check_element::<T>()?;
        Ok(T::from_scalar(self.item_scalar()?))
    }

    /// The value of a one-element tensor as a [`Scalar`] of its dtype.
    ///
    /// ```
    /// use strata_core::{Device, DType, Scalar, Tensor};
    /// let t = Tensor::scalar(3u8, &Device::cpu()).unwrap();
    /// assert_eq!(t.item_scalar().unwrap(), Scalar::U8(3));
    /// ```
    pub fn item_scalar(&self) -> Result<Scalar> {
        if self.numel() != 1 {
            return Err(Error::Shape(format!(
                "item() needs a tensor with one element, this one has shape {:?} ({} elements)",
                self.shape(),
                self.numel()
            )));
        }
        let bytes = self.host_bytes()?;
        Ok(crate::display::scalar_at(self.dtype, &bytes, 0))
    }

    /// A copy on `device` (the tensor itself when it is already there). Between two CUDA
    /// devices it goes device to device (peer to peer where the pair allows), ordered by both
    /// devices' streams without a host wait; otherwise through the host.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let (a, b) = (Device::cpu(), Device::cpu());
    /// let t = Tensor::ones([2], DType::F32, &a).unwrap();
    /// let u = t.to_device(&b).unwrap();
    /// assert_eq!(u.device(), &b);
    /// assert_eq!(u.to_vec::<f32>().unwrap(), vec![1.0, 1.0]);
    /// ```
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        if crate::autograd::needed([self]) {
            let out = crate::autograd::no_grad(|| self.to_device(device))?;
            let home = self.device().clone();
            return Ok(crate::autograd::record(
                "ToDeviceBackward",
                &[self],
                out,
                Vec::new(),
                move |g| Ok(vec![Some(g.to_device(&home)?)]),
            ));
        }
        if let Some(copied) = crate::pinned::copy_async(self, device) {
            return copied;
        }
        if let Some(copied) = copy_between_devices(self, device) {
            return copied;
        }
        if device.shares_memory_with(self.device()) {
            // Host memory to host memory: one copy, no round trip through a Vec.
            let out = Tensor::alloc(self.shape(), self.dtype, device)?;
            out.assign(self)?;
            return Ok(out);
        }
        let bytes = self.host_bytes()?;
        let out = Tensor::alloc(self.shape(), self.dtype, device)?;
        let stream = device.current_stream();
        device.upload_bytes(out.realized_buffer()?.as_ref(), 0, &bytes, stream.id())?;
        Ok(out)
    }

    /// A copy converted to `dtype` with strata's cast rules: integers wrap, floats to integers
    /// truncate toward zero and saturate (NaN → 0), anything to bool is `!= 0`.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[-1.5f32, 300.0, f32::NAN], [3], &Device::cpu()).unwrap();
    /// assert_eq!(t.to_dtype(DType::U8).unwrap().to_vec::<u8>().unwrap(), vec![0, 255, 0]);
    /// let i = Tensor::from_slice(&[300i32, -1], [2], &Device::cpu()).unwrap();
    /// assert_eq!(i.to_dtype(DType::U8).unwrap().to_vec::<u8>().unwrap(), vec![44, 255]);
    /// ```
    #[track_caller]
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        self.cast_with(dtype, false)
    }

    /// A copy whose elements' bits are read as `dtype`, a dtype of the same size (PyTorch's
    /// `view(dtype)`, as a copy): see a float's sign, exponent and mantissa bits, or build
    /// floats from bits. Not differentiable.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let x = Tensor::from_slice(&[1.0f32, -2.0], [2], &Device::cpu()).unwrap();
    /// let bits = x.bitcast(DType::U32).unwrap();
    /// assert_eq!(bits.to_vec::<u32>().unwrap(), vec![0x3f80_0000, 0xc000_0000]);
    /// assert!(x.bitcast(DType::F64).is_err()); // 4 bytes are not 8
    /// ```
    #[track_caller]
    pub fn bitcast(&self, dtype: DType) -> Result<Tensor> {
        let from = self.dtype;
        if from == DType::Bool || dtype == DType::Bool {
            return Err(Error::DType(format!(
                "bitcast from {from} to {dtype}: bool has no bit pattern to read"
            )));
        }
        if from.itemsize() != dtype.itemsize() {
            return Err(Error::DType(format!(
                "bitcast reads bits as a dtype of the same size: {from} has {} bytes, {dtype} {}",
                from.itemsize(),
                dtype.itemsize()
            )));
        }
        let expr = Expr::input(0, from).bitcast(dtype);
        let layout = Layout::contiguous(self.shape())?;
        defer_or_launch(
            expr,
            layout,
            vec![self.clone()],
            vec![],
            self.device(),
            "bitcast",
        )
    }

    /// A copy converted to `dtype`, clamping integers to the target range instead of wrapping
    /// (augpy's saturating cast).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let i = Tensor::from_slice(&[300i32, -1], [2], &Device::cpu()).unwrap();
    /// assert_eq!(i.to_dtype_sat(DType::U8).unwrap().to_vec::<u8>().unwrap(), vec![255, 0]);
    /// ```
    #[track_caller]
    pub fn to_dtype_sat(&self, dtype: DType) -> Result<Tensor> {
        self.cast_with(dtype, true)
    }

    #[track_caller]
    fn cast_with(&self, dtype: DType, saturate: bool) -> Result<Tensor> {
        let expr = Expr::input(0, self.dtype).cast(dtype, saturate);
        let layout = Layout::contiguous(self.shape())?;
        let what = if saturate { "to_dtype_sat" } else { "to_dtype" };
        if !crate::autograd::needed([self]) {
            return defer_or_launch(
                expr,
                layout,
                vec![self.clone()],
                vec![],
                self.device(),
                what,
            );
        }
        let inputs = [self.clone()];
        let out = defer_or_launch(
            expr.clone(),
            layout,
            inputs.to_vec(),
            vec![],
            self.device(),
            what,
        )?;
        let name = crate::autograd::backward_name(what);
        Ok(crate::autograd::record_elementwise(
            name,
            &expr,
            &inputs,
            &[],
            out,
        ))
    }
}

/// A copy of `t` on `device`, another device of its kind that takes it without the host (two
/// CUDA devices: device to device, peer to peer where the pair allows), or `None` where the
/// backends cannot. Ordered by both devices' streams, without a host wait: `device`'s current
/// stream waits for the stream that last wrote `t`, and that stream waits for the copy, so
/// the source's memory is neither read early nor reused before the copy has read it.
fn copy_between_devices(t: &Tensor, device: &Device) -> Option<Result<Tensor>> {
    let from = t.device();
    if from.kind() != device.kind() || from.shares_memory_with(device) {
        return None;
    }
    let peer = from.backend().dlpack_device()?;
    let copied = (|| -> Result<Option<Tensor>> {
        let src = t.contiguous()?;
        let buffer = src.realized_buffer()?;
        let itemsize = src.dtype.itemsize();
        let address =
            from.backend().buffer_address(buffer.as_ref())? + (src.offset() * itemsize) as u64;
        let out = Tensor::alloc(src.shape(), src.dtype, device)?;
        let (source, target) = (src.storage_last_writer(), device.current_stream().id());
        let (sb, db) = (from.backend(), device.backend());
        sb.foreign_waits_for(db.native_stream(target)?, source)?;
        let len = src.numel() * itemsize;
        let dst = out.realized_buffer()?;
        let Some(done) = db.copy_from_peer(dst.as_ref(), 0, address, peer, len, target) else {
            return Ok(None);
        };
        done?;
        db.foreign_waits_for(sb.native_stream(source)?, target)?;
        Ok(Some(out))
    })();
    copied.transpose()
}
