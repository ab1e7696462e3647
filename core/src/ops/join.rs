//! Joining and splitting: cat, stack, pad, split, chunk, flip, roll, tril, triu. Splits and
//! flips are views; joins copy into one new tensor.

use super::promote::result_type;
use crate::assign::Value;
use crate::dtype::{DType, Scalar};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, Expr, Kernel};
use crate::layout::normalize_axis;
use crate::tensor::{launch, Tensor};

impl Tensor {
    /// `self` with `value` added around its trailing axes (PyTorch's `F.pad` in constant
    /// mode): `widths[k] = (before, after)` pads axis `ndim - widths.len() + k`, listed in axis
    /// order (NumPy's order; `F.pad` lists the last axis first). A negative width removes
    /// elements from that side instead. The value is cast to the tensor's dtype.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let t = Tensor::ones([2, 2], DType::I32, &dev)?;
    /// let p = t.pad(&[(0, 1), (1, -1)], 7)?;
    /// assert_eq!(p.shape(), &[3, 2]);
    /// assert_eq!(p.to_vec::<i32>()?, vec![7, 1, 7, 1, 7, 7]);
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn pad(&self, widths: &[(isize, isize)], value: impl Into<Scalar>) -> Result<Tensor> {
        let value = value.into();
        if widths.len() > self.ndim() {
            return Err(Error::Shape(format!(
                "pad: {} pairs of widths for a tensor of rank {} (shape {:?})",
                widths.len(),
                self.ndim(),
                self.shape()
            )));
        }
        let first = self.ndim() - widths.len();
        let mut shape = self.shape().to_vec();
        for (k, &(before, after)) in widths.iter().enumerate() {
            let n = shape[first + k] as isize;
            let padded = n + before + after;
            if padded < 0 {
                return Err(Error::Shape(format!(
                    "pad: widths ({before}, {after}) leave {padded} elements on axis {} of size {n}",
                    first + k
                )));
            }
            shape[first + k] = padded as usize;
        }
        if crate::autograd::needed([self]) {
            let out = crate::autograd::no_grad(|| self.pad(widths, value))?;
            // The gradient is the padded region's: padding back by the negated widths crops
            // what was added and puts zeros where elements were removed.
            let back: Vec<(isize, isize)> = widths.iter().map(|&(b, a)| (-b, -a)).collect();
            return Ok(crate::autograd::record(
                "PadBackward",
                &[self],
                out,
                Vec::new(),
                move |g| Ok(vec![Some(g.pad(&back, 0)?)]),
            ));
        }
        let out = Tensor::full(
            shape,
            value.cast(self.dtype(), false),
            self.dtype(),
            self.device(),
        )?;
        // The part of `self` that stays, and where it lands.
        let (mut kept, mut placed) = (self.clone(), out.clone());
        for (k, &(before, after)) in widths.iter().enumerate() {
            let axis = (first + k) as isize;
            let n = kept.shape()[first + k];
            let (cut_front, cut_back) = ((-before).max(0) as usize, (-after).max(0) as usize);
            let len = n.saturating_sub(cut_front + cut_back);
            if len == 0 {
                return Ok(out);
            }
            kept = kept.narrow(axis, cut_front, len)?;
            placed = placed.narrow(axis, before.max(0) as usize, len)?;
        }
        placed.assign(&kept)?;
        Ok(out)
    }

    /// The tensors joined along `axis`; other axes must match. The dtype is the promoted one.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let a = Tensor::zeros([1, 2], DType::I32, &dev).unwrap();
    /// let b = Tensor::ones([2, 2], DType::I32, &dev).unwrap();
    /// let c = Tensor::cat(&[&a, &b], 0).unwrap();
    /// assert_eq!(c.to_vec::<i32>().unwrap(), vec![0, 0, 1, 1, 1, 1]);
    /// ```
    pub fn cat(tensors: &[&Tensor], axis: isize) -> Result<Tensor> {
        let first = tensors
            .first()
            .ok_or_else(|| Error::Invalid("cat needs at least one tensor".into()))?;
        let a = normalize_axis(axis, first.ndim())?;
        if crate::autograd::needed(tensors.iter().copied()) {
            let out = crate::autograd::no_grad(|| Tensor::cat(tensors, axis))?;
            return Ok(record_cat(tensors, a, out));
        }
        let mut shape = first.shape().to_vec();
        shape[a] = 0;
        for t in tensors {
            first.same_device(t, "cat")?;
            let fits = t.ndim() == first.ndim()
                && (0..t.ndim()).all(|d| d == a || t.shape()[d] == first.shape()[d]);
            if !fits {
                return Err(Error::Shape(format!(
                    "cat along axis {a}: shapes {:?} and {:?} differ off that axis",
                    first.shape(),
                    t.shape()
                )));
            }
            shape[a] += t.shape()[a];
        }
        let values: Vec<Value> = tensors.iter().map(|t| Value::from(*t)).collect();
        let out = Tensor::alloc(&shape, result_type(&values), first.device())?;
        let mut start = 0;
        for t in tensors {
            let n = t.shape()[a];
            out.narrow(a as isize, start, n)?.assign(*t)?;
            start += n;
        }
        Ok(out)
    }

    /// The tensors (all of one shape) stacked along a new axis `axis`.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let a = Tensor::zeros([3], DType::F32, &dev).unwrap();
    /// assert_eq!(Tensor::stack(&[&a, &a], 1).unwrap().shape(), &[3, 2]);
    /// ```
    pub fn stack(tensors: &[&Tensor], axis: isize) -> Result<Tensor> {
        let first = tensors
            .first()
            .ok_or_else(|| Error::Invalid("stack needs at least one tensor".into()))?;
        if let Some(t) = tensors.iter().find(|t| t.shape() != first.shape()) {
            return Err(Error::Shape(format!(
                "stack needs tensors of one shape, got {:?} and {:?}",
                first.shape(),
                t.shape()
            )));
        }
        let a = normalize_axis(axis, first.ndim() + 1)? as isize;
        let parts = tensors
            .iter()
            .map(|t| t.unsqueeze(a))
            .collect::<Result<Vec<_>>>()?;
        Tensor::cat(&parts.iter().collect::<Vec<_>>(), a)
    }

    /// Views of `size` elements along `axis` (the last may be shorter).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::arange(0, 5, 1, DType::I32, &Device::cpu()).unwrap();
    /// let parts = t.split(2, 0).unwrap();
    /// assert_eq!(parts.iter().map(|p| p.numel()).collect::<Vec<_>>(), vec![2, 2, 1]);
    /// ```
    pub fn split(&self, size: usize, axis: isize) -> Result<Vec<Tensor>> {
        let a = normalize_axis(axis, self.ndim())?;
        if size == 0 {
            return Err(Error::Invalid("split size must not be 0".into()));
        }
        let n = self.shape()[a];
        (0..n)
            .step_by(size)
            .map(|start| self.narrow(a as isize, start, size.min(n - start)))
            .collect()
    }

    /// Views of the given sizes along `axis`, which must add up to the axis's size.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::arange(0, 5, 1, DType::I32, &Device::cpu()).unwrap();
    /// let parts = t.split_sizes(&[1, 4], 0).unwrap();
    /// assert_eq!(parts[1].to_vec::<i32>().unwrap(), vec![1, 2, 3, 4]);
    /// assert!(t.split_sizes(&[1, 1], 0).is_err());
    /// ```
    pub fn split_sizes(&self, sizes: &[usize], axis: isize) -> Result<Vec<Tensor>> {
        let a = normalize_axis(axis, self.ndim())?;
        let total: usize = sizes.iter().sum();
        if total != self.shape()[a] {
            return Err(Error::Shape(format!(
                "split sizes {sizes:?} add up to {total}, axis {a} has size {}",
                self.shape()[a]
            )));
        }
        let mut start = 0;
        sizes
            .iter()
            .map(|&s| {
                let v = self.narrow(a as isize, start, s);
                start += s;
                v
            })
            .collect()
    }

    /// At most `chunks` views along `axis`, each of `ceil(size / chunks)` elements but the last
    /// (as PyTorch).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::arange(0, 6, 1, DType::I32, &Device::cpu()).unwrap();
    /// assert_eq!(t.chunk(4, 0).unwrap().len(), 3); // sizes 2, 2, 2
    /// ```
    pub fn chunk(&self, chunks: usize, axis: isize) -> Result<Vec<Tensor>> {
        if chunks == 0 {
            return Err(Error::Invalid("chunk count must not be 0".into()));
        }
        let a = normalize_axis(axis, self.ndim())?;
        self.split(self.shape()[a].div_ceil(chunks).max(1), axis)
    }

    /// The view with `axes` reversed (negative strides; PyTorch copies, strata need not).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::arange(0, 4, 1, DType::I32, &Device::cpu()).unwrap().reshape([2, 2]).unwrap();
    /// let f = t.flip(&[0, 1]).unwrap();
    /// assert_eq!((f.to_vec::<i32>().unwrap(), f.shares_storage(&t)), (vec![3, 2, 1, 0], true));
    /// ```
    pub fn flip(&self, axes: &[isize]) -> Result<Tensor> {
        let mut args: Vec<crate::index::SliceArg> =
            vec![crate::index::SliceArg::from(..); self.ndim()];
        for &axis in axes {
            let a = normalize_axis(axis, self.ndim())?;
            args[a] = crate::index::SliceArg::from(..).with_step(-1)?;
        }
        self.slice(args)
    }

    /// The elements shifted by `shift` positions along `axis` with wrap-around (the
    /// flattened tensor, reshaped back, for `None`).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::arange(0, 5, 1, DType::I32, &Device::cpu()).unwrap();
    /// assert_eq!(t.roll(2, Some(0)).unwrap().to_vec::<i32>().unwrap(), vec![3, 4, 0, 1, 2]);
    /// assert_eq!(t.roll(-1, None).unwrap().to_vec::<i32>().unwrap(), vec![1, 2, 3, 4, 0]);
    /// ```
    pub fn roll(&self, shift: isize, axis: Option<isize>) -> Result<Tensor> {
        let Some(axis) = axis else {
            return self
                .reshape([-1])?
                .roll(shift, Some(0))?
                .reshape(self.shape());
        };
        let a = normalize_axis(axis, self.ndim())?;
        let n = self.shape()[a];
        if n == 0 {
            return self.copy();
        }
        let s = shift.rem_euclid(n as isize) as usize;
        let (tail, head) = (
            self.narrow(a as isize, n - s, s)?,
            self.narrow(a as isize, 0, n - s)?,
        );
        Tensor::cat(&[&tail, &head], a as isize)
    }

    /// The lower triangle of the last two axes: elements with `col - row > k` become 0.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::ones([2, 3], DType::U8, &Device::cpu()).unwrap();
    /// assert_eq!(t.tril(0).unwrap().to_vec::<u8>().unwrap(), vec![1, 0, 0, 1, 1, 0]);
    /// ```
    pub fn tril(&self, k: isize) -> Result<Tensor> {
        self.triangle(k, BinaryOp::Le, "tril")
    }

    /// The upper triangle of the last two axes: elements with `col - row < k` become 0.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::ones([3, 2], DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.triu(-1).unwrap().to_vec::<f32>().unwrap(), vec![1.0, 1.0, 1.0, 1.0, 0.0, 1.0]);
    /// ```
    pub fn triu(&self, k: isize) -> Result<Tensor> {
        self.triangle(k, BinaryOp::Ge, "triu")
    }

    /// Keeps elements where `(col - row) keep k`; the others become 0.
    fn triangle(&self, k: isize, keep: BinaryOp, what: &str) -> Result<Tensor> {
        if crate::autograd::needed([self]) {
            let out = crate::autograd::no_grad(|| self.triangle(k, keep, what))?;
            let name = if keep == BinaryOp::Le {
                "TrilBackward"
            } else {
                "TriuBackward"
            };
            return Ok(crate::autograd::record(
                name,
                &[self],
                out,
                Vec::new(),
                move |g| {
                    let gx = if keep == BinaryOp::Le {
                        g.tril(k)?
                    } else {
                        g.triu(k)?
                    };
                    Ok(vec![Some(gx)])
                },
            ));
        }
        if self.ndim() < 2 {
            return Err(Error::Shape(format!(
                "{what} needs a tensor of rank 2 or more, got shape {:?}",
                self.shape()
            )));
        }
        let (rows, cols) = (self.shape()[self.ndim() - 2], self.shape()[self.ndim() - 1]);
        let out = Tensor::alloc(self.shape(), self.dtype(), self.device())?;
        let i64s = |k| Expr::scalar(k, DType::I64);
        let i = Expr::linear_index;
        let col = Expr::binary(BinaryOp::Rem, i(), i64s(0));
        let row = Expr::binary(
            BinaryOp::Rem,
            Expr::binary(BinaryOp::FloorDiv, i(), i64s(0)),
            i64s(1),
        );
        let diag = Expr::binary(BinaryOp::Sub, col, row);
        let kept = Expr::binary(keep, diag, i64s(2));
        let zero = Expr::scalar(3, self.dtype());
        let expr = Expr::select(kept, Expr::input(0, self.dtype()), zero);
        let scalars = vec![
            Scalar::I64(cols.max(1) as i64),
            Scalar::I64(rows.max(1) as i64),
            Scalar::I64(k as i64),
            Scalar::Bool(false).cast(self.dtype(), false),
        ];
        launch(Kernel::map(expr), &out, &[self], scalars)?;
        Ok(out)
    }
}

/// `out = cat(tensors, axis)` with its backward node: each input's part of the gradient (a
/// view), in its own dtype.
fn record_cat(tensors: &[&Tensor], axis: usize, out: Tensor) -> Tensor {
    let parts: Vec<(usize, usize, DType, bool)> = {
        let mut start = 0;
        tensors
            .iter()
            .map(|t| {
                let n = t.shape()[axis];
                start += n;
                (start - n, n, t.dtype(), t.requires_grad())
            })
            .collect()
    };
    crate::autograd::record("CatBackward", tensors, out, Vec::new(), move |g| {
        parts
            .iter()
            .map(|&(start, n, dtype, wanted)| {
                if !wanted {
                    return Ok(None);
                }
                let part = g.narrow(axis as isize, start, n)?;
                Ok(Some(if part.dtype() == dtype {
                    part
                } else {
                    part.to_dtype(dtype)?
                }))
            })
            .collect()
    })
}
