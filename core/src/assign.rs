//! Writing into tensors and views: `assign`, `fill`, `set`.

use crate::dtype::Scalar;
use crate::error::{Error, Result};
use crate::fusion::defer_or_launch;
use crate::index::IndexArgs;
use crate::ir::{Expr, Kernel};
use crate::layout::Layout;
use crate::tensor::{launch, launch_writing, Tensor};

/// What can be written into a view: a tensor (broadcast to the view) or a scalar.
///
/// ```
/// use strata_core::{Device, DType, Tensor, Value};
/// let t = Tensor::zeros([2], DType::F32, &Device::cpu()).unwrap();
/// assert!(matches!(Value::from(3u8), Value::Scalar(_)));
/// assert!(matches!(Value::from(&t), Value::Tensor(_)));
/// ```
#[derive(Debug, Clone)]
pub enum Value {
    /// A tensor, broadcast to the destination's shape and converted to its dtype.
    Tensor(Tensor),
    /// A scalar, converted to the destination's dtype.
    Scalar(Scalar),
}

impl From<&Tensor> for Value {
    fn from(t: &Tensor) -> Value {
        Value::Tensor(t.clone())
    }
}

/// A [`Value`] borrowed: what an elementwise op reads its operands as, so an operator on
/// tensors the caller holds (`&a + &b`) clones no tensor to check and lower them.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ValueRef<'a> {
    Tensor(&'a Tensor),
    Scalar(Scalar),
}

impl<'a> From<&'a Value> for ValueRef<'a> {
    fn from(v: &'a Value) -> ValueRef<'a> {
        match v {
            Value::Tensor(t) => ValueRef::Tensor(t),
            Value::Scalar(s) => ValueRef::Scalar(*s),
        }
    }
}

impl<'a> From<&'a Tensor> for ValueRef<'a> {
    fn from(t: &'a Tensor) -> ValueRef<'a> {
        ValueRef::Tensor(t)
    }
}
impl From<Tensor> for Value {
    fn from(t: Tensor) -> Value {
        Value::Tensor(t)
    }
}
impl From<Scalar> for Value {
    fn from(s: Scalar) -> Value {
        Value::Scalar(s)
    }
}
macro_rules! value_from_scalar {
    ($($t:ty),*) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Value {
                Value::Scalar(v.into())
            }
        }
    )*};
}
value_from_scalar!(
    bool,
    u8,
    u16,
    u32,
    u64,
    i8,
    i16,
    i32,
    i64,
    half::f16,
    half::bf16,
    f32,
    f64
);

impl Tensor {
    /// Writes `value` into every element of this view (through to the shared storage). A
    /// tensor is broadcast to the view's shape; values are converted to the view's dtype. A
    /// tensor of another device is copied over first (PyTorch's `copy_`), device to device
    /// between two CUDA devices.
    ///
    /// ```
    /// use strata_core::{s, Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let t = Tensor::zeros([2, 3], DType::I32, &dev).unwrap();
    /// let row = Tensor::from_slice(&[1i32, 2, 3], [3], &dev).unwrap();
    /// t.assign(&row).unwrap();
    /// assert_eq!(t.to_vec::<i32>().unwrap(), vec![1, 2, 3, 1, 2, 3]);
    /// ```
    pub fn assign(&self, value: impl Into<Value>) -> Result<()> {
        match value.into() {
            Value::Scalar(s) => self.fill(s),
            Value::Tensor(src) => {
                // A copy is the one op that takes another device's tensor (PyTorch's `copy_`):
                // device to device where the backends can, else through the host.
                let src = if src.device().shares_memory_with(self.device()) {
                    src
                } else {
                    src.to_device(self.device())?
                };
                crate::autograd::refuse_write_into(self)?;
                crate::autograd::refuse_in_place_source(&src, "assign")?;
                // A pending tree only `src` holds is computed straight into this view.
                if src.shape() == self.shape() {
                    if let Some(m) = crate::fusion::tree_as_map(&src)? {
                        drop(src);
                        let leaves: Vec<&Tensor> = m.leaves.iter().collect();
                        let expr = m.expr.cast(self.dtype, false);
                        return launch(Kernel::map(expr), self, &leaves, m.scalars);
                    }
                }
                let src = src.broadcast_to(self.shape())?;
                let expr = Expr::input(0, src.dtype).cast(self.dtype, false);
                launch(Kernel::map(expr), self, &[&src], vec![])
            }
        }
    }

    /// Writes `value` (converted to the dtype) into every element of this view.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([3], DType::U8, &Device::cpu()).unwrap();
    /// t.fill(300).unwrap(); // wraps like a cast: 300 as u8 = 44
    /// assert_eq!(t.to_vec::<u8>().unwrap(), vec![44; 3]);
    /// ```
    pub fn fill(&self, value: impl Into<Scalar>) -> Result<()> {
        crate::autograd::refuse_write_into(self)?;
        let value = value.into().cast(self.dtype, false);
        launch(
            Kernel::map(Expr::scalar(0, self.dtype)),
            self,
            &[],
            vec![value],
        )
    }

    /// Writes `value` into the view selected by `index` (like `t[index] = value`).
    ///
    /// ```
    /// use strata_core::{s, Device, DType, Tensor};
    /// let t = Tensor::zeros([2, 3], DType::F32, &Device::cpu()).unwrap();
    /// t.set(s![.., 2], 1.0).unwrap();
    /// assert_eq!(t.to_vec::<f32>().unwrap(), vec![0.0, 0.0, 1.0, 0.0, 0.0, 1.0]);
    /// ```
    ///
    /// With a tensor of indices in the expression, the selected positions are written
    /// (SambaTensor's `t[None, :, idx] = v`):
    ///
    /// ```
    /// use strata_core::{s, Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let t = Tensor::zeros([2, 3], DType::F32, &dev).unwrap();
    /// let idx = Tensor::from_slice(&[0i64, 2], [2], &dev).unwrap();
    /// t.set(s![NewAxis, .., &idx], 2.0).unwrap();
    /// assert_eq!(t.to_vec::<f32>().unwrap(), vec![2.0, 0.0, 2.0, 2.0, 0.0, 2.0]);
    /// ```
    pub fn set(&self, index: impl IndexArgs, value: impl Into<Value>) -> Result<()> {
        let args = index.into_args()?;
        let Some((basic, axis, idx)) = crate::index::split_tensor_index(&args, self.ndim())? else {
            return self.slice(args)?.assign(value);
        };
        let view = self.slice(basic)?;
        // The selected shape has the index's axes in place of `axis`; flatten them to one.
        let selected = crate::index::with_index_axes(view.shape(), axis, idx.shape());
        let mut flat = view.shape().to_vec();
        flat[axis] = idx.numel();
        let value = match value.into() {
            Value::Tensor(t) => Value::Tensor(t.broadcast_to(selected)?.reshape(flat)?),
            scalar => scalar,
        };
        view.index_put_(axis as isize, &idx.reshape([-1])?, value, false)
    }
}

/// Writes `values[k]` into `targets[k]` for every `k`, each value an elementwise expression
/// over `inputs` (views of the targets' shape) and `scalars`, every one computed from the
/// values before any write (an optimizer's step: the parameter and its state). One kernel
/// writes them all where the backend's target allows as many outputs and bindings; otherwise
/// each value is computed into a new tensor first and then assigned, which reads the same.
pub(crate) fn write_values(
    targets: &[&Tensor],
    values: Vec<Expr>,
    inputs: &[&Tensor],
    scalars: Vec<Scalar>,
) -> Result<()> {
    let (Some(first), true) = (targets.first(), targets.len() == values.len()) else {
        return Err(Error::Invalid(format!(
            "write_values: {} targets for {} values",
            targets.len(),
            values.len()
        )));
    };
    for (k, t) in targets.iter().enumerate() {
        first.same_device(t, "cannot write together")?;
        crate::autograd::refuse_write_into(t)?;
        if t.shape() != first.shape() {
            return Err(Error::Shape(format!(
                "tensors written together have shapes {:?} and {:?}",
                first.shape(),
                t.shape()
            )));
        }
        if targets[..k].iter().any(|o| o.shares_storage(t)) {
            return Err(Error::Invalid(format!(
                "two tensors written together (shape {:?}) share one storage",
                t.shape()
            )));
        }
    }
    for t in inputs {
        first.same_device(t, "cannot write together")?;
    }
    let values: Vec<Expr> = values
        .into_iter()
        .zip(targets)
        .map(|(v, t)| v.cast(t.dtype, false))
        .collect();
    let device = first.device();
    let target = device.backend().target();
    // Further outputs of one map may not read the position (see `Kernel::Map`).
    let positional = values[1..].iter().any(Expr::reads_linear_index);
    let fits =
        targets.len() <= target.max_map_outputs && target.binds(targets.len() + inputs.len());
    if fits && !positional {
        let (expr, also) = values.split_first().expect("one value at least");
        let kernel = Kernel::Map {
            expr: expr.clone(),
            also: also.to_vec(),
        };
        return launch_writing(kernel, first, &targets[1..], inputs, scalars);
    }
    // Each new value pending (or computed) from the old ones; a write runs the values that
    // read its target first, so every value sees the targets before the step.
    let layout = Layout::contiguous(first.shape())?;
    let owned: Vec<Tensor> = inputs.iter().map(|&t| t.clone()).collect();
    let mut computed = Vec::with_capacity(values.len());
    for v in values {
        let value = defer_or_launch(
            v,
            layout.clone(),
            owned.clone(),
            scalars.clone(),
            device,
            "write_values",
        )?;
        computed.push(value);
    }
    for (t, v) in targets.iter().zip(&computed) {
        t.assign(v)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Device};

    /// `n` tensors rotated (`t[k] ← t[k + 1] + 10`): every value reads a tensor another one
    /// writes, so a result from a new value would show. Past the target's eight map outputs
    /// the values run one by one.
    fn rotate(n: usize) -> Vec<f32> {
        let dev = Device::cpu();
        let ts: Vec<Tensor> = (0..n)
            .map(|k| Tensor::full([3], k as f32, DType::F32, &dev).unwrap())
            .collect();
        let refs: Vec<&Tensor> = ts.iter().collect();
        let values = (0..n)
            .map(|k| {
                let next = Expr::input((k + 1) % n, DType::F32);
                Expr::binary(crate::ir::BinaryOp::Add, next, Expr::scalar(0, DType::F32))
            })
            .collect();
        write_values(&refs, values, &refs, vec![Scalar::F32(10.0)]).unwrap();
        ts.iter().map(|t| t.to_vec::<f32>().unwrap()[2]).collect()
    }

    #[test]
    fn every_value_reads_the_tensors_before_the_write() {
        assert_eq!(rotate(3), vec![11.0, 12.0, 10.0]);
        let many = rotate(9);
        assert_eq!(many[0], 11.0);
        assert_eq!(many[8], 10.0);
    }
}
