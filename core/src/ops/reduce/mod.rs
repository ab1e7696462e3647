//! Reductions: accumulation dtypes (PyTorch's, plus augpy's `upcast`), axes and `keepdim`,
//! and the compositions built from the `Reduce` kernel (mean, var, std, logsumexp, softmax).

mod grad;

use super::promote::DEFAULT_FLOAT;
use crate::dtype::{DType, Scalar};
use crate::error::{Error, Result};
use crate::ir::{Kernel, ReduceOp};
use crate::layout::normalize_axis;
use crate::tensor::{Tensor, Write};

/// Which axes a reduction runs over: all of them, or a list (negative counts from the end).
///
/// ```
/// use strata_core::ops::Axes;
/// assert_eq!(Axes::from(-1), Axes::List(vec![-1]));
/// assert_eq!(Axes::from([0, 2]), Axes::List(vec![0, 2]));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Axes {
    /// Every axis.
    All,
    /// These axes.
    List(Vec<isize>),
}

impl From<isize> for Axes {
    fn from(a: isize) -> Axes {
        Axes::List(vec![a])
    }
}
impl From<i32> for Axes {
    fn from(a: i32) -> Axes {
        Axes::List(vec![a as isize])
    }
}
impl<const N: usize> From<[i32; N]> for Axes {
    fn from(a: [i32; N]) -> Axes {
        Axes::List(a.iter().map(|&x| x as isize).collect())
    }
}
impl<const N: usize> From<[isize; N]> for Axes {
    fn from(a: [isize; N]) -> Axes {
        Axes::List(a.to_vec())
    }
}
impl From<&[isize]> for Axes {
    fn from(a: &[isize]) -> Axes {
        Axes::List(a.to_vec())
    }
}
impl From<Vec<isize>> for Axes {
    fn from(a: Vec<isize>) -> Axes {
        Axes::List(a)
    }
}

impl Tensor {
    /// Launches the reduction `op` of the `reduced` axes (the input's axes in `order`: kept,
    /// then reduced) into a new tensor of `out_shape`, reading a pending elementwise input
    /// directly where the backend fuses maps into reductions.
    fn reduce_now(
        &self,
        op: ReduceOp,
        reduced: &[usize],
        order: &[usize],
        out_shape: &[usize],
        acc: DType,
        out_dtype: DType,
    ) -> Result<Tensor> {
        let out = Tensor::alloc(out_shape, out_dtype, self.device())?;
        let stream = self.device().current_handle();
        let how = (op, reduced.len(), acc);
        launch_reduce(self, how, order, &out, &stream, Write::Existing, None)?;
        Ok(out)
    }

    /// The sorted, distinct axes `axes` names.
    pub(crate) fn reduce_axes(&self, axes: &Axes) -> Result<Vec<usize>> {
        let mut out = match axes {
            Axes::All => (0..self.ndim()).collect(),
            Axes::List(list) => list
                .iter()
                .map(|&a| normalize_axis(a, self.ndim().max(1)))
                .collect::<Result<Vec<_>>>()?,
        };
        out.sort_unstable();
        out.dedup();
        // A 0-d tensor reduces over its (implicit) single position.
        out.retain(|&a| a < self.ndim());
        Ok(out)
    }

    /// Runs one `Reduce` kernel over `axes`, returning `out_dtype`. With fusion on, a
    /// maximum or minimum of a realized tensor is deferred where the backend fuses prologue
    /// reductions: a later reduction of the same rows that reads it (the sum of
    /// `exp(x - max)`) then computes both in one kernel.
    #[track_caller]
    pub(crate) fn reduce_raw(
        &self,
        op: ReduceOp,
        axes: &Axes,
        keepdim: bool,
        acc: DType,
        out_dtype: DType,
    ) -> Result<Tensor> {
        let reduced = self.reduce_axes(axes)?;
        let kept: Vec<usize> = (0..self.ndim()).filter(|a| !reduced.contains(a)).collect();
        let extent: usize = reduced.iter().map(|&a| self.shape()[a]).product();
        if extent == 0
            && matches!(
                op,
                ReduceOp::Min | ReduceOp::Max | ReduceOp::ArgMin | ReduceOp::ArgMax
            )
        {
            return Err(Error::Shape(format!(
                "{op:?} over axes {reduced:?} of shape {:?}: the reduced extent is empty",
                self.shape()
            )));
        }
        if crate::autograd::needed([self]) && out_dtype.is_float() {
            let out =
                crate::autograd::no_grad(|| self.reduce_raw(op, axes, keepdim, acc, out_dtype))?;
            return Ok(grad::record_reduction(op, self, out, &reduced));
        }
        let order: Vec<usize> = kept.iter().chain(&reduced).copied().collect();
        let out_shape: Vec<usize> = kept.iter().map(|&a| self.shape()[a]).collect();
        let deferred = crate::fusion::reduce::defer_reduce(
            op,
            self,
            &order,
            reduced.len(),
            &out_shape,
            (acc, out_dtype),
        )?;
        // A reduction of a pending tree over the last axes, kept for an epilogue.
        let trailing = order.iter().enumerate().all(|(k, &a)| k == a);
        let deferred = match deferred {
            Some(pending) => Some(pending),
            None if trailing => crate::fusion::reduce::defer_map_reduce(
                op,
                self,
                reduced.len(),
                &out_shape,
                (acc, out_dtype),
            )?,
            None => None,
        };
        // A reduction of a pending tree, kept for a kernel that also stores the tree.
        let deferred = match deferred {
            Some(pending) => Some(pending),
            None => crate::fusion::reduce::defer_stored_map_reduce(
                op,
                self,
                &order,
                reduced.len(),
                &out_shape,
                (acc, out_dtype),
            )?,
        };
        let out = match deferred {
            Some(pending) => pending,
            None => self.reduce_now(op, &reduced, &order, &out_shape, acc, out_dtype)?,
        };
        if !keepdim {
            return Ok(out);
        }
        let kept_shape: Vec<usize> = (0..self.ndim())
            .map(|a| {
                if reduced.contains(&a) {
                    1
                } else {
                    self.shape()[a]
                }
            })
            .collect();
        out.view(kept_shape)
    }

    /// Σ over `axes` (PyTorch's dtypes: integers and bool give i64, floats keep their dtype;
    /// 16-bit floats accumulate in f32). 0 for an empty extent.
    ///
    /// ```
    /// use strata_core::{ops::Axes, Device, DType, Tensor};
    /// let t = Tensor::full([2, 3], 200, DType::U8, &Device::cpu()).unwrap();
    /// let s = t.sum(1, false).unwrap();
    /// assert_eq!((s.dtype(), s.to_vec::<i64>().unwrap()), (DType::I64, vec![600, 600]));
    /// assert_eq!(t.sum(Axes::All, true).unwrap().shape(), &[1, 1]);
    /// ```
    #[track_caller]
    pub fn sum(&self, axes: impl Into<Axes>, keepdim: bool) -> Result<Tensor> {
        let acc = self.dtype.accumulator();
        let out = if self.dtype.is_float() {
            self.dtype
        } else {
            acc
        };
        self.reduce_raw(ReduceOp::Sum, &axes.into(), keepdim, acc, out)
    }

    /// Σ returning the accumulation dtype (augpy's `upcast`): f16/bf16 give f32.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([3000], 1.0, DType::F16, &Device::cpu()).unwrap();
    /// let s = t.sum_upcast(0, false).unwrap();
    /// assert_eq!((s.dtype(), s.item::<f32>().unwrap()), (DType::F32, 3000.0));
    /// ```
    #[track_caller]
    pub fn sum_upcast(&self, axes: impl Into<Axes>, keepdim: bool) -> Result<Tensor> {
        let acc = self.dtype.accumulator();
        self.reduce_raw(ReduceOp::Sum, &axes.into(), keepdim, acc, acc)
    }

    /// Σ accumulated in and returned as `dtype` (PyTorch's `dtype=` argument).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([4], 100, DType::U8, &Device::cpu()).unwrap();
    /// assert_eq!(t.sum_as(0, false, DType::U8).unwrap().item::<u8>().unwrap(), 144); // wraps
    /// ```
    #[track_caller]
    pub fn sum_as(&self, axes: impl Into<Axes>, keepdim: bool, dtype: DType) -> Result<Tensor> {
        self.reduce_raw(ReduceOp::Sum, &axes.into(), keepdim, dtype, dtype)
    }

    /// Π over `axes`, with the dtypes of [`sum`](Tensor::sum). 1 for an empty extent.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::arange(1, 6, 1, DType::I32, &Device::cpu()).unwrap();
    /// assert_eq!(t.prod(0, false).unwrap().item::<i64>().unwrap(), 120);
    /// ```
    #[track_caller]
    pub fn prod(&self, axes: impl Into<Axes>, keepdim: bool) -> Result<Tensor> {
        let acc = self.dtype.accumulator();
        let out = if self.dtype.is_float() {
            self.dtype
        } else {
            acc
        };
        self.reduce_raw(ReduceOp::Prod, &axes.into(), keepdim, acc, out)
    }

    /// `self` when it is a float tensor, else a copy in the default float dtype.
    fn as_float(&self) -> Result<Tensor> {
        if self.dtype.is_float() {
            Ok(self.clone())
        } else {
            self.to_dtype(DEFAULT_FLOAT)
        }
    }

    fn float_only(&self, what: &str) -> Result<()> {
        if !self.dtype.is_float() {
            return Err(Error::DType(format!(
                "{what} needs a float tensor, not {}; convert with to_dtype(DType::F32)",
                self.dtype
            )));
        }
        Ok(())
    }

    /// The arithmetic mean over `axes` (float tensors; NaN for an empty extent).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::arange(0.0, 4.0, 1.0, DType::F32, &Device::cpu()).unwrap().reshape([2, 2]).unwrap();
    /// assert_eq!(t.mean(0, false).unwrap().to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
    /// ```
    pub fn mean(&self, axes: impl Into<Axes>, keepdim: bool) -> Result<Tensor> {
        self.float_only("mean")?;
        let axes = axes.into();
        if crate::autograd::needed([self]) {
            let out = crate::autograd::no_grad(|| self.mean(axes.clone(), keepdim))?;
            return Ok(grad::record_mean(self, out, &self.reduce_axes(&axes)?));
        }
        let n = self.extent(&axes)?;
        let acc = self.dtype.accumulator();
        let sum = self.reduce_raw(ReduceOp::Sum, &axes, keepdim, acc, acc)?;
        sum.div(Scalar::F64(n as f64).cast(acc, false))?
            .to_dtype(self.dtype)
    }

    /// The number of elements the reduction over `axes` combines.
    fn extent(&self, axes: &Axes) -> Result<usize> {
        Ok(self
            .reduce_axes(axes)?
            .iter()
            .map(|&a| self.shape()[a])
            .product())
    }

    /// The variance over `axes`, dividing by `n - correction` (1: Bessel's correction, as
    /// PyTorch's default). Two passes: the mean, then the squared deviations.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[1.0f64, 2.0, 3.0, 4.0], [4], &Device::cpu()).unwrap();
    /// assert_eq!(t.var(0, 1, false).unwrap().item::<f64>().unwrap(), 5.0 / 3.0);
    /// assert_eq!(t.var(0, 0, false).unwrap().item::<f64>().unwrap(), 1.25);
    /// ```
    pub fn var(&self, axes: impl Into<Axes>, correction: usize, keepdim: bool) -> Result<Tensor> {
        let axes = axes.into();
        if crate::autograd::needed([self]) {
            let out = crate::autograd::no_grad(|| self.var(axes.clone(), correction, keepdim))?;
            let reduced = self.reduce_axes(&axes)?;
            return Ok(grad::record_var(self, out, &reduced, correction, false));
        }
        self.var_in_acc(axes, correction, keepdim, "var")?
            .to_dtype(self.dtype)
    }

    /// The variance in the accumulation dtype (f32 for 16-bit floats), not yet rounded to the
    /// tensor's dtype: `std` takes its square root first, since an f16 variance can overflow
    /// where the deviation does not (`[65504, -1]`).
    fn var_in_acc(
        &self,
        axes: Axes,
        correction: usize,
        keepdim: bool,
        what: &str,
    ) -> Result<Tensor> {
        self.float_only(what)?;
        let acc = self.dtype.accumulator();
        let x = self.to_dtype(acc)?;
        let n = self.extent(&axes)?;
        let mean = x.sum(axes.clone(), true)?.div(n as f64)?;
        let squares = x.sub(&mean)?.square()?.sum(axes, keepdim)?;
        squares.div((n as f64 - correction as f64).max(0.0))
    }

    /// The standard deviation: `√var`, taken in the accumulation dtype before rounding to the
    /// tensor's dtype.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[1.0f32, 3.0], [2], &Device::cpu()).unwrap();
    /// assert_eq!(t.std(0, 0, false).unwrap().item::<f32>().unwrap(), 1.0);
    /// let h = t.mul(32752.0).unwrap().add(-32751.0).unwrap().to_dtype(DType::F16).unwrap();
    /// let s = h.std(0, 0, false).unwrap(); // the f16 variance, 1.07e9, would overflow
    /// assert_eq!(s.to_dtype(DType::F32).unwrap().item::<f32>().unwrap(), 32752.0);
    /// ```
    pub fn std(&self, axes: impl Into<Axes>, correction: usize, keepdim: bool) -> Result<Tensor> {
        let axes = axes.into();
        if crate::autograd::needed([self]) {
            let out = crate::autograd::no_grad(|| self.std(axes.clone(), correction, keepdim))?;
            let reduced = self.reduce_axes(&axes)?;
            return Ok(grad::record_var(self, out, &reduced, correction, true));
        }
        self.var_in_acc(axes, correction, keepdim, "std")?
            .sqrt()?
            .to_dtype(self.dtype)
    }

    /// The smallest element over `axes` (NaN propagates); an empty extent is an `Err`.
    ///
    /// ```
    /// use strata_core::{ops::Axes, Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[3i8, -2, 7], [3], &Device::cpu()).unwrap();
    /// assert_eq!(t.min(Axes::All, false).unwrap().item::<i8>().unwrap(), -2);
    /// ```
    #[track_caller]
    pub fn min(&self, axes: impl Into<Axes>, keepdim: bool) -> Result<Tensor> {
        self.reduce_raw(ReduceOp::Min, &axes.into(), keepdim, self.dtype, self.dtype)
    }

    /// The largest element over `axes` (NaN propagates); an empty extent is an `Err`.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[3i8, -2, 7, 1], [2, 2], &Device::cpu()).unwrap();
    /// assert_eq!(t.max(1, false).unwrap().to_vec::<i8>().unwrap(), vec![3, 7]);
    /// assert!(Tensor::zeros([0], DType::F32, &Device::cpu()).unwrap().max(0, false).is_err());
    /// ```
    #[track_caller]
    pub fn max(&self, axes: impl Into<Axes>, keepdim: bool) -> Result<Tensor> {
        self.reduce_raw(ReduceOp::Max, &axes.into(), keepdim, self.dtype, self.dtype)
    }

    /// The position of the first smallest element along `axis` (or in the flattened tensor
    /// for `None`), as i64; NaN counts as smallest.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[3, 1, 1, 0], [2, 2], &Device::cpu()).unwrap();
    /// assert_eq!(t.argmin(Some(1), false).unwrap().to_vec::<i64>().unwrap(), vec![1, 1]);
    /// assert_eq!(t.argmin(None, false).unwrap().item::<i64>().unwrap(), 3);
    /// ```
    pub fn argmin(&self, axis: Option<isize>, keepdim: bool) -> Result<Tensor> {
        self.arg_reduce(ReduceOp::ArgMin, axis, keepdim)
    }

    /// The position of the first largest element along `axis` (or in the flattened tensor
    /// for `None`), as i64; NaN counts as largest.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[1.0f32, 5.0, 5.0], [3], &Device::cpu()).unwrap();
    /// assert_eq!(t.argmax(Some(0), false).unwrap().item::<i64>().unwrap(), 1);
    /// ```
    pub fn argmax(&self, axis: Option<isize>, keepdim: bool) -> Result<Tensor> {
        self.arg_reduce(ReduceOp::ArgMax, axis, keepdim)
    }

    fn arg_reduce(&self, op: ReduceOp, axis: Option<isize>, keepdim: bool) -> Result<Tensor> {
        let axes = match axis {
            Some(a) => Axes::from(a),
            None => Axes::All,
        };
        self.reduce_raw(op, &axes, keepdim, self.dtype, DType::I64)
    }

    /// Whether any element over `axes` is non-zero, as bool.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[0u8, 0, 3, 0], [2, 2], &Device::cpu()).unwrap();
    /// assert_eq!(t.any(1, false).unwrap().to_vec::<bool>().unwrap(), vec![false, true]);
    /// ```
    pub fn any(&self, axes: impl Into<Axes>, keepdim: bool) -> Result<Tensor> {
        self.reduce_raw(
            ReduceOp::Any,
            &axes.into(),
            keepdim,
            DType::Bool,
            DType::Bool,
        )
    }

    /// Whether every element over `axes` is non-zero, as bool.
    ///
    /// ```
    /// use strata_core::{ops::Axes, Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[1u8, 2, 3, 0], [4], &Device::cpu()).unwrap();
    /// assert!(!t.all(Axes::All, false).unwrap().item::<bool>().unwrap());
    /// ```
    pub fn all(&self, axes: impl Into<Axes>, keepdim: bool) -> Result<Tensor> {
        self.reduce_raw(
            ReduceOp::All,
            &axes.into(),
            keepdim,
            DType::Bool,
            DType::Bool,
        )
    }

    /// `log Σ exp(x)` over `axes`, computed stably (shifted by the maximum). Integers give
    /// f32.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[1000.0f64, 1000.0], [2], &Device::cpu()).unwrap();
    /// let v = t.logsumexp(0, false).unwrap().item::<f64>().unwrap();
    /// assert!((v - (1000.0 + 2f64.ln())).abs() < 1e-9);
    /// ```
    pub fn logsumexp(&self, axes: impl Into<Axes>, keepdim: bool) -> Result<Tensor> {
        let axes = axes.into();
        if crate::autograd::needed([self]) {
            let out = crate::autograd::no_grad(|| self.logsumexp(axes.clone(), keepdim))?;
            return Ok(grad::record_logsumexp(self, out, &self.reduce_axes(&axes)?));
        }
        let x = self.as_float()?;
        if x.extent(&axes)? == 0 {
            return x.sum(axes, keepdim)?.log();
        }
        let m = x.max(axes.clone(), true)?;
        // An infinite maximum would make x - m NaN; shift by 0 there instead (as PyTorch).
        let shift = Tensor::where_cond(&m.isinf()?, 0.0, &m)?;
        let s = x
            .sub(&shift)?
            .exp()?
            .sum(axes.clone(), true)?
            .log()?
            .add(&shift)?;
        if keepdim {
            return Ok(s);
        }
        let reduced = x.reduce_axes(&axes)?;
        let kept: Vec<usize> = (0..x.ndim())
            .filter(|a| !reduced.contains(a))
            .map(|a| x.shape()[a])
            .collect();
        s.view(kept)
    }

    /// `exp(x) / Σ exp(x)` along `axis`, computed stably. Integers give f32.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[0.0f32, 0.0], [2], &Device::cpu()).unwrap();
    /// assert_eq!(t.softmax(0).unwrap().to_vec::<f32>().unwrap(), vec![0.5, 0.5]);
    /// ```
    pub fn softmax(&self, axis: isize) -> Result<Tensor> {
        if crate::autograd::needed([self]) {
            let out = crate::autograd::no_grad(|| self.softmax(axis))?;
            return Ok(grad::record_softmax(self, out, axis, false));
        }
        let x = self.as_float()?;
        if x.extent(&Axes::from(axis))? == 0 {
            return x.empty_like(); // nothing to normalize (PyTorch returns the empty tensor too)
        }
        if let Some(y) = x.softmax_kernel(axis, false)? {
            return Ok(y);
        }
        let e = x.sub(&x.max(axis, true)?)?.exp()?;
        e.div(&e.sum(axis, true)?)
    }

    /// `softmax` (or `log_softmax`) of this float tensor as one [`Kernel::Softmax`] when the
    /// backend has it and `axis` is the last (rows kept on chip: one read, one write), else
    /// `None` for the composition. The kernel computes the composition's numbers.
    fn softmax_kernel(&self, axis: isize, log: bool) -> Result<Option<Tensor>> {
        let last = self.ndim().checked_sub(1);
        let target = self.device().backend().target();
        if !target.runs_softmax || last != Some(normalize_axis(axis, self.ndim().max(1))?) {
            return Ok(None);
        }
        // A backend that binds windows of its buffers (wgpu) binds a whole row at once: a row
        // longer than a binding takes the composition, whose reductions split rows.
        if let (Some(limit), Some(&n)) = (target.binding_limit, self.shape().last()) {
            let stride = self.strides().last().map_or(1, |s| s.unsigned_abs());
            let span = (n.saturating_sub(1) * stride + 1).max(n) * self.dtype.itemsize();
            if span as u64 + target.offset_align + 16 > limit {
                return Ok(None);
            }
        }
        let out = Tensor::empty(self.shape(), self.dtype, self.device())?;
        crate::tensor::launch(Kernel::Softmax { log }, &out, &[self], vec![])?;
        Ok(Some(out))
    }

    /// `log(softmax(x))` along `axis`, computed stably.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[0.0f64, 0.0], [2], &Device::cpu()).unwrap();
    /// assert_eq!(t.log_softmax(0).unwrap().to_vec::<f64>().unwrap(), vec![-2f64.ln(); 2]);
    /// ```
    pub fn log_softmax(&self, axis: isize) -> Result<Tensor> {
        if crate::autograd::needed([self]) {
            let out = crate::autograd::no_grad(|| self.log_softmax(axis))?;
            return Ok(grad::record_softmax(self, out, axis, true));
        }
        let x = self.as_float()?;
        if x.extent(&Axes::from(axis))? == 0 {
            return x.empty_like();
        }
        if let Some(y) = x.softmax_kernel(axis, true)? {
            return Ok(y);
        }
        let shifted = x.sub(&x.max(axis, true)?)?;
        let lse = shifted.exp()?.sum(axis, true)?.log()?;
        shifted.sub(&lse)
    }
}

/// Launches the reduction `(op, reduced_axes, acc)` of `source` (its axes read in `order`:
/// kept, then the last `reduced_axes`) into `out` (which has its buffer) on `stream`. A
/// pending elementwise `source` is read directly (map→reduce fusion), a deferred reduction of
/// the same rows that its map reads runs in the same kernel first (a row prologue), and
/// `epilogue`'s elementwise work over the rows joins it where it fits (a row epilogue): true
/// when it did, its output written.
pub(crate) fn launch_reduce(
    source: &Tensor,
    (op, reduced_axes, acc): (ReduceOp, usize, DType),
    order: &[usize],
    out: &Tensor,
    stream: &std::sync::Arc<crate::device::StreamHandle>,
    write: Write,
    epilogue: Option<&crate::fusion::reduce::EpilogueRequest>,
) -> Result<bool> {
    use crate::fusion::reduce::{epilogue_of, pending_reader, reduce_map_of, row_prologue_of};
    let target = source.device().backend().target();
    // A pending elementwise input is read by the reduction directly (map→reduce fusion):
    // its leaves, permuted like the input, and its expression per element.
    let in_order = matches!(op, ReduceOp::Sum | ReduceOp::Prod) && acc.is_float();
    let (map, mut inputs, mut scalars) = match reduce_map_of(source, order, out, in_order)? {
        Some(m) => (Some(m.expr), m.inputs, m.scalars),
        None => (
            None,
            vec![source.with_layout(source.layout.permuted(order)?)],
            vec![],
        ),
    };
    // A deferred reduction of the same rows that the map reads runs in this kernel first.
    let prologue = match &map {
        Some(_) if target.fuses_row_prologue => row_prologue_of(&inputs, out, reduced_axes)?,
        _ => None,
    };
    let (prologue, written) = prologue.map_or((None, None), |(p, w)| (Some(p), Some(w)));
    let mut also: Vec<&Tensor> = written.iter().collect();
    // Elementwise work over the same rows that reads the result runs in it last.
    let epilogue = match (&map, epilogue) {
        (Some(_), Some(req)) if target.fuses_row_epilogue => {
            epilogue_of(req, &inputs, scalars.len(), out)?
                // (A pending operand of the epilogue that reads the prologue this kernel
                // writes would run first and read it unwritten: the work runs as its map.)
                .filter(|(_, extra)| written.as_ref().is_none_or(|w| !pending_reader(extra, w)))
                .map(|(e, extra)| (e, extra, req))
        }
        _ => None,
    };
    let epilogue = match epilogue {
        Some((e, extra, req)) => {
            match out
                .device()
                .allocate_buffer(req.out.storage.bytes, stream.id)
            {
                Ok(buffer) => {
                    req.out.storage.set_buffer(buffer);
                    inputs.extend(extra);
                    scalars.extend(req.scalars.iter().cloned());
                    also.push(&req.out);
                    Some(e)
                }
                // No room for the work's output: the reduction runs alone (the prologue it
                // took over is written), and the work tries again as its own map.
                Err(_) => None,
            }
        }
        None => None,
    };
    let fused = epilogue.is_some();
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let kernel = Kernel::Reduce {
        op,
        reduced_axes,
        acc,
        map,
        prologue,
        epilogue,
        stores_map: false,
    };
    let ran = crate::tensor::launch_on(kernel, out, &also, &refs, scalars, stream, write);
    for t in &also {
        t.storage.filled(&ran);
    }
    ran?;
    Ok(fused)
}
