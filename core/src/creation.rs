//! Creating tensors: constants, ranges, identity, and from host data.

use crate::device::Device;
use crate::dtype::{DType, Element, Scalar};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, Expr, Kernel};
use crate::layout::{shape_arg, IntoDims, Layout};
use crate::tensor::{launch, Tensor};

impl Tensor {
    /// A tensor of `dims` filled with `value` converted to `dtype` (strata's cast rules).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([2, 2], 7.9, DType::I32, &Device::cpu()).unwrap();
    /// assert_eq!(t.to_vec::<i32>().unwrap(), vec![7; 4]);
    /// ```
    pub fn full(
        dims: impl IntoDims,
        value: impl Into<Scalar>,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let t = Tensor::empty(dims, dtype, device)?;
        t.fill(value)?;
        Ok(t)
    }

    /// A 0-d tensor holding `value`, with `value`'s dtype.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::scalar(2.5f32, &Device::cpu()).unwrap();
    /// assert_eq!((t.ndim(), t.dtype()), (0, DType::F32));
    /// assert_eq!(t.item::<f32>().unwrap(), 2.5);
    /// ```
    pub fn scalar(value: impl Into<Scalar>, device: &Device) -> Result<Tensor> {
        let value = value.into();
        Tensor::full([0usize; 0], value, value.dtype(), device)
    }

    /// A tensor of zeros.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([3], DType::F16, &Device::cpu()).unwrap();
    /// assert_eq!(t.to_vec::<half::f16>().unwrap(), vec![half::f16::ZERO; 3]);
    /// ```
    pub fn zeros(dims: impl IntoDims, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(dims, false, dtype, device)
    }

    /// A tensor of ones.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::ones([2], DType::Bool, &Device::cpu()).unwrap();
    /// assert_eq!(t.to_vec::<bool>().unwrap(), vec![true, true]);
    /// ```
    pub fn ones(dims: impl IntoDims, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(dims, true, dtype, device)
    }

    /// An uninitialized tensor with `self`'s shape, dtype and device (see [`Tensor::empty`]).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::ones([2, 3], DType::U8, &Device::cpu()).unwrap();
    /// assert_eq!(t.t().unwrap().empty_like().unwrap().shape(), &[3, 2]);
    /// ```
    pub fn empty_like(&self) -> Result<Tensor> {
        Tensor::alloc(self.shape(), self.dtype, self.device())
    }

    /// Zeros with `self`'s shape, dtype and device.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::ones([2], DType::U8, &Device::cpu()).unwrap();
    /// assert_eq!(t.zeros_like().unwrap().to_vec::<u8>().unwrap(), vec![0, 0]);
    /// ```
    pub fn zeros_like(&self) -> Result<Tensor> {
        self.full_like(false)
    }

    /// Ones with `self`'s shape, dtype and device.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([2], DType::I8, &Device::cpu()).unwrap();
    /// assert_eq!(t.ones_like().unwrap().to_vec::<i8>().unwrap(), vec![1, 1]);
    /// ```
    pub fn ones_like(&self) -> Result<Tensor> {
        self.full_like(true)
    }

    /// `value` with `self`'s shape, dtype and device.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([2], DType::F64, &Device::cpu()).unwrap();
    /// assert_eq!(t.full_like(0.5).unwrap().to_vec::<f64>().unwrap(), vec![0.5, 0.5]);
    /// ```
    pub fn full_like(&self, value: impl Into<Scalar>) -> Result<Tensor> {
        let t = self.empty_like()?;
        t.fill(value)?;
        Ok(t)
    }

    /// Values from `start` up to (not including) `end` in steps of `step`, as `dtype`.
    /// With integer arguments and an integer dtype the values are exact; otherwise they are
    /// `start + i·step` computed in `f64` and converted (as PyTorch).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let t = Tensor::arange(5, -1, -2, DType::I8, &dev).unwrap();
    /// assert_eq!(t.to_vec::<i8>().unwrap(), vec![5, 3, 1]);
    /// let f = Tensor::arange(0.0, 1.0, 0.25, DType::F32, &dev).unwrap();
    /// assert_eq!(f.to_vec::<f32>().unwrap(), vec![0.0, 0.25, 0.5, 0.75]);
    /// assert!(Tensor::arange(0, 5, 0, DType::I32, &dev).is_err());
    /// ```
    pub fn arange(
        start: impl Into<Scalar>,
        end: impl Into<Scalar>,
        step: impl Into<Scalar>,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let (start, end, step) = (start.into(), end.into(), step.into());
        let bad =
            |why: &str| Error::Invalid(format!("arange({start}, {end}, {step}) as {dtype}: {why}"));
        if dtype == DType::Bool {
            return Err(bad("bool has no ranges; use an integer dtype"));
        }
        let exact = dtype.is_int() && [start, end, step].iter().all(|s| !s.dtype().is_float());
        let (len, compute) = if exact {
            let (a, b, s) = (start.to_i128(), end.to_i128(), step.to_i128());
            if s == 0 || (b - a).signum() * s.signum() < 0 {
                return Err(bad("the step must be non-zero and point from start to end"));
            }
            ((b - a + s - s.signum()) / s, DType::I64)
        } else {
            let (a, b, s) = (start.to_f64(), end.to_f64(), step.to_f64());
            let len = ((b - a) / s).ceil();
            if s == 0.0 || !len.is_finite() || len < 0.0 {
                return Err(bad("the step must be non-zero and point from start to end"));
            }
            (len as i128, DType::F64)
        };
        let len = usize::try_from(len).map_err(|_| bad("too many elements"))?;
        let out = Tensor::empty([len], dtype, device)?;
        let index = Expr::linear_index().cast(compute, false);
        let value = Expr::binary(
            BinaryOp::Add,
            Expr::scalar(0, compute),
            Expr::binary(BinaryOp::Mul, index, Expr::scalar(1, compute)),
        );
        let scalars = vec![start.cast(compute, false), step.cast(compute, false)];
        launch(Kernel::map(value.cast(dtype, false)), &out, &[], scalars)?;
        Ok(out)
    }

    /// `steps` values evenly spaced from `start` to `end` inclusive, computed in `f64` as
    /// PyTorch does (from `start` for the first half, from `end` for the second), then
    /// converted to `dtype`.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::linspace(0.0, 1.0, 5, DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.to_vec::<f32>().unwrap(), vec![0.0, 0.25, 0.5, 0.75, 1.0]);
    /// ```
    pub fn linspace(
        start: f64,
        end: f64,
        steps: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let out = Tensor::empty([steps], dtype, device)?;
        let step = if steps > 1 {
            (end - start) / (steps - 1) as f64
        } else {
            0.0
        };
        let f = |k| Expr::scalar(k, DType::F64);
        let index = || Expr::linear_index().cast(DType::F64, false);
        let from_start = Expr::binary(
            BinaryOp::Add,
            f(0),
            Expr::binary(BinaryOp::Mul, index(), f(1)),
        );
        let remaining = Expr::binary(BinaryOp::Sub, f(3), index());
        let from_end = Expr::binary(
            BinaryOp::Sub,
            f(2),
            Expr::binary(BinaryOp::Mul, remaining, f(1)),
        );
        let first_half = Expr::binary(BinaryOp::Lt, index(), f(4));
        let value = Expr::select(first_half, from_start, from_end);
        // One step gives `start`, so the first half covers at least element 0.
        let scalars = [
            start,
            step,
            end,
            steps as f64 - 1.0,
            (steps / 2).max(1) as f64,
        ]
        .map(Scalar::F64)
        .to_vec();
        launch(Kernel::map(value.cast(dtype, false)), &out, &[], scalars)?;
        Ok(out)
    }

    /// The `n × n` identity matrix.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::eye(2, DType::U8, &Device::cpu()).unwrap();
    /// assert_eq!(t.to_vec::<u8>().unwrap(), vec![1, 0, 0, 1]);
    /// ```
    pub fn eye(n: usize, dtype: DType, device: &Device) -> Result<Tensor> {
        let t = Tensor::zeros([n, n], dtype, device)?;
        // The diagonal is a strided view: one step of a row plus one column.
        t.as_strided([n], [n + 1], 0)?.fill(true)?;
        Ok(t)
    }

    /// A tensor of shape `dims` holding a copy of `data` (row-major).
    ///
    /// ```
    /// use strata_core::{Device, Tensor};
    /// let t = Tensor::from_slice(&[1u16, 2, 3, 4], [2, 2], &Device::cpu()).unwrap();
    /// assert_eq!(t.dtype(), strata_core::DType::U16);
    /// assert!(Tensor::from_slice(&[1u16, 2, 3], [2, 2], &Device::cpu()).is_err());
    /// ```
    pub fn from_slice<T: Element>(
        data: &[T],
        dims: impl IntoDims,
        device: &Device,
    ) -> Result<Tensor> {
        let shape = shape_arg(dims)?;
        let numel = Layout::contiguous(&shape)?.numel();
        if numel != data.len() {
            return Err(Error::Shape(format!(
                "{} values cannot fill shape {shape:?}, which has {numel} elements",
                data.len()
            )));
        }
        let t = Tensor::alloc(&shape, T::DTYPE, device)?;
        let stream = device.current_stream();
        device.upload_bytes(
            t.realized_buffer()?.as_ref(),
            0,
            T::as_bytes(data),
            stream.id(),
        )?;
        Ok(t)
    }

    /// A tensor of shape `dims` holding `data` (row-major).
    ///
    /// ```
    /// use strata_core::{Device, Tensor};
    /// let t = Tensor::from_vec(vec![1.5f64, 2.5], [2, 1], &Device::cpu()).unwrap();
    /// assert_eq!(t.shape(), &[2, 1]);
    /// ```
    pub fn from_vec<T: Element>(
        data: Vec<T>,
        dims: impl IntoDims,
        device: &Device,
    ) -> Result<Tensor> {
        Tensor::from_slice(&data, dims, device)
    }

    /// A tensor holding a copy of an ndarray array of any layout (its logical order is kept).
    ///
    /// ```
    /// use strata_core::{Device, Tensor};
    /// let a = ndarray::array![[1i32, 2, 3], [4, 5, 6]];
    /// let t = Tensor::from_ndarray(&a.t(), &Device::cpu()).unwrap();
    /// assert_eq!(t.shape(), &[3, 2]);
    /// assert_eq!(t.to_vec::<i32>().unwrap(), vec![1, 4, 2, 5, 3, 6]);
    /// ```
    pub fn from_ndarray<T, S, D>(
        array: &ndarray::ArrayBase<S, D>,
        device: &Device,
    ) -> Result<Tensor>
    where
        T: Element,
        S: ndarray::Data<Elem = T>,
        D: ndarray::Dimension,
    {
        let data: Vec<T> = array.iter().copied().collect();
        Tensor::from_slice(&data, array.shape(), device)
    }
}
