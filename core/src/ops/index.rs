//! Index ops: gather, index_select, take, scatter (and add), masked_fill, masked_select,
//! index_put and one_hot. Index tensors are i32 or i64; negative indices count from the end;
//! an index out of range is an `Err` naming it. Gathers (gather, index_select, take) check
//! inside their kernel, which raises a flag: the CPU reads it back at once, a GPU at its next
//! read or synchronize (no host wait mid-step). The scatters check in one pass over the index
//! before, which reads one value back (a scatter must not write anything when a value is out
//! of range); a gather's backward scatter-add trusts the gather's check.

use crate::assign::Value;
use crate::backend::BackendKind;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{IndexKind, Kernel};
use crate::layout::normalize_axis;
use crate::ops::Axes;
use crate::tensor::{launch, launch_writing, Tensor};

/// `index` as i64 with negative values wrapped, after checking it is an integer tensor whose
/// values lie in `-size..size`.
pub(crate) fn normalized_index(index: &Tensor, size: usize, what: &str) -> Result<Tensor> {
    let idx = index_as_i64(index, what)?;
    if idx.numel() == 0 {
        return Ok(idx);
    }
    // One pass and one value read back: 2 where some index is out of range, else 1 where
    // some is negative, else 0 (fused into one reduction where the backend fuses maps).
    let n = size as i64;
    let outside = idx.lt(-n)?.logical_or(&idx.ge(n)?)?;
    let code = Tensor::where_cond(&outside, 2u8, &idx.lt(0)?.to_dtype(DType::U8)?)?;
    match code.max(Axes::All, false)?.item::<u8>()? {
        0 => Ok(idx),
        1 => Tensor::where_cond(&idx.lt(0)?, &idx.add(n)?, &idx),
        _ => Err(out_of_range(&idx, size, what)?),
    }
}

/// The `Err` for an index tensor with a value outside `-size..size`, naming one (the error
/// path reads the extremes).
fn out_of_range(idx: &Tensor, size: usize, what: &str) -> Result<Error> {
    Ok(Error::Index(out_of_range_message(idx, size, what)?))
}

/// What [`out_of_range`] says: the extreme value that is outside, or (for an index written
/// since a kernel found it out of range) that some value was.
fn out_of_range_message(idx: &Tensor, size: usize, what: &str) -> Result<String> {
    let (lo, hi) = (
        idx.min(Axes::All, false)?.item::<i64>()?,
        idx.max(Axes::All, false)?.item::<i64>()?,
    );
    let n = size as i64;
    let v = if lo < -n { lo } else { hi };
    Ok(if v < -n || v >= n {
        format!("{what}: index {v} is out of range for an axis of size {size}")
    } else {
        format!("{what}: an index was out of range for an axis of size {size} (the index tensor has been written since)")
    })
}

/// `index` as i64 (a copy only when it is i32), after checking it is an integer tensor.
fn index_as_i64(index: &Tensor, what: &str) -> Result<Tensor> {
    match index.dtype() {
        DType::I64 => Ok(index.clone()),
        DType::I32 => index.to_dtype(DType::I64),
        other => Err(Error::DType(format!(
            "{what}: the index tensor must be i32 or i64, not {other}"
        ))),
    }
}

/// A 1-D `index` laid along `axis` and broadcast over every other axis of `shape` (a view, no
/// copy), with the shape it has.
fn lay_along(index: &Tensor, axis: usize, shape: &[usize]) -> Result<(Tensor, Vec<usize>)> {
    let mut shape = shape.to_vec();
    shape[axis] = index.numel();
    let mut along = vec![1usize; shape.len()];
    along[axis] = index.numel();
    Ok((index.reshape(along)?.broadcast_to(shape.clone())?, shape))
}

impl Tensor {
    /// PyTorch's `gather`: `out[i][j] = self[index[i][j]][j]` for `axis` 0 (likewise for any
    /// axis and rank). `index` has `self`'s rank and, off `axis`, sizes no larger than
    /// `self`'s; the result has `index`'s shape.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let t = Tensor::from_slice(&[1, 2, 3, 4], [2, 2], &dev).unwrap();
    /// let i = Tensor::from_slice(&[0i64, 0, 1, 0], [2, 2], &dev).unwrap();
    /// assert_eq!(t.gather(1, &i).unwrap().to_vec::<i32>().unwrap(), vec![1, 1, 4, 3]);
    /// ```
    #[track_caller]
    pub fn gather(&self, axis: isize, index: &Tensor) -> Result<Tensor> {
        let (what, called_at) = ("gather", std::panic::Location::caller());
        self.same_device(index, what)?;
        let a = normalize_axis(axis, self.ndim())?;
        self.check_index_shape(index, a, what)?;
        let idx = index_as_i64(index, what)?;
        if crate::autograd::needed([self]) {
            let out = crate::autograd::no_grad(|| self.gather_in_range(a, &idx, what, called_at))?;
            return Ok(self.record_gather("GatherBackward", a, &idx, false, out));
        }
        self.gather_in_range(a, &idx, what, called_at)
    }

    /// The gather kernel over an i64 index as the user gave it: the kernel wraps negative
    /// values and checks the range as it reads them, raising a flag instead of a pass of its
    /// own over the index before. The CPU (and blocking mode) reads the flag at once; a GPU
    /// leaves it to the device's next read or synchronize, so a training step's gathers do
    /// not stop the host mid-step (see [`Device::defer_check`]).
    fn gather_in_range(
        &self,
        axis: usize,
        idx: &Tensor,
        what: &'static str,
        called_at: &'static std::panic::Location<'static>,
    ) -> Result<Tensor> {
        let out = Tensor::alloc(idx.shape(), self.dtype(), self.device())?;
        if out.numel() == 0 {
            return Ok(out);
        }
        let flag = Tensor::zeros([1], DType::U32, self.device())?;
        let gather = Kernel::Index {
            kind: IndexKind::Gather,
            axis,
        };
        launch_writing(gather, &out, &[&flag], &[self, idx], vec![])?;
        let size = self.shape()[axis];
        let dev = self.device();
        if dev.kind() == BackendKind::Cpu || dev.blocking() {
            if flag.item::<u32>()? != 0 {
                return Err(out_of_range(idx, size, what)?);
            }
            return Ok(out);
        }
        let (flag, idx) = (flag.device_free()?, idx.device_free()?);
        dev.defer_check(Box::new(move |dev| {
            if flag.on(dev).item::<u32>()? == 0 {
                return Ok(());
            }
            let why = out_of_range_message(&idx.on(dev), size, what)?;
            Err(Error::Index(format!(
                "{why} (the {what} called at {called_at}; found by the device, reported at the \
                 next read)"
            )))
        }));
        Ok(out)
    }

    /// Checks that `index` has `self`'s rank and fits inside it off `axis`.
    /// `out`, gathered from `self` along `axis` at `idx` (of `out`'s shape, or with
    /// `along` a 1-D index laid along `axis`), with its backward node: the gradient added
    /// back at the positions it came from (a scatter-add into zeros, so a position gathered
    /// twice gets both shares). The gather checked the index (or will report it at the next
    /// read), so the scatter-add does not check it again, which would read back to the host
    /// in the middle of a backward pass; it clamps it into range so that a bad value already
    /// reported cannot write outside the gradient.
    fn record_gather(
        &self,
        name: &'static str,
        axis: usize,
        idx: &Tensor,
        along: bool,
        out: Tensor,
    ) -> Tensor {
        let saved = crate::autograd::graph::Saved::new(idx, name);
        let described = vec![saved.describe()];
        let shape = self.shape().to_vec();
        crate::autograd::record(name, &[self], out, described, move |g| {
            let n = shape[axis] as i64;
            let idx = saved.get()?;
            let wrapped = Tensor::where_cond(&idx.lt(0)?, &idx.add(n)?, idx)?.clamp(0, n - 1)?;
            let idx = if along {
                lay_along(&wrapped, axis, &shape)?.0
            } else {
                wrapped
            };
            let gx = Tensor::zeros(shape.clone(), g.dtype(), g.device())?;
            gx.scatter_in_range(axis, &idx, Value::Tensor(g.clone()), true, name)?;
            Ok(vec![Some(gx)])
        })
    }

    fn check_index_shape(&self, index: &Tensor, axis: usize, what: &str) -> Result<()> {
        let fits = index.ndim() == self.ndim()
            && (0..self.ndim()).all(|d| d == axis || index.shape()[d] <= self.shape()[d]);
        if !fits {
            return Err(Error::Shape(format!(
                "{what}: an index of shape {:?} does not fit a tensor of shape {:?} along axis {axis}",
                index.shape(),
                self.shape()
            )));
        }
        Ok(())
    }

    /// The entries at positions `index` (1-D) along `axis`.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let t = Tensor::arange(0, 6, 1, DType::I32, &dev).unwrap().reshape([2, 3]).unwrap();
    /// let i = Tensor::from_slice(&[2i32, -3], [2], &dev).unwrap();
    /// assert_eq!(t.index_select(1, &i).unwrap().to_vec::<i32>().unwrap(), vec![2, 0, 5, 3]);
    /// ```
    #[track_caller]
    pub fn index_select(&self, axis: isize, index: &Tensor) -> Result<Tensor> {
        let called_at = std::panic::Location::caller();
        let a = normalize_axis(axis, self.ndim())?;
        if index.ndim() != 1 {
            return Err(Error::Shape(format!(
                "index_select needs a 1-D index, got shape {:?}",
                index.shape()
            )));
        }
        let what = "index_select";
        let index = index_as_i64(index, what)?;
        let (expanded, shape) = lay_along(&index, a, self.shape())?;
        if shape.contains(&0) {
            // No element to gather, so the kernel would check no value: check the index
            // itself (a `[0, 0, 1]` tensor's other axes leave nothing of its broadcast).
            normalized_index(&index, self.shape()[a], what)?;
        }
        if crate::autograd::needed([self]) {
            let out =
                crate::autograd::no_grad(|| self.gather_in_range(a, &expanded, what, called_at))?;
            return Ok(self.record_gather("IndexSelectBackward", a, &index, true, out));
        }
        self.gather_in_range(a, &expanded, what, called_at)
    }

    /// The elements at flat (row-major) positions `index`, in `index`'s shape.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let t = Tensor::arange(10, 16, 1, DType::I64, &dev).unwrap().reshape([2, 3]).unwrap();
    /// let i = Tensor::from_slice(&[5i64, 0, -1, 1], [2, 2], &dev).unwrap();
    /// assert_eq!(t.take(&i).unwrap().to_vec::<i64>().unwrap(), vec![15, 10, 15, 11]);
    /// ```
    #[track_caller]
    pub fn take(&self, index: &Tensor) -> Result<Tensor> {
        let flat_index = index.reshape([-1])?;
        self.reshape([-1])?
            .index_select(0, &flat_index)?
            .reshape(index.shape())
    }

    /// A copy of `self` with `src` written at `index` along `axis`: `out[index[i][j]][j] =
    /// src[i][j]` for axis 0. `src` may be a scalar or a tensor broadcast to `index`'s shape.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let t = Tensor::zeros([2, 3], DType::F32, &dev).unwrap();
    /// let i = Tensor::from_slice(&[2i64, 0], [2, 1], &dev).unwrap();
    /// let r = t.scatter(1, &i, 5.0).unwrap();
    /// assert_eq!(r.to_vec::<f32>().unwrap(), vec![0.0, 0.0, 5.0, 5.0, 0.0, 0.0]);
    /// ```
    pub fn scatter(&self, axis: isize, index: &Tensor, src: impl Into<Value>) -> Result<Tensor> {
        self.scatter_copy(axis, index, src.into(), false)
    }

    /// In-place [`scatter`](Tensor::scatter).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let t = Tensor::zeros([3], DType::I32, &dev).unwrap();
    /// t.scatter_(0, &Tensor::from_slice(&[1i64], [1], &dev).unwrap(), 7).unwrap();
    /// assert_eq!(t.to_vec::<i32>().unwrap(), vec![0, 7, 0]);
    /// ```
    pub fn scatter_(&self, axis: isize, index: &Tensor, src: impl Into<Value>) -> Result<()> {
        self.scatter_impl(axis, index, src.into(), false, "scatter_")
    }

    /// A copy of `self` with `src` added at `index` along `axis` (repeated indices add up).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let t = Tensor::zeros([3], DType::I32, &dev).unwrap();
    /// let i = Tensor::from_slice(&[1i64, 1, 2], [3], &dev).unwrap();
    /// assert_eq!(t.scatter_add(0, &i, 1).unwrap().to_vec::<i32>().unwrap(), vec![0, 2, 1]);
    /// ```
    pub fn scatter_add(
        &self,
        axis: isize,
        index: &Tensor,
        src: impl Into<Value>,
    ) -> Result<Tensor> {
        self.scatter_copy(axis, index, src.into(), true)
    }

    /// A copy of `self` with `src` scattered (added, with `add`) along `axis` at `index`,
    /// with its backward node when it records a gradient.
    fn scatter_copy(&self, axis: isize, index: &Tensor, src: Value, add: bool) -> Result<Tensor> {
        if self.scatter_needs_grad(&src) {
            let out =
                crate::autograd::no_grad(|| self.scatter_copy(axis, index, src.clone(), add))?;
            return self.record_scatter(axis, index, &src, add, out);
        }
        let out = self.copy()?;
        let what = if add { "scatter_add" } else { "scatter" };
        out.scatter_impl(axis, index, src, add, what)?;
        Ok(out)
    }

    /// In-place [`scatter_add`](Tensor::scatter_add).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let t = Tensor::ones([2], DType::F32, &dev).unwrap();
    /// t.scatter_add_(0, &Tensor::from_slice(&[0i64, 0], [2], &dev).unwrap(), 0.5).unwrap();
    /// assert_eq!(t.to_vec::<f32>().unwrap(), vec![2.0, 1.0]);
    /// ```
    pub fn scatter_add_(&self, axis: isize, index: &Tensor, src: impl Into<Value>) -> Result<()> {
        self.scatter_impl(axis, index, src.into(), true, "scatter_add_")
    }

    /// True when a scatter of `src` into `self` records a gradient.
    fn scatter_needs_grad(&self, src: &Value) -> bool {
        match src {
            Value::Tensor(t) => crate::autograd::needed([self, t]),
            Value::Scalar(_) => crate::autograd::needed([self]),
        }
    }

    /// `out`, `self` with `src` scattered (added with `add`) along `axis` at `index`, with its
    /// backward node: `self` gets the gradient (with zeros where a plain scatter overwrote),
    /// a tensor `src` the gradient gathered at the index's positions.
    fn record_scatter(
        &self,
        axis: isize,
        index: &Tensor,
        src: &Value,
        add: bool,
        out: Tensor,
    ) -> Result<Tensor> {
        let name = if add {
            "ScatterAddBackward"
        } else {
            "ScatterBackward"
        };
        let a = normalize_axis(axis, self.ndim())?;
        let idx = crate::autograd::graph::Saved::new(&index_as_i64(index, name)?, name);
        let described = vec![idx.describe()];
        let src_tensor = match src {
            Value::Tensor(t) => Some(t.clone()),
            Value::Scalar(_) => None,
        };
        let src_shape = src_tensor.as_ref().map(|t| (t.shape().to_vec(), t.dtype()));
        let mut inputs: Vec<&Tensor> = vec![self];
        inputs.extend(src_tensor.as_ref());
        let self_dtype = self.dtype();
        Ok(crate::autograd::record(
            name,
            &inputs,
            out,
            described,
            move |g| {
                let idx = idx.get()?;
                let gx = if add {
                    g.clone()
                } else {
                    g.scatter(a as isize, idx, 0.0)?
                };
                let gx = if gx.dtype() == self_dtype {
                    gx
                } else {
                    gx.to_dtype(self_dtype)?
                };
                let mut grads = vec![Some(gx)];
                if let Some((shape, dtype)) = &src_shape {
                    let picked = g.gather(a as isize, idx)?;
                    let picked = if picked.dtype() == *dtype {
                        picked
                    } else {
                        picked.to_dtype(*dtype)?
                    };
                    // src was read at the index's positions (a larger src), or broadcast to it.
                    let fits = shape.len() == idx.ndim()
                        && shape.iter().zip(idx.shape()).all(|(&s, &i)| s >= i);
                    let gs = if fits {
                        let z = Tensor::zeros(shape.clone(), *dtype, g.device())?;
                        let ranges: Vec<_> = idx
                            .shape()
                            .iter()
                            .map(|&n| crate::index::SliceArg::from(..n))
                            .collect();
                        z.slice(ranges)?.assign(&picked)?;
                        z
                    } else {
                        crate::autograd::sum_to_shape(&picked, shape)?
                    };
                    grads.push(Some(gs));
                }
                Ok(grads)
            },
        ))
    }

    fn scatter_impl(
        &self,
        axis: isize,
        index: &Tensor,
        src: Value,
        accumulate: bool,
        what: &str,
    ) -> Result<()> {
        self.same_device(index, what)?;
        crate::autograd::refuse_write_into(self)?;
        if let Value::Tensor(t) = &src {
            crate::autograd::refuse_in_place_source(t, what)?;
        }
        let a = normalize_axis(axis, self.ndim())?;
        self.check_index_shape(index, a, what)?;
        let idx = normalized_index(index, self.shape()[a], what)?;
        self.scatter_in_range(a, &idx, src, accumulate, what)
    }

    /// The scatter kernel along axis `a` over `idx`, an i64 index whose values lie in
    /// `0..self.shape()[a]` and whose shape fits `self` off `a`: checked by the caller (or
    /// made so by the op that produced `idx`: the kernel does not check).
    pub(crate) fn scatter_in_range(
        &self,
        a: usize,
        idx: &Tensor,
        src: Value,
        accumulate: bool,
        what: &str,
    ) -> Result<()> {
        let src = match src {
            Value::Tensor(t) => {
                self.same_device(&t, what)?;
                let fits = t.ndim() == idx.ndim()
                    && t.shape().iter().zip(idx.shape()).all(|(&s, &i)| s >= i);
                if fits {
                    // PyTorch reads src at the idx's positions (src may be larger).
                    let ranges: Vec<_> = idx
                        .shape()
                        .iter()
                        .map(|&n| crate::index::SliceArg::from(..n))
                        .collect();
                    t.slice(ranges)?
                } else {
                    t.broadcast_to(idx.shape())
                        .map_err(|e| Error::Shape(format!("{what}: src: {e}")))?
                }
            }
            Value::Scalar(s) => Tensor::scalar(s.cast(self.dtype(), false), self.device())?
                .broadcast_to(idx.shape())?,
        };
        if !crate::ops::can_cast(src.dtype(), self.dtype()) {
            return Err(Error::DType(format!(
                "{what}: values of {} cannot be written into a tensor of {}",
                src.dtype(),
                self.dtype()
            )));
        }
        // The scatter kernel moves elements of one dtype: convert the values here, with the
        // cast rule, rather than leave a conversion (or a reinterpretation) to a backend.
        let src = if src.dtype() == self.dtype() {
            src
        } else {
            src.to_dtype(self.dtype())?
        };
        let kind = if accumulate {
            IndexKind::ScatterAdd
        } else {
            IndexKind::Scatter
        };
        launch(Kernel::Index { kind, axis: a }, self, &[&src, idx], vec![])
    }

    /// A copy of `self` with `value` where `mask` (bool, broadcast to `self`) is true.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let t = Tensor::arange(0, 4, 1, DType::I32, &dev).unwrap();
    /// let m = t.gt(1).unwrap();
    /// assert_eq!(t.masked_fill(&m, -1).unwrap().to_vec::<i32>().unwrap(), vec![0, 1, -1, -1]);
    /// ```
    pub fn masked_fill(&self, mask: &Tensor, value: impl Into<Value>) -> Result<Tensor> {
        let mask = self.check_mask(mask, "masked_fill")?;
        let out = Tensor::where_cond(&mask, self.fill_value(value)?, self)?;
        if out.shape() != self.shape() {
            return Err(Error::Shape(format!(
                "masked_fill: a value of shape {:?} does not fit a tensor of shape {:?}",
                out.shape(),
                self.shape()
            )));
        }
        Ok(out)
    }

    /// In-place [`masked_fill`](Tensor::masked_fill).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let t = Tensor::zeros([2, 2], DType::F32, &dev).unwrap();
    /// t.masked_fill_(&Tensor::from_slice(&[true, false], [2], &dev).unwrap(), 1.0).unwrap();
    /// assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 0.0, 1.0, 0.0]);
    /// ```
    pub fn masked_fill_(&self, mask: &Tensor, value: impl Into<Value>) -> Result<()> {
        let mask = self.check_mask(mask, "masked_fill")?;
        let filled = Tensor::where_cond(&mask, self.fill_value(value)?, self)?;
        self.assign(&filled)
    }

    /// A fill value in this tensor's dtype (as PyTorch), so the unmasked elements are
    /// selected in their own dtype and never pass through a wider or float type.
    fn fill_value(&self, value: impl Into<Value>) -> Result<Value> {
        Ok(match value.into() {
            Value::Scalar(s) => Value::Scalar(s.cast(self.dtype(), false)),
            Value::Tensor(t) if t.dtype() != self.dtype() => {
                Value::Tensor(t.to_dtype(self.dtype())?)
            }
            tensor => tensor,
        })
    }

    fn check_mask(&self, mask: &Tensor, what: &str) -> Result<Tensor> {
        if mask.dtype() != DType::Bool {
            return Err(Error::DType(format!(
                "{what}: the mask must be bool, not {}",
                mask.dtype()
            )));
        }
        mask.broadcast_to(self.shape()).map_err(|_| {
            Error::Shape(format!(
                "{what}: a mask of shape {:?} does not fit a tensor of shape {:?}",
                mask.shape(),
                self.shape()
            ))
        })
    }

    /// The elements where `mask` (bool, broadcast to `self`) is true, as a 1-D tensor in
    /// row-major order. The length depends on the data, so this reads the mask back to the
    /// host.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let t = Tensor::arange(0, 6, 1, DType::I32, &dev).unwrap().reshape([2, 3]).unwrap();
    /// let picked = t.masked_select(&t.remainder(2).unwrap().eq(0).unwrap()).unwrap();
    /// assert_eq!(picked.to_vec::<i32>().unwrap(), vec![0, 2, 4]);
    /// ```
    pub fn masked_select(&self, mask: &Tensor) -> Result<Tensor> {
        let mask = self.check_mask(mask, "masked_select")?;
        let positions: Vec<i64> = mask
            .to_vec::<bool>()?
            .iter()
            .enumerate()
            .filter(|(_, &m)| m)
            .map(|(i, _)| i as i64)
            .collect();
        let n = positions.len();
        let idx = Tensor::from_slice(&positions, [n], self.device())?;
        self.take(&idx)
    }

    /// Writes `values` at positions `index` (1-D) along `axis`: `self[.., index[k], ..] =
    /// values[.., k, ..]`, or adds when `accumulate` (PyTorch's `index_put_` for one index
    /// tensor, `index_copy_`/`index_add_`). `values` broadcasts to the selected shape.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let t = Tensor::zeros([2, 3], DType::I32, &dev).unwrap();
    /// let i = Tensor::from_slice(&[0i64, 2], [2], &dev).unwrap();
    /// t.index_put_(1, &i, 9, false).unwrap();
    /// assert_eq!(t.to_vec::<i32>().unwrap(), vec![9, 0, 9, 9, 0, 9]);
    /// ```
    pub fn index_put_(
        &self,
        axis: isize,
        index: &Tensor,
        values: impl Into<Value>,
        accumulate: bool,
    ) -> Result<()> {
        let a = normalize_axis(axis, self.ndim())?;
        if index.ndim() != 1 {
            return Err(Error::Shape(format!(
                "index_put_ needs a 1-D index, got shape {:?}",
                index.shape()
            )));
        }
        let what = if accumulate {
            "index_put_ (accumulate)"
        } else {
            "index_put_"
        };
        let index = normalized_index(index, self.shape()[a], what)?;
        let (expanded, shape) = lay_along(&index, a, self.shape())?;
        let values = match values.into() {
            Value::Tensor(t) => Value::Tensor(
                t.broadcast_to(shape)
                    .map_err(|e| Error::Shape(format!("index_put_: values: {e}")))?,
            ),
            scalar => scalar,
        };
        self.scatter_impl(a as isize, &expanded, values, accumulate, what)
    }

    /// One-hot encoding of an integer tensor as i64, with a new last axis of `classes` (or
    /// `max + 1` when `None`); values must lie in `0..classes`.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let t = Tensor::from_slice(&[2i64, 0], [2], &dev).unwrap();
    /// assert_eq!(t.one_hot(Some(3)).unwrap().to_vec::<i64>().unwrap(), vec![0, 0, 1, 1, 0, 0]);
    /// ```
    pub fn one_hot(&self, classes: Option<usize>) -> Result<Tensor> {
        if !self.dtype().is_int() {
            return Err(Error::DType(format!(
                "one_hot needs an integer tensor, not {}",
                self.dtype()
            )));
        }
        let idx = self.to_dtype(DType::I64)?;
        let classes = match classes {
            Some(c) => c,
            None if idx.numel() == 0 => 0,
            None => (idx.max(Axes::All, false)?.item::<i64>()?.max(-1) + 1) as usize,
        };
        if idx.numel() > 0 {
            let (lo, hi) = (
                idx.min(Axes::All, false)?.item::<i64>()?,
                idx.max(Axes::All, false)?.item::<i64>()?,
            );
            if lo < 0 || hi >= classes as i64 {
                let bad = if lo < 0 { lo } else { hi };
                return Err(Error::Index(format!(
                    "one_hot: class {bad} is outside 0..{classes}"
                )));
            }
        }
        let range = Tensor::arange(0, classes as i64, 1, DType::I64, self.device())?;
        idx.unsqueeze(-1)?.eq(&range)?.to_dtype(DType::I64)
    }
}
