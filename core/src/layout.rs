//! Where a tensor's elements sit in its storage: shape, signed strides (in elements) and offset.
//! All view arithmetic lives here, independent of devices.

use crate::error::{Error, Result};

/// A list of extents on the launch path, inline up to 6 axes (coalesced layouts rarely have
/// more): a plan is made on every launch, and a one-element op costs a few microseconds in
/// all, so planning must not allocate per axis list.
///
/// ```
/// let d: strata_core::layout::Dims = [2usize, 3].into_iter().collect();
/// assert!(!d.spilled());
/// ```
pub type Dims = smallvec::SmallVec<[usize; 6]>;

/// Strides on the launch path, inline like [`Dims`].
///
/// ```
/// let s: strata_core::layout::Strides = smallvec::smallvec![3, 1];
/// assert_eq!(&s[..], &[3, 1]);
/// ```
pub type Strides = smallvec::SmallVec<[isize; 6]>;

/// Shape, strides and offset of a tensor view. Element `[i0, i1, ...]` sits at storage
/// position `offset + Σ i_k · strides[k]`; strides may be 0 (broadcast) or negative (flipped).
///
/// ```
/// use strata_core::Layout;
/// let l = Layout::contiguous(&[2, 3]).unwrap();
/// assert_eq!(l.strides(), &[3, 1]);
/// assert_eq!(l.position(&[1, 2]), 5);
/// assert!(l.is_contiguous());
/// ```
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    // Inline up to rank 6: cloning a tensor (every op's operands) allocates nothing.
    shape: Dims,
    strides: Strides,
    offset: usize,
}

/// The number of elements of `shape`, or an `Err` naming the shape when it overflows.
///
/// ```
/// assert_eq!(strata_core::layout::checked_numel(&[2, 3, 4]).unwrap(), 24);
/// assert!(strata_core::layout::checked_numel(&[usize::MAX, 2]).is_err());
/// ```
pub fn checked_numel(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(|| Error::Shape(format!("the element count of shape {shape:?} overflows")))
}

/// Row-major strides for `shape` (the last axis has stride 1).
///
/// ```
/// assert_eq!(strata_core::layout::contiguous_strides(&[4, 2, 3]), vec![6, 3, 1]);
/// ```
pub fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut strides = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(d.max(1) as isize);
    }
    strides
}

/// Normalizes a possibly negative axis for a tensor of rank `ndim`.
///
/// ```
/// assert_eq!(strata_core::layout::normalize_axis(-1, 3).unwrap(), 2);
/// assert!(strata_core::layout::normalize_axis(3, 3).is_err());
/// ```
pub fn normalize_axis(axis: isize, ndim: usize) -> Result<usize> {
    let n = ndim as isize;
    let a = if axis < 0 { axis + n } else { axis };
    if (0..n).contains(&a) {
        Ok(a as usize)
    } else {
        Err(Error::Index(format!(
            "axis {axis} is out of range for a tensor of rank {ndim} (valid: {} to {})",
            -n,
            n - 1
        )))
    }
}

/// Drops size-1 axes and merges neighbours that every operand steps through as one
/// (`stride[i] == stride[i+1] * shape[i+1]`); the row-major enumeration is unchanged. Backends
/// call it to index with as few axes as possible.
///
/// ```
/// use strata_core::layout::coalesce;
/// let (shape, strides) = coalesce(&[2, 1, 3, 4], &[&[12, 12, 4, 1], &[0, 5, 0, 1]]);
/// assert_eq!(shape, vec![6, 4]);
/// assert_eq!(strides, vec![vec![4, 1], vec![0, 1]]);
/// ```
pub fn coalesce(shape: &[usize], strides: &[&[isize]]) -> (Vec<usize>, Vec<Vec<isize>>) {
    let mut out_shape: Vec<usize> = Vec::with_capacity(shape.len());
    let mut out_strides: Vec<Vec<isize>> = vec![Vec::with_capacity(shape.len()); strides.len()];
    for (d, &n) in shape.iter().enumerate() {
        if n == 1 {
            continue;
        }
        if !out_shape.is_empty() {
            let merge = strides.iter().zip(&out_strides).all(|(s, o)| {
                *o.last()
                    .expect("one stride list per operand, all of the shape's rank")
                    == s[d] * n as isize
            });
            if merge {
                let l = out_shape.len() - 1;
                out_shape[l] *= n;
                for (o, s) in out_strides.iter_mut().zip(strides) {
                    *o.last_mut()
                        .expect("one stride list per operand, all of the shape's rank") = s[d];
                }
                continue;
            }
        }
        out_shape.push(n);
        for (o, s) in out_strides.iter_mut().zip(strides) {
            o.push(s[d]);
        }
    }
    (out_shape, out_strides)
}

/// The shape two shapes broadcast to under NumPy's rules, or an `Err` naming both.
///
/// ```
/// use strata_core::layout::broadcast_shapes;
/// assert_eq!(broadcast_shapes(&[3, 1], &[1, 4]).unwrap(), vec![3, 4]);
/// assert_eq!(broadcast_shapes(&[5, 2, 1], &[7]).unwrap(), vec![5, 2, 7]);
/// assert!(broadcast_shapes(&[3], &[4]).is_err());
/// ```
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    if a == b {
        return Ok(a.to_vec()); // the common case, on every op's path
    }
    let n = a.len().max(b.len());
    let dim = |s: &[usize], i: usize| {
        if i + s.len() >= n {
            s[i + s.len() - n]
        } else {
            1
        }
    };
    (0..n)
        .map(|i| match (dim(a, i), dim(b, i)) {
            (x, y) if x == y || y == 1 => Ok(x),
            (1, y) => Ok(y),
            (x, y) => Err(Error::Shape(format!(
                "shapes {a:?} and {b:?} do not broadcast: axis {i} has sizes {x} and {y}"
            ))),
        })
        .collect()
}

// By hand: SmallVec's derived clone goes through `extend`; a slice copy is several times
// cheaper, and every op clones the layouts of its operands.
impl Clone for Layout {
    fn clone(&self) -> Layout {
        Layout {
            shape: Dims::from_slice(&self.shape),
            strides: Strides::from_slice(&self.strides),
            offset: self.offset,
        }
    }
}

impl Layout {
    /// The axes from the largest stride to the smallest (stable for ties): the order the
    /// elements lie in memory.
    ///
    /// ```
    /// use strata_core::Layout;
    /// let t = Layout::contiguous(&[2, 3]).unwrap().permuted(&[1, 0]).unwrap();
    /// assert_eq!(t.memory_order(), vec![1, 0]);
    /// ```
    pub fn memory_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.ndim()).collect();
        order.sort_by_key(|&a| std::cmp::Reverse(self.strides()[a].unsigned_abs()));
        order
    }

    /// A row-major layout of `shape` at offset 0.
    ///
    /// ```
    /// assert_eq!(strata_core::Layout::contiguous(&[]).unwrap().numel(), 1);
    /// ```
    pub fn contiguous(shape: &[usize]) -> Result<Layout> {
        checked_numel(shape)?;
        Ok(Layout {
            shape: Dims::from_slice(shape),
            strides: {
                let mut strides: Strides = smallvec::smallvec![0isize; shape.len()];
                let mut acc = 1isize;
                for (s, &d) in strides.iter_mut().zip(shape).rev() {
                    *s = acc;
                    acc = acc.saturating_mul(d.max(1) as isize);
                }
                strides
            },
            offset: 0,
        })
    }

    /// A layout from its parts. `Err` when ranks differ, the element count overflows, or an
    /// element would sit before position 0.
    ///
    /// ```
    /// let l = strata_core::Layout::new(vec![3], vec![-1], 2).unwrap();
    /// assert_eq!(l.position(&[2]), 0);
    /// assert!(strata_core::Layout::new(vec![3], vec![-1], 1).is_err());
    /// ```
    pub fn new(shape: Vec<usize>, strides: Vec<isize>, offset: usize) -> Result<Layout> {
        if shape.len() != strides.len() {
            return Err(Error::Shape(format!(
                "shape {shape:?} and strides {strides:?} have different ranks"
            )));
        }
        checked_numel(&shape)?;
        let layout = Layout {
            shape: shape.into(),
            strides: strides.into(),
            offset,
        };
        if layout.numel() > 0 && layout.span().0 < 0 {
            return Err(Error::Index(format!(
                "layout {layout:?} reaches before the start of its storage"
            )));
        }
        Ok(layout)
    }

    /// The size of each axis.
    ///
    /// ```
    /// assert_eq!(strata_core::Layout::contiguous(&[2, 5]).unwrap().shape(), &[2, 5]);
    /// ```
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The step in elements between neighbours along each axis.
    ///
    /// ```
    /// assert_eq!(strata_core::Layout::contiguous(&[2, 5]).unwrap().strides(), &[5, 1]);
    /// ```
    pub fn strides(&self) -> &[isize] {
        &self.strides
    }

    /// The storage position of element `[0, 0, ...]`.
    ///
    /// ```
    /// assert_eq!(strata_core::Layout::contiguous(&[2]).unwrap().offset(), 0);
    /// ```
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The rank.
    ///
    /// ```
    /// assert_eq!(strata_core::Layout::contiguous(&[2, 1, 3]).unwrap().ndim(), 3);
    /// ```
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// The number of elements (1 for rank 0).
    ///
    /// ```
    /// assert_eq!(strata_core::Layout::contiguous(&[2, 0]).unwrap().numel(), 0);
    /// ```
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// True when the elements are in row-major order with no gaps (size-1 axes may have any
    /// stride).
    ///
    /// ```
    /// use strata_core::Layout;
    /// assert!(!Layout::new(vec![2, 2], vec![1, 2], 0).unwrap().is_contiguous());
    /// ```
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1isize;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d as isize;
        }
        true
    }

    /// The storage position of the element at `index` (no bounds check).
    ///
    /// ```
    /// let l = strata_core::Layout::new(vec![2, 2], vec![1, 2], 1).unwrap();
    /// assert_eq!(l.position(&[1, 1]), 4);
    /// ```
    pub fn position(&self, index: &[usize]) -> usize {
        let p = self.offset as isize
            + index
                .iter()
                .zip(&self.strides)
                .map(|(&i, &s)| i as isize * s)
                .sum::<isize>();
        p as usize
    }

    /// The lowest and one past the highest storage position the view touches (`numel > 0`).
    ///
    /// ```
    /// let l = strata_core::Layout::new(vec![3], vec![-2], 4).unwrap();
    /// assert_eq!(l.span(), (0, 5));
    /// ```
    pub fn span(&self) -> (isize, isize) {
        let mut lo = self.offset as isize;
        let mut hi = self.offset as isize;
        for (&d, &s) in self.shape.iter().zip(&self.strides) {
            let reach = (d as isize - 1) * s;
            if reach < 0 {
                lo += reach;
            } else {
                hi += reach;
            }
        }
        (lo, hi + 1)
    }

    /// True when two different indices may name the same storage position, which makes the
    /// view unfit to be written to (a broadcast view, for instance).
    ///
    /// ```
    /// use strata_core::Layout;
    /// assert!(Layout::new(vec![3, 2], vec![0, 1], 0).unwrap().has_internal_overlap());
    /// assert!(!Layout::new(vec![3, 2], vec![1, 3], 0).unwrap().has_internal_overlap());
    /// ```
    pub fn has_internal_overlap(&self) -> bool {
        let mut dims: Vec<(usize, usize)> = self
            .shape
            .iter()
            .zip(&self.strides)
            .filter(|(&d, _)| d > 1)
            .map(|(&d, &s)| (d, s.unsigned_abs()))
            .collect();
        dims.sort_by_key(|&(_, s)| s);
        // Sorted by stride, each stride must clear the whole extent of the smaller ones.
        let mut extent = 0usize;
        for (d, s) in dims {
            if s <= extent {
                return true;
            }
            extent += (d - 1) * s;
        }
        false
    }

    /// The layout with axes reordered so axis `k` of the result is axis `order[k]` here.
    ///
    /// ```
    /// let l = strata_core::Layout::contiguous(&[2, 3, 4]).unwrap();
    /// assert_eq!(l.permuted(&[2, 0, 1]).unwrap().shape(), &[4, 2, 3]);
    /// ```
    pub fn permuted(&self, order: &[usize]) -> Result<Layout> {
        let n = self.ndim();
        let mut seen = vec![false; n];
        let valid = order.len() == n
            && order
                .iter()
                .all(|&a| a < n && !std::mem::replace(&mut seen[a], true));
        if !valid {
            return Err(Error::Index(format!(
                "permutation {order:?} is not a permutation of the {n} axes of shape {:?}",
                self.shape
            )));
        }
        Ok(Layout {
            shape: order.iter().map(|&a| self.shape[a]).collect(),
            strides: order.iter().map(|&a| self.strides[a]).collect(),
            offset: self.offset,
        })
    }

    /// The layout seen with `shape` after broadcasting (size-1 and missing leading axes get
    /// stride 0).
    ///
    /// ```
    /// let l = strata_core::Layout::contiguous(&[3, 1]).unwrap();
    /// let b = l.broadcast_to(&[2, 3, 4]).unwrap();
    /// assert_eq!(b.strides(), &[0, 1, 0]);
    /// ```
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Layout> {
        let fail = || {
            Error::Shape(format!(
                "cannot broadcast shape {:?} to shape {shape:?}",
                self.shape
            ))
        };
        if shape.len() < self.ndim() {
            return Err(fail());
        }
        let lead = shape.len() - self.ndim();
        let mut strides: Strides = smallvec::smallvec![0isize; shape.len()];
        for (k, &target) in shape.iter().enumerate().skip(lead) {
            let (d, s) = (self.shape[k - lead], self.strides[k - lead]);
            strides[k] = if d == target {
                s
            } else if d == 1 {
                0
            } else {
                return Err(fail());
            };
        }
        checked_numel(shape)?;
        Ok(Layout {
            shape: shape.into(),
            strides,
            offset: self.offset,
        })
    }

    /// Strides that show this view's elements, in row-major order, with `new_shape`, when that
    /// is possible without copying.
    ///
    /// ```
    /// use strata_core::Layout;
    /// let t = Layout::contiguous(&[4, 6]).unwrap().permuted(&[1, 0]).unwrap();
    /// assert!(t.reshaped(&[24]).is_none());
    /// assert_eq!(t.reshaped(&[2, 3, 4]).unwrap().strides(), &[3, 1, 6]);
    /// ```
    pub fn reshaped(&self, new_shape: &[usize]) -> Option<Layout> {
        let make = |strides: Vec<isize>| Layout {
            shape: new_shape.into(),
            strides: strides.into(),
            offset: self.offset,
        };
        if self.numel() == 0 || self.ndim() == 0 {
            return Some(make(contiguous_strides(new_shape)));
        }
        // Walk the old axes from the innermost out, in chunks that are contiguous among
        // themselves; each chunk must be covered exactly by a run of new axes.
        let mut new_strides = vec![0isize; new_shape.len()];
        let mut view_d = new_shape.len() as isize - 1;
        let mut chunk_base = *self.strides.last().unwrap_or(&1);
        let (mut tensor_numel, mut view_numel) = (1usize, 1usize);
        for d in (0..self.ndim()).rev() {
            tensor_numel *= self.shape[d];
            let chunk_ends = d == 0
                || (self.shape[d - 1] != 1
                    && self.strides[d - 1] != tensor_numel as isize * chunk_base);
            if chunk_ends {
                while view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d as usize] == 1)
                {
                    new_strides[view_d as usize] = view_numel as isize * chunk_base;
                    view_numel *= new_shape[view_d as usize];
                    view_d -= 1;
                }
                if view_numel != tensor_numel {
                    return None;
                }
                if d > 0 {
                    chunk_base = self.strides[d - 1];
                    tensor_numel = 1;
                    view_numel = 1;
                }
            }
        }
        (view_d == -1).then(|| make(new_strides))
    }

    /// The sub-view `start..start + len` along `axis` (already normalized and bounds-checked by
    /// the caller) with the given step, as produced by slicing.
    /// An empty result keeps its offset: `start` may sit one past the end of a flipped axis,
    /// where moving would reach before the storage (an empty view reads nothing).
    pub(crate) fn restrict(&mut self, axis: usize, start: usize, len: usize, step: isize) {
        if len > 0 && self.numel() > 0 {
            self.offset = (self.offset as isize + start as isize * self.strides[axis]) as usize;
        }
        self.shape[axis] = len;
        self.strides[axis] *= step;
    }

    /// Removes `axis`, fixing its index at `index` (already bounds-checked). An empty view
    /// keeps its offset, as in [`Layout::restrict`].
    pub(crate) fn select(&mut self, axis: usize, index: usize) {
        if self.numel() > 0 {
            self.offset = (self.offset as isize + index as isize * self.strides[axis]) as usize;
        }
        self.shape.remove(axis);
        self.strides.remove(axis);
    }

    /// Inserts a size-1 axis at `axis`.
    pub(crate) fn insert_axis(&mut self, axis: usize) {
        let stride = self
            .strides
            .get(axis)
            .map(|&s| s * self.shape[axis] as isize)
            .unwrap_or(1);
        self.shape.insert(axis, 1);
        self.strides.insert(axis, stride);
    }

    /// Removes a size-1 axis.
    pub(crate) fn remove_axis(&mut self, axis: usize) {
        self.shape.remove(axis);
        self.strides.remove(axis);
    }
}

/// A list of axis sizes given as an argument: arrays, slices and vectors of `usize`, `isize`,
/// `i32`, `i64` or `u32`. `-1` is allowed where an op says so (`reshape`, `view`).
///
/// ```
/// use strata_core::layout::IntoDims;
/// assert_eq!([2, -1].into_dims().unwrap(), vec![2, -1]);
/// assert_eq!(vec![3usize, 4].into_dims().unwrap(), vec![3, 4]);
/// ```
pub trait IntoDims {
    /// The sizes as signed values.
    fn into_dims(self) -> Result<Vec<isize>>;
}

/// One integer that can be an axis size or index argument.
///
/// ```
/// use strata_core::layout::DimValue;
/// assert_eq!(5u32.to_isize().unwrap(), 5);
/// ```
pub trait DimValue: Copy + std::fmt::Debug {
    /// The value as `isize`, `Err` when it does not fit.
    fn to_isize(self) -> Result<isize>;
}

macro_rules! dim_value {
    ($($t:ty),*) => {$(
        impl DimValue for $t {
            fn to_isize(self) -> Result<isize> {
                isize::try_from(self)
                    .map_err(|_| Error::Shape(format!("size {self} overflows isize")))
            }
        }
    )*};
}
dim_value!(usize, isize, i32, i64, u32, u64);

impl<T: DimValue> IntoDims for &[T] {
    fn into_dims(self) -> Result<Vec<isize>> {
        self.iter().map(|d| d.to_isize()).collect()
    }
}
impl<T: DimValue, const N: usize> IntoDims for [T; N] {
    fn into_dims(self) -> Result<Vec<isize>> {
        self.as_slice().into_dims()
    }
}
impl<T: DimValue, const N: usize> IntoDims for &[T; N] {
    fn into_dims(self) -> Result<Vec<isize>> {
        self.as_slice().into_dims()
    }
}
impl<T: DimValue> IntoDims for Vec<T> {
    fn into_dims(self) -> Result<Vec<isize>> {
        self.as_slice().into_dims()
    }
}
impl<T: DimValue> IntoDims for &Vec<T> {
    fn into_dims(self) -> Result<Vec<isize>> {
        self.as_slice().into_dims()
    }
}

/// A shape argument as `usize` sizes; negative sizes are an `Err`, and so is an element count
/// that overflows.
///
/// ```
/// assert_eq!(strata_core::layout::shape_arg([2, 3]).unwrap(), vec![2, 3]);
/// assert!(strata_core::layout::shape_arg([2, -3]).is_err());
/// ```
pub fn shape_arg(dims: impl IntoDims) -> Result<Vec<usize>> {
    let dims = dims.into_dims()?;
    let shape = dims
        .iter()
        .map(|&d| {
            usize::try_from(d)
                .map_err(|_| Error::Shape(format!("shape {dims:?} has a negative size {d}")))
        })
        .collect::<Result<Vec<_>>>()?;
    checked_numel(&shape)?;
    Ok(shape)
}
