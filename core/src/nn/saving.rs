//! Saving and loading tensors as safetensors (issue 40), the format people exchange weights
//! in: a little-endian JSON header (each tensor's dtype, shape and byte range) and the raw
//! bytes, every strata dtype by its safetensors name. A module's parameters are saved by
//! position (`param.0`, `param.1`, … in `parameters()` order) and loaded back into the same
//! layers, checked tensor by tensor.
//!
//! ```
//! use strata_core::nn::{load_tensors, save_tensors};
//! use strata_core::{Device, DType, Tensor};
//! let dev = Device::cpu();
//! let path = std::env::temp_dir().join(format!("strata-doc-{}.safetensors", std::process::id()));
//! let w = Tensor::arange(0, 6, 1, DType::I16, &dev)?.reshape([2, 3])?;
//! save_tensors(&path, &[("w", &w)])?;
//! let loaded = load_tensors(&path, &dev)?;
//! assert_eq!(loaded[0].0, "w");
//! assert_eq!(loaded[0].1.to_vec::<i16>()?, vec![0, 1, 2, 3, 4, 5]);
//! # std::fs::remove_file(&path).ok();
//! # Ok::<(), strata_core::Error>(())
//! ```

use super::layers::Module;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::tensor::Tensor;
use safetensors::tensor::{Dtype, SafeTensors, View};
use std::borrow::Cow;
use std::path::Path;

/// A tensor's bytes on the host, as safetensors writes them.
struct HostTensor {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &HostTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// safetensors' name for `dtype`.
fn to_format(dtype: DType) -> Dtype {
    match dtype {
        DType::Bool => Dtype::BOOL,
        DType::U8 => Dtype::U8,
        DType::U16 => Dtype::U16,
        DType::U32 => Dtype::U32,
        DType::U64 => Dtype::U64,
        DType::I8 => Dtype::I8,
        DType::I16 => Dtype::I16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
    }
}

/// strata's dtype for a safetensors one, or `Err` naming a dtype strata has not (FP8, …).
fn from_format(dtype: Dtype, name: &str) -> Result<DType> {
    Ok(match dtype {
        Dtype::BOOL => DType::Bool,
        Dtype::U8 => DType::U8,
        Dtype::U16 => DType::U16,
        Dtype::U32 => DType::U32,
        Dtype::U64 => DType::U64,
        Dtype::I8 => DType::I8,
        Dtype::I16 => DType::I16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        other => {
            return Err(Error::Unsupported(format!(
                "tensor {name:?} is {other:?}, a dtype strata has not"
            )))
        }
    })
}

/// An `Err` naming the file.
fn bad(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("{}: {what}", path.display()))
}

/// Writes `tensors` (name, tensor) to a safetensors file at `path` (each read from its
/// device; views are written as their values). `Err` for a name given twice.
pub fn save_tensors(path: impl AsRef<Path>, tensors: &[(&str, &Tensor)]) -> Result<()> {
    let path = path.as_ref();
    let mut host = Vec::with_capacity(tensors.len());
    for (k, (name, t)) in tensors.iter().enumerate() {
        if tensors[..k].iter().any(|(n, _)| n == name) {
            return Err(Error::Invalid(format!(
                "save_tensors: the name {name:?} is given twice"
            )));
        }
        host.push(HostTensor {
            dtype: to_format(t.dtype()),
            shape: t.shape().to_vec(),
            bytes: t.host_bytes()?,
        });
    }
    let named: Vec<(&str, &HostTensor)> = tensors.iter().map(|(n, _)| *n).zip(&host).collect();
    let bytes = safetensors::serialize(named, None)
        .map_err(|e| Error::Invalid(format!("save_tensors: {e}")))?;
    std::fs::write(path, bytes).map_err(|e| bad(path, format!("cannot write: {e}")))
}

/// The tensors of the safetensors file at `path`, as (name, tensor) on `device`, in the
/// file's order of names.
pub fn load_tensors(path: impl AsRef<Path>, device: &Device) -> Result<Vec<(String, Tensor)>> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| bad(path, format!("cannot read: {e}")))?;
    let file = SafeTensors::deserialize(&bytes)
        .map_err(|e| bad(path, format!("not a safetensors file: {e}")))?;
    let mut out = Vec::new();
    for (name, view) in file.iter() {
        let dtype = from_format(view.dtype(), name)?;
        let t = Tensor::alloc(view.shape(), dtype, device)?;
        let expected = Layout::contiguous(view.shape())?.numel() * dtype.itemsize();
        if view.data().len() != expected {
            return Err(bad(
                path,
                format!("tensor {name:?} has the wrong byte count"),
            ));
        }
        device.upload_bytes(
            t.realized_buffer()?.as_ref(),
            0,
            view.data(),
            device.current_stream().id(),
        )?;
        out.push((name.to_string(), t));
    }
    Ok(out)
}

/// Writes `module`'s parameters to `path`, named by position (`param.0`, …).
///
/// ```
/// use strata_core::nn::{load_parameters, save_parameters, Linear, Module};
/// use strata_core::{random::Generator, Device, DType};
/// let dev = Device::cpu();
/// let path = std::env::temp_dir().join(format!("strata-doc-p{}.safetensors", std::process::id()));
/// let a = Linear::new(3, 2, true, DType::F32, &mut Generator::new(1), &dev)?;
/// let b = Linear::new(3, 2, true, DType::F32, &mut Generator::new(2), &dev)?;
/// save_parameters(&a, &path)?;
/// load_parameters(&b, &path)?;
/// assert_eq!(b.weight.to_vec::<f32>()?, a.weight.to_vec::<f32>()?);
/// # std::fs::remove_file(&path).ok();
/// # Ok::<(), strata_core::Error>(())
/// ```
pub fn save_parameters(module: &dyn Module, path: impl AsRef<Path>) -> Result<()> {
    let params = module.parameters();
    let names: Vec<String> = (0..params.len()).map(|k| format!("param.{k}")).collect();
    let named: Vec<(&str, &Tensor)> = names.iter().map(String::as_str).zip(&params).collect();
    save_tensors(path, &named)
}

/// Writes the parameters saved by [`save_parameters`] at `path` into `module`'s (in place,
/// as an optimizer step does), each checked for its shape and dtype; `Err` (nothing written)
/// when the file does not hold exactly the module's parameters.
pub fn load_parameters(module: &dyn Module, path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    let params = module.parameters();
    let Some(first) = params.first() else {
        return Ok(());
    };
    let loaded = load_tensors(path, first.device())?;
    let mut values = Vec::with_capacity(params.len());
    for (k, p) in params.iter().enumerate() {
        let name = format!("param.{k}");
        let Some((_, t)) = loaded.iter().find(|(n, _)| *n == name) else {
            return Err(bad(
                path,
                format!("no {name} (the module has {} parameters)", params.len()),
            ));
        };
        if t.shape() != p.shape() || t.dtype() != p.dtype() {
            return Err(Error::Shape(format!(
                "{}: {name} is {:?} {}, the module's parameter {:?} {}",
                path.display(),
                t.shape(),
                t.dtype(),
                p.shape(),
                p.dtype()
            )));
        }
        values.push(t.to_device(p.device())?);
    }
    if loaded.len() != params.len() {
        return Err(bad(
            path,
            format!("{} tensors for {} parameters", loaded.len(), params.len()),
        ));
    }
    crate::autograd::no_grad(|| {
        params
            .iter()
            .zip(&values)
            .try_for_each(|(p, v)| p.assign(v))
    })
}
