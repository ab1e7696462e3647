//! Views: methods that return a tensor sharing storage with `self` (and `reshape`, which
//! copies only when no view can show the result, and `contiguous`).

use crate::error::{Error, Result};
use crate::index::{self, IndexArgs};
use crate::layout::{checked_numel, normalize_axis, IntoDims, Layout};
use crate::tensor::Tensor;

impl Tensor {
    /// The view selected by an index expression built with [`s!`](crate::s) (NumPy basic
    /// indexing: integers drop an axis, ranges keep it, `NewAxis` adds one, `...` fills in).
    ///
    /// ```
    /// use strata_core::{s, Device, DType, Tensor};
    /// let t = Tensor::zeros([2, 2, 4], DType::U8, &Device::cpu()).unwrap();
    /// assert_eq!(t.slice(s![1, 1, 3]).unwrap().shape(), &[] as &[usize]);
    /// assert_eq!(t.slice(s![.., 1.., 1..-1]).unwrap().shape(), &[2, 1, 2]);
    /// assert!(t.slice(s![2]).is_err());
    /// ```
    ///
    /// A tensor of i32/i64 indices selects along its axis and makes the result a copy
    /// (SambaTensor's `t[None, :, idx]`):
    ///
    /// ```
    /// use strata_core::{s, Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let t = Tensor::arange(0, 6, 1, DType::I32, &dev).unwrap().reshape([2, 3]).unwrap();
    /// let idx = Tensor::from_slice(&[0i64, 2], [2], &dev).unwrap();
    /// let r = t.slice(s![NewAxis, .., &idx]).unwrap();
    /// assert_eq!(r.shape(), &[1, 2, 2]);
    /// assert_eq!(r.to_vec::<i32>().unwrap(), vec![0, 2, 3, 5]);
    /// ```
    pub fn slice(&self, args: impl IndexArgs) -> Result<Tensor> {
        let args = args.into_args()?;
        match index::split_tensor_index(&args, self.ndim())? {
            None => {
                let out = self.with_layout(index::apply(&self.layout, &args)?);
                Ok(self.record_view("SliceBackward", out, move |g, shape| {
                    let z = Tensor::zeros(shape, g.dtype(), g.device())?;
                    z.with_layout(index::apply(&z.layout, &args)?).assign(g)?;
                    Ok(z)
                }))
            }
            Some((basic, axis, idx)) => {
                let view = self.with_layout(index::apply(&self.layout, &basic)?);
                let picked = view.index_select(axis as isize, &idx.reshape([-1])?)?;
                picked.view(index::with_index_axes(view.shape(), axis, idx.shape()))
            }
        }
    }

    /// A view with shape `dims` (one entry may be `-1`, inferred) when the strides allow one,
    /// otherwise an `Err` that says so (use [`reshape`](Tensor::reshape) to copy).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([4, 6], DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.view([2, -1, 3]).unwrap().shape(), &[2, 4, 3]);
    /// let err = t.t().unwrap().view([24]).unwrap_err();
    /// assert!(err.to_string().contains("reshape"));
    /// ```
    pub fn view(&self, dims: impl IntoDims) -> Result<Tensor> {
        let shape = self.infer_shape(dims)?;
        match self.layout.reshaped(&shape) {
            Some(layout) => Ok(self.reshaped_view(layout)),
            None => Err(Error::Shape(format!(
                "cannot view shape {:?} with strides {:?} as shape {shape:?} without copying; \
                 use reshape, which copies",
                self.shape(),
                self.strides()
            ))),
        }
    }

    /// Shape `dims` (one entry may be `-1`): a view when the strides allow, else a copy.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::arange(0, 6, 1, DType::I32, &Device::cpu()).unwrap();
    /// let m = t.reshape([2, 3]).unwrap();
    /// assert!(m.shares_storage(&t));
    /// let flat = m.t().unwrap().reshape([-1]).unwrap();
    /// assert!(!flat.shares_storage(&t));
    /// assert_eq!(flat.to_vec::<i32>().unwrap(), vec![0, 3, 1, 4, 2, 5]);
    /// ```
    pub fn reshape(&self, dims: impl IntoDims) -> Result<Tensor> {
        let shape = self.infer_shape(dims)?;
        match self.layout.reshaped(&shape) {
            Some(layout) => Ok(self.reshaped_view(layout)),
            None => self.copy()?.view(shape),
        }
    }

    /// Resolves a `-1` and checks the element count against `self`.
    fn infer_shape(&self, dims: impl IntoDims) -> Result<Vec<usize>> {
        let dims = dims.into_dims()?;
        let bad = |why: String| {
            Error::Shape(format!(
                "cannot reshape {:?} to {dims:?}: {why}",
                self.shape()
            ))
        };
        let unknown: Vec<usize> = (0..dims.len()).filter(|&k| dims[k] == -1).collect();
        if unknown.len() > 1 {
            return Err(bad("only one size may be -1".into()));
        }
        if let Some(&d) = dims.iter().find(|&&d| d < -1) {
            return Err(bad(format!("size {d} is negative")));
        }
        let known: Vec<usize> = dims
            .iter()
            .filter(|&&d| d >= 0)
            .map(|&d| d as usize)
            .collect();
        let known_numel = checked_numel(&known)?;
        let mut shape: Vec<usize> = dims.iter().map(|&d| d.max(0) as usize).collect();
        if let Some(&k) = unknown.first() {
            if known_numel == 0 || !self.numel().is_multiple_of(known_numel) {
                return Err(bad(format!(
                    "{} elements do not divide into the given sizes",
                    self.numel()
                )));
            }
            shape[k] = self.numel() / known_numel;
        } else if known_numel != self.numel() {
            return Err(bad(format!(
                "{} elements cannot become {known_numel}",
                self.numel()
            )));
        }
        Ok(shape)
    }

    /// The view with axes reordered: axis `k` of the result is axis `order[k]` of `self`
    /// (negative axes count from the end).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([2, 3, 4], DType::F32, &Device::cpu()).unwrap();
    /// let p = t.permute([2, 0, -2]).unwrap();
    /// assert_eq!((p.shape(), p.strides()), (&[4, 2, 3][..], &[1, 12, 4][..]));
    /// assert!(t.permute([0, 0, 1]).is_err());
    /// ```
    pub fn permute(&self, order: impl IntoDims) -> Result<Tensor> {
        let order = order.into_dims()?;
        let axes = order
            .iter()
            .map(|&a| normalize_axis(a, self.ndim()))
            .collect::<Result<Vec<_>>>()
            .map_err(|e| Error::Index(format!("permute {order:?}: {e}")))?;
        let out = self.with_layout(self.layout.permuted(&axes)?);
        Ok(self.record_view("PermuteBackward", out, move |g, _| {
            let mut inverse = vec![0isize; axes.len()];
            for (k, &a) in axes.iter().enumerate() {
                inverse[a] = k as isize;
            }
            g.permute(inverse)
        }))
    }

    /// The view with axes `a` and `b` swapped.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([2, 3, 4], DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.transpose(0, -1).unwrap().shape(), &[4, 3, 2]);
    /// ```
    pub fn transpose(&self, a: isize, b: isize) -> Result<Tensor> {
        if self.ndim() == 0 {
            // As PyTorch: a 0-d tensor accepts axes 0 and -1, and stays as it is.
            normalize_axis(a, 1)?;
            normalize_axis(b, 1)?;
            return Ok(self.clone());
        }
        let (a, b) = (
            normalize_axis(a, self.ndim())?,
            normalize_axis(b, self.ndim())?,
        );
        let mut order: Vec<usize> = (0..self.ndim()).collect();
        order.swap(a, b);
        let out = self.with_layout(self.layout.permuted(&order)?);
        Ok(self.record_view("TransposeBackward", out, move |g, _| {
            g.transpose(a as isize, b as isize)
        }))
    }

    /// The transpose of a tensor of rank 2 or less (rank 0 and 1 are returned as they are).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([2, 3], DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.t().unwrap().strides(), &[1, 3]);
    /// assert!(Tensor::zeros([1, 2, 3], DType::F32, &Device::cpu()).unwrap().t().is_err());
    /// ```
    pub fn t(&self) -> Result<Tensor> {
        match self.ndim() {
            0 | 1 => Ok(self.clone()),
            2 => self.transpose(0, 1),
            n => Err(Error::Shape(format!(
                "t() takes a tensor of rank 2 or less, this one has rank {n} (shape {:?}); \
                 use transpose or permute",
                self.shape()
            ))),
        }
    }

    /// The view without any size-1 axes.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([1, 3, 1], DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.squeeze().shape(), &[3]);
    /// ```
    pub fn squeeze(&self) -> Tensor {
        let mut layout = self.layout.clone();
        for axis in (0..self.ndim()).rev() {
            if self.shape()[axis] == 1 {
                layout.remove_axis(axis);
            }
        }
        self.reshaped_view(layout)
    }

    /// The view without axis `axis` when its size is 1; unchanged otherwise (as PyTorch).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([1, 3, 1], DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.squeeze_axis(-1).unwrap().shape(), &[1, 3]);
    /// assert_eq!(t.squeeze_axis(1).unwrap().shape(), &[1, 3, 1]);
    /// ```
    pub fn squeeze_axis(&self, axis: isize) -> Result<Tensor> {
        if self.ndim() == 0 {
            normalize_axis(axis, 1)?; // axis 0 or -1 of a 0-d tensor, as PyTorch
            return Ok(self.clone());
        }
        let axis = normalize_axis(axis, self.ndim())?;
        let mut layout = self.layout.clone();
        if self.shape()[axis] == 1 {
            layout.remove_axis(axis);
        }
        Ok(self.reshaped_view(layout))
    }

    /// The view with a size-1 axis inserted at `axis` (`-1` appends one).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([3], DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.unsqueeze(0).unwrap().shape(), &[1, 3]);
    /// assert_eq!(t.unsqueeze(-1).unwrap().shape(), &[3, 1]);
    /// ```
    pub fn unsqueeze(&self, axis: isize) -> Result<Tensor> {
        let axis = normalize_axis(axis, self.ndim() + 1)?;
        let mut layout = self.layout.clone();
        layout.insert_axis(axis);
        Ok(self.reshaped_view(layout))
    }

    /// The view broadcast to `dims`; `-1` keeps an axis's size (as `torch.expand`). Only
    /// size-1 axes (and new leading axes) can grow.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([3, 1], DType::F32, &Device::cpu()).unwrap();
    /// let e = t.expand([2, -1, 4]).unwrap();
    /// assert_eq!((e.shape(), e.strides()), (&[2, 3, 4][..], &[0, 1, 0][..]));
    /// assert!(t.expand([4, 4]).is_err());
    /// ```
    pub fn expand(&self, dims: impl IntoDims) -> Result<Tensor> {
        let dims = dims.into_dims()?;
        if dims.len() < self.ndim() {
            return Err(Error::Shape(format!(
                "cannot expand shape {:?} to {dims:?}, which has fewer axes",
                self.shape()
            )));
        }
        let lead = dims.len() - self.ndim();
        let shape = dims
            .iter()
            .enumerate()
            .map(|(k, &d)| match d {
                -1 if k >= lead => Ok(self.shape()[k - lead]),
                d if d >= 0 => Ok(d as usize),
                _ => Err(Error::Shape(format!(
                    "cannot expand shape {:?} to {dims:?}: size {d} at axis {k}",
                    self.shape()
                ))),
            })
            .collect::<Result<Vec<_>>>()?;
        self.broadcast_to(shape)
    }

    /// The view broadcast to `dims` under NumPy's rules.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([3], DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.broadcast_to([2, 3]).unwrap().strides(), &[0, 1]);
    /// ```
    pub fn broadcast_to(&self, dims: impl IntoDims) -> Result<Tensor> {
        let shape = crate::layout::shape_arg(dims)?;
        let out = self.with_layout(self.layout.broadcast_to(&shape)?);
        Ok(self.record_view("ExpandBackward", out, |g, shape| {
            crate::autograd::sum_to_shape(g, shape)
        }))
    }

    /// The view of `len` elements from `start` along `axis`.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::arange(0, 10, 1, DType::I64, &Device::cpu()).unwrap();
    /// assert_eq!(t.narrow(0, 7, 3).unwrap().to_vec::<i64>().unwrap(), vec![7, 8, 9]);
    /// assert!(t.narrow(0, 8, 3).is_err());
    /// ```
    pub fn narrow(&self, axis: isize, start: usize, len: usize) -> Result<Tensor> {
        let a = normalize_axis(axis, self.ndim())?;
        let n = self.shape()[a];
        if start.checked_add(len).is_none_or(|end| end > n) {
            return Err(Error::Index(format!(
                "narrow({axis}, {start}, {len}) reaches past the end of axis {a} of size {n}"
            )));
        }
        let mut layout = self.layout.clone();
        layout.restrict(a, start, len, 1);
        let out = self.with_layout(layout);
        Ok(self.record_view("NarrowBackward", out, move |g, shape| {
            let z = Tensor::zeros(shape, g.dtype(), g.device())?;
            z.narrow(a as isize, start, len)?.assign(g)?;
            Ok(z)
        }))
    }

    /// The elements as one axis: a view when the strides allow, else a copy.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([2, 3], DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.flatten().unwrap().shape(), &[6]);
    /// ```
    pub fn flatten(&self) -> Result<Tensor> {
        self.reshape([self.numel()])
    }

    /// `self` when it is contiguous, otherwise a contiguous copy.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([2, 3], DType::F32, &Device::cpu()).unwrap();
    /// assert!(t.contiguous().unwrap().shares_storage(&t));
    /// assert!(t.t().unwrap().contiguous().unwrap().is_contiguous());
    /// ```
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            Ok(self.clone())
        } else {
            self.copy()
        }
    }

    /// A contiguous copy with storage of its own (PyTorch's `clone()`; Rust's `clone()` is a
    /// cheap handle copy that shares storage).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::ones([2], DType::F32, &Device::cpu()).unwrap();
    /// let c = t.copy().unwrap();
    /// c.fill(5.0).unwrap();
    /// assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 1.0]);
    /// ```
    pub fn copy(&self) -> Result<Tensor> {
        let out = Tensor::alloc(self.shape(), self.dtype, self.device())?;
        crate::autograd::no_grad(|| out.assign(self))?;
        Ok(self.record_view("CopyBackward", out, |g, _| Ok(g.clone())))
    }

    /// `out`, a view of `self` (or a copy of it), with the node `name` recorded when `self`
    /// requires a gradient: `backward` maps the view's gradient to one of `self`'s shape
    /// (passed in), with grad mode off.
    fn record_view(
        &self,
        name: &'static str,
        out: Tensor,
        backward: impl Fn(&Tensor, &[usize]) -> Result<Tensor> + Send + Sync + 'static,
    ) -> Tensor {
        if !crate::autograd::needed([self]) {
            return out;
        }
        let shape = self.shape().to_vec();
        crate::autograd::record(name, &[self], out, Vec::new(), move |g| {
            Ok(vec![Some(backward(g, &shape)?)])
        })
    }

    /// The view of `self` with `layout`, which holds the same elements in the same order
    /// (a reshape, a squeeze, an unsqueeze): its gradient is the view's, reshaped back.
    fn reshaped_view(&self, layout: Layout) -> Tensor {
        let out = self.with_layout(layout);
        self.record_view("ViewBackward", out, |g, shape| g.reshape(shape.to_vec()))
    }

    /// `Some(order)` when permuting the axes by `order` makes this view contiguous.
    pub(crate) fn permute_to_contiguous(&self) -> Option<Vec<usize>> {
        let order = self.layout.memory_order();
        self.layout
            .permuted(&order)
            .ok()
            .filter(Layout::is_contiguous)
            .map(|_| order)
    }

    /// Checks `layout` against this tensor's storage and returns the view.
    pub(crate) fn checked_view(&self, layout: Layout) -> Result<Tensor> {
        if layout.numel() > 0 {
            let (lo, hi) = layout.span();
            let len = self.storage.bytes / self.itemsize();
            if lo < 0 || hi as usize > len {
                return Err(Error::Index(format!(
                    "layout {layout:?} reaches outside storage of {len} elements"
                )));
            }
        }
        Ok(self.with_layout(layout))
    }

    /// A view with explicit shape, strides and offset (like `torch.as_strided`), checked to lie
    /// inside the storage.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::arange(0, 9, 1, DType::I32, &Device::cpu()).unwrap();
    /// let diag = t.as_strided([3], [4], 0).unwrap();
    /// assert_eq!(diag.to_vec::<i32>().unwrap(), vec![0, 4, 8]);
    /// assert!(t.as_strided([3], [5], 0).is_err());
    /// ```
    pub fn as_strided(
        &self,
        shape: impl IntoDims,
        strides: impl IntoDims,
        offset: usize,
    ) -> Result<Tensor> {
        if crate::autograd::needed([self]) {
            return Err(Error::Invalid(
                "as_strided has no gradient: detach() the tensor first, or use slice, narrow, \
                 permute or expand, which do"
                    .into(),
            ));
        }
        let shape = crate::layout::shape_arg(shape)?;
        let layout = Layout::new(shape, strides.into_dims()?, offset)?;
        self.checked_view(layout)
    }
}
