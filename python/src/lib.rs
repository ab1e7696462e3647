//! `import strata`: strata tensors in Python, for DLPack exchange. Just enough to make, show
//! and change a tensor, plus the protocol: `__dlpack__` / `__dlpack_device__` on
//! `strata.Tensor` (so `torch.from_dlpack`, `cupy.from_dlpack` and `numpy.from_dlpack` take
//! strata tensors) and `strata.from_dlpack(obj)` (so strata takes theirs), without copying.
//! The semantics live in `strata_core::dlpack`; this file only translates the Python protocol.

use dlpark::python::consumer::stream;
use dlpark::python::{CudaStreamRequest, DlpackStream, ExportAbi, ExportRequest, ImportedDlpack};
use pyo3::exceptions::{PyBufferError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::{Mutex, OnceLock};
use strata::dlpack::{ConsumerStream, DLDevice, DLDeviceType, ExportOptions};
use strata::prelude::*;
use strata::sync::LockUnpoisoned;

/// A strata error as the Python exception a DLPack user expects: `BufferError` where an
/// exchange cannot be made (the protocol's choice), `TypeError` for dtypes.
fn py_err(e: strata::Error) -> PyErr {
    let text = e.to_string();
    match e {
        Error::Unsupported(_) | Error::DeviceMismatch(_) => PyBufferError::new_err(text),
        Error::DType(_) | Error::DTypeMismatch { .. } => PyTypeError::new_err(text),
        Error::Shape(_) | Error::Index(_) | Error::Invalid(_) => PyValueError::new_err(text),
        _ => PyRuntimeError::new_err(text),
    }
}

/// Devices by name, opened once per process (a CUDA context and its kernel cache are costly,
/// and tensors of two separately opened devices cannot be combined).
fn device(spec: &str) -> PyResult<Device> {
    static OPEN: OnceLock<Mutex<Vec<(String, Device)>>> = OnceLock::new();
    let spec = match spec.trim().to_ascii_lowercase().as_str() {
        "cuda" => "cuda:0".to_string(),
        s => s.to_string(),
    };
    let mut open = OPEN
        .get_or_init(|| Mutex::new(Vec::new()))
        .lock_unpoisoned();
    if let Some((_, d)) = open.iter().find(|(n, _)| *n == spec) {
        return Ok(d.clone());
    }
    let d = Device::parse(&spec).map_err(py_err)?;
    open.push((spec, d.clone()));
    Ok(d)
}

/// The strata device that can wrap memory on `d` without a copy.
fn device_of(d: DLDevice) -> PyResult<Device> {
    match d.device_type {
        DLDeviceType::CPU => device("cpu"),
        DLDeviceType::CUDA => device(&format!("cuda:{}", d.device_id)),
        other => Err(PyBufferError::new_err(format!(
            "strata cannot take DLPack tensors of device type {} (it takes CPU and CUDA memory)",
            other.0
        ))),
    }
}

fn dtype(name: &str) -> PyResult<DType> {
    name.parse::<DType>().map_err(py_err)
}

/// A strata tensor.
#[pyclass(name = "Tensor", module = "strata", frozen)]
struct PyTensor {
    inner: Tensor,
}

impl From<Tensor> for PyTensor {
    fn from(inner: Tensor) -> PyTensor {
        PyTensor { inner }
    }
}

#[pymethods]
impl PyTensor {
    /// The Python array API's DLPack export: a capsule over this tensor's memory (a copy only
    /// where `copy=True`, or `dl_device` asks for the CPU, or the tensor is on wgpu and a copy
    /// is allowed). The consumer's `stream` waits for the tensor's pending work.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(u32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let request = ExportRequest::parse(stream.as_ref(), max_version, dl_device, copy)?;
        let own = self.inner.dlpack_device();
        let to_cuda = own.is_some_and(|d| d.device_type == DLDeviceType::CUDA)
            && request.device().is_none_or(|d| Some(d) == own);
        let consumer = if to_cuda {
            match request.cuda_stream()? {
                CudaStreamRequest::Omitted => ConsumerStream::Unnamed,
                CudaStreamRequest::NoSync => ConsumerStream::NoSync,
                CudaStreamRequest::LegacyDefault => ConsumerStream::Native(1),
                CudaStreamRequest::PerThreadDefault => ConsumerStream::Native(2),
                CudaStreamRequest::Pointer(p) => ConsumerStream::Native(p as u64),
            }
        } else {
            ConsumerStream::from_protocol(stream.map(|s| s.extract::<i64>()).transpose()?)
        };
        let options = ExportOptions {
            stream: consumer,
            copy,
            device: request.device(),
        };
        Ok(match request.abi() {
            ExportAbi::Versioned => self
                .inner
                .to_dlpack_with(&options)
                .map_err(py_err)?
                .into_pyobject(py)?
                .unbind(),
            ExportAbi::Legacy => self
                .inner
                .to_legacy_dlpack_with(&options)
                .map_err(py_err)?
                .into_pyobject(py)?
                .unbind(),
        })
    }

    /// `(device type, ordinal)` as DLPack numbers them: `(1, 0)` CPU, `(2, n)` CUDA, and
    /// `(7, 0)` (Vulkan) for a wgpu tensor, which exports only through a copy.
    fn __dlpack_device__(&self) -> (u32, i32) {
        match self.inner.dlpack_device() {
            Some(d) => (d.device_type.0, d.device_id),
            None => (DLDeviceType::VULKAN.0, 0),
        }
    }

    /// The size of each axis.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.inner.shape().to_vec()
    }

    /// Strides in elements (negative for reversed axes, 0 for broadcast ones).
    #[getter]
    fn strides(&self) -> Vec<isize> {
        self.inner.strides().to_vec()
    }

    /// The dtype's name: `f32`, `bf16`, `bool`, …
    #[getter]
    fn dtype(&self) -> &'static str {
        self.inner.dtype().name()
    }

    /// The device's name: `cpu`, `cuda:0`, `wgpu:<adapter>`.
    #[getter]
    fn device(&self) -> String {
        self.inner.device().name()
    }

    /// True when the producer of an imported tensor lent it read-only.
    #[getter]
    fn is_read_only(&self) -> bool {
        self.inner.is_read_only()
    }

    /// The address of the first element (host or device), as `torch.Tensor.data_ptr()`.
    fn data_ptr(&self) -> PyResult<u64> {
        self.inner.data_ptr().map_err(py_err)
    }

    /// The elements in row-major order, as floats (waits for the device).
    fn tolist(&self) -> PyResult<Vec<f64>> {
        self.inner
            .to_dtype(DType::F64)
            .and_then(|t| t.to_vec::<f64>())
            .map_err(py_err)
    }

    /// Sets every element to `value` (through views, into the shared memory).
    fn fill_(&self, value: f64) -> PyResult<()> {
        self.inner.fill(value).map_err(py_err)
    }

    /// Adds `value` to every element in place.
    fn add_(&self, value: f64) -> PyResult<()> {
        self.inner.add_(value).map(|_| ()).map_err(py_err)
    }

    /// A new contiguous tensor with the same values.
    fn copy(&self) -> PyResult<PyTensor> {
        self.inner.copy().map(PyTensor::from).map_err(py_err)
    }

    /// This tensor with its axes reversed (a view: strides reversed).
    #[getter(T)]
    fn transposed(&self) -> PyResult<PyTensor> {
        let order: Vec<usize> = (0..self.inner.ndim()).rev().collect();
        self.inner
            .permute(order)
            .map(PyTensor::from)
            .map_err(py_err)
    }

    /// The first axis reversed: a view with a negative stride, over the same memory.
    fn reversed(&self) -> PyResult<PyTensor> {
        self.inner
            .slice(s![..;-1])
            .map(PyTensor::from)
            .map_err(py_err)
    }

    /// The sum of every element, as a float.
    fn sum(&self) -> PyResult<f64> {
        self.inner
            .to_dtype(DType::F64)
            .and_then(|t| t.sum(strata::ops::Axes::All, false))
            .and_then(|t| t.item::<f64>())
            .map_err(py_err)
    }

    fn __repr__(&self) -> String {
        self.inner.to_string()
    }
}

/// A tensor of `values` (row-major) with `shape` (default: one axis), cast to `dtype`.
#[pyfunction]
#[pyo3(signature = (values, shape=None, dtype="f32", device="cpu"))]
fn tensor(
    values: Vec<f64>,
    shape: Option<Vec<usize>>,
    dtype: &str,
    device: &str,
) -> PyResult<PyTensor> {
    let shape = shape.unwrap_or_else(|| vec![values.len()]);
    let (dev, dtype) = (self::device(device)?, self::dtype(dtype)?);
    Tensor::from_slice(&values, shape, &dev)
        .and_then(|t| t.to_dtype(dtype))
        .map(PyTensor::from)
        .map_err(py_err)
}

/// `0, 1, …, n - 1` as `dtype` on `device`.
#[pyfunction]
#[pyo3(signature = (n, dtype="f32", device="cpu"))]
fn arange(n: i64, dtype: &str, device: &str) -> PyResult<PyTensor> {
    Tensor::arange(0, n, 1, self::dtype(dtype)?, &self::device(device)?)
        .map(PyTensor::from)
        .map_err(py_err)
}

/// A tensor of zeros.
#[pyfunction]
#[pyo3(signature = (shape, dtype="f32", device="cpu"))]
fn zeros(shape: Vec<usize>, dtype: &str, device: &str) -> PyResult<PyTensor> {
    Tensor::zeros(shape, self::dtype(dtype)?, &self::device(device)?)
        .map(PyTensor::from)
        .map_err(py_err)
}

/// strata's current stream on a device, as a DLPack consumer names it to the producer.
struct Consumer(Device);

// SAFETY: the handle is the device's live current stream (CUDA) or no stream (CPU), valid for
// the whole `__dlpack__` call; a producer's native stream is waited on through the backend.
unsafe impl DlpackStream for Consumer {
    fn as_python_arg(&self, _py: Python<'_>, device: DLDevice) -> PyResult<stream::StreamArg> {
        if device.device_type != DLDeviceType::CUDA {
            return Ok(stream::none());
        }
        let id = self.0.current_stream().id();
        let handle = self.0.backend().native_stream(id).map_err(py_err)?;
        Ok(stream::cuda(handle as usize as *mut std::ffi::c_void))
    }

    unsafe fn wait_for_producer(
        &self,
        device: DLDevice,
        producer: *mut std::ffi::c_void,
    ) -> PyResult<bool> {
        if device.device_type != DLDeviceType::CUDA {
            return Ok(false);
        }
        let id = self.0.current_stream().id();
        self.0
            .backend()
            .wait_for_foreign(id, producer as usize as u64)
            .map_err(py_err)?;
        Ok(true)
    }
}

/// Takes another library's tensor (anything with `__dlpack__`, or a capsule) as a strata
/// tensor without a copy: on its own device, or on `device` (a copy where the memory cannot
/// be shared: wgpu, when `copy` is not `False`). The producer's pending work is ordered
/// before strata's current stream.
#[pyfunction]
#[pyo3(signature = (obj, device=None, copy=None))]
fn from_dlpack(
    obj: &Bound<'_, PyAny>,
    device: Option<&str>,
    copy: Option<bool>,
) -> PyResult<PyTensor> {
    let request = dlpark::python::ImportRequest::new(obj.as_borrowed())?;
    let choose = |theirs: DLDevice| match device {
        Some(spec) => self::device(spec),
        None => device_of(theirs),
    };
    let (dev, imported) = match request.device() {
        Ok(theirs) => {
            let dev = choose(theirs)?;
            let ours = dev.backend().dlpack_device();
            if ours.is_some() && ours != Some(theirs) && copy != Some(true) {
                return Err(PyBufferError::new_err(format!(
                    "the tensor is on {}, which {} cannot wrap; leave device unset to take it \
                     where it is",
                    strata::dlpack::device_name(theirs),
                    dev.name()
                )));
            }
            if ours.is_none() && copy == Some(false) {
                return Err(PyBufferError::new_err(format!(
                    "{} cannot wrap another library's memory; allow a copy (copy=None or True)",
                    dev.name()
                )));
            }
            // The producer orders its pending work before strata's current stream.
            let imported = request.import(Some(&Consumer(dev.clone())), None)?;
            (dev, imported)
        }
        // A bare capsule says its device only once it is opened (and takes no stream).
        Err(_) => {
            let imported = request.import(None, None)?;
            let theirs = imported
                .validate()
                .map_err(|e| PyValueError::new_err(format!("a malformed DLPack tensor: {e}")))?
                .device();
            (choose(theirs)?, imported)
        }
    };
    let zero_copy = dev.backend().dlpack_device().is_some() && copy != Some(true);
    let tensor = match (imported, zero_copy) {
        (ImportedDlpack::Versioned(m), true) => Tensor::from_dlpack(m, &dev),
        (ImportedDlpack::Legacy(m), true) => Tensor::from_dlpack(m, &dev),
        (ImportedDlpack::Versioned(m), false) => Tensor::from_dlpack_copy(m, &dev),
        (ImportedDlpack::Legacy(m), false) => Tensor::from_dlpack_copy(m, &dev),
    };
    tensor.map(PyTensor::from).map_err(py_err)
}

/// The allocator's statistics on `device`: `allocated`, `reserved` and `peak` bytes.
#[pyfunction]
#[pyo3(signature = (device="cpu"))]
fn memory_stats<'py>(py: Python<'py>, device: &str) -> PyResult<Bound<'py, PyDict>> {
    let s = self::device(device)?.memory_stats();
    let d = PyDict::new(py);
    d.set_item("allocated", s.allocated)?;
    d.set_item("reserved", s.reserved)?;
    d.set_item("peak", s.peak)?;
    Ok(d)
}

/// Waits for all work on `device`.
#[pyfunction]
#[pyo3(signature = (device="cpu"))]
fn synchronize(device: &str) -> PyResult<()> {
    self::device(device)?.synchronize().map_err(py_err)
}

/// The native handle of strata's current stream on `device` (a `CUstream` on CUDA), for
/// `torch.cuda.ExternalStream` and the like.
#[pyfunction]
#[pyo3(signature = (device="cuda"))]
fn current_stream(device: &str) -> PyResult<u64> {
    let dev = self::device(device)?;
    let id = dev.current_stream().id();
    dev.backend().native_stream(id).map_err(py_err)
}

/// strata for Python: tensors to exchange through DLPack.
#[pymodule]
#[pyo3(name = "strata")]
fn strata_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTensor>()?;
    m.add_function(wrap_pyfunction!(tensor, m)?)?;
    m.add_function(wrap_pyfunction!(arange, m)?)?;
    m.add_function(wrap_pyfunction!(zeros, m)?)?;
    m.add_function(wrap_pyfunction!(from_dlpack, m)?)?;
    m.add_function(wrap_pyfunction!(memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(synchronize, m)?)?;
    m.add_function(wrap_pyfunction!(current_stream, m)?)?;
    Ok(())
}
