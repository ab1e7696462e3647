//! Basic indexing: [`SliceArg`], the [`s!`](crate::s) macro, and how they select a view.
//!
//! Ranges follow Python's slice rules, not Rust's: `a..b;step` means `a:b:step`, negative
//! bounds count from the end, out-of-range bounds are clipped, and a negative step walks
//! backwards from `a` (default: the last element) down to, but excluding, `b` (default: past
//! the first element). So `s![..;-1]` reverses an axis and `s![3..0;-1]` picks 3, 2, 1.

use crate::error::{Error, Result};
use crate::layout::Layout;
use std::ops::{Range, RangeFrom, RangeFull, RangeInclusive, RangeTo, RangeToInclusive};

/// One item of an index expression.
///
/// ```
/// use strata_core::{s, SliceArg};
/// let args = s![1, ..;2, NewAxis, -1];
/// assert_eq!(args.len(), 4);
/// assert_eq!(args[0], Ok(SliceArg::Index(1)));
/// ```
#[derive(Debug, Clone)]
pub enum SliceArg {
    /// Select one position (negative counts from the end) and drop the axis.
    Index(isize),
    /// Keep the positions `start..end` (or `..=end`) in steps of `step`, with Python's rules.
    Range {
        /// First position; `None` is the start (or the end for a negative step).
        start: Option<isize>,
        /// Bound; `None` is past the end (or before the start for a negative step).
        end: Option<isize>,
        /// Whether `end` itself is included (`..=`).
        inclusive: bool,
        /// Any non-zero step.
        step: isize,
    },
    /// Insert a new axis of size 1.
    NewAxis,
    /// Stand for as many full ranges as needed to index every axis.
    Ellipsis,
    /// Select the positions an i32/i64 tensor holds along this axis (NumPy's integer-array
    /// indexing): the axis is replaced by the index tensor's axes. The result is a copy.
    Tensor(crate::tensor::Tensor),
}

impl PartialEq for SliceArg {
    fn eq(&self, other: &SliceArg) -> bool {
        use SliceArg::*;
        match (self, other) {
            (Index(a), Index(b)) => a == b,
            (
                Range {
                    start,
                    end,
                    inclusive,
                    step,
                },
                Range {
                    start: s2,
                    end: e2,
                    inclusive: i2,
                    step: st2,
                },
            ) => (start, end, inclusive, step) == (s2, e2, i2, st2),
            (NewAxis, NewAxis) | (Ellipsis, Ellipsis) => true,
            (Tensor(a), Tensor(b)) => a.shares_storage(b) && a.layout() == b.layout(),
            _ => false,
        }
    }
}

impl From<&crate::tensor::Tensor> for SliceArg {
    fn from(t: &crate::tensor::Tensor) -> SliceArg {
        SliceArg::Tensor(t.clone())
    }
}

/// Inserts a size-1 axis when used in [`s!`](crate::s).
///
/// ```
/// use strata_core::{s, Device, DType, Tensor};
/// let t = Tensor::zeros([3], DType::F32, &Device::cpu()).unwrap();
/// assert_eq!(t.slice(s![NewAxis, ..]).unwrap().shape(), &[1, 3]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewAxis;

/// Stands for all remaining axes when used in [`s!`](crate::s) (the macro also takes `...`).
///
/// ```
/// use strata_core::{s, Device, DType, Tensor};
/// let t = Tensor::zeros([2, 3, 4], DType::F32, &Device::cpu()).unwrap();
/// assert_eq!(t.slice(s![..., 0]).unwrap().shape(), &[2, 3]);
/// assert_eq!(t.slice(s![Ellipsis, 0]).unwrap().shape(), &[2, 3]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ellipsis;

impl SliceArg {
    /// This argument with a step; only ranges take one.
    ///
    /// ```
    /// use strata_core::SliceArg;
    /// let r = SliceArg::from(..).with_step(-2).unwrap();
    /// assert!(matches!(r, SliceArg::Range { step: -2, .. }));
    /// assert!(SliceArg::from(3).with_step(2).is_err());
    /// ```
    pub fn with_step(self, step: isize) -> Result<SliceArg> {
        match self {
            SliceArg::Range {
                start,
                end,
                inclusive,
                ..
            } => Ok(SliceArg::Range {
                start,
                end,
                inclusive,
                step,
            }),
            other => Err(Error::Invalid(format!(
                "a step ({step}) can only follow a range, not {other:?}"
            ))),
        }
    }

    fn range(start: Option<isize>, end: Option<isize>, inclusive: bool) -> SliceArg {
        SliceArg::Range {
            start,
            end,
            inclusive,
            step: 1,
        }
    }
}

macro_rules! slice_arg_from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for SliceArg {
            fn from(i: $t) -> SliceArg {
                SliceArg::Index(i as isize)
            }
        }
        impl From<Range<$t>> for SliceArg {
            fn from(r: Range<$t>) -> SliceArg {
                SliceArg::range(Some(r.start as isize), Some(r.end as isize), false)
            }
        }
        impl From<RangeInclusive<$t>> for SliceArg {
            fn from(r: RangeInclusive<$t>) -> SliceArg {
                SliceArg::range(Some(*r.start() as isize), Some(*r.end() as isize), true)
            }
        }
        impl From<RangeFrom<$t>> for SliceArg {
            fn from(r: RangeFrom<$t>) -> SliceArg {
                SliceArg::range(Some(r.start as isize), None, false)
            }
        }
        impl From<RangeTo<$t>> for SliceArg {
            fn from(r: RangeTo<$t>) -> SliceArg {
                SliceArg::range(None, Some(r.end as isize), false)
            }
        }
        impl From<RangeToInclusive<$t>> for SliceArg {
            fn from(r: RangeToInclusive<$t>) -> SliceArg {
                SliceArg::range(None, Some(r.end as isize), true)
            }
        }
    )*};
}
slice_arg_from_int!(i32, i64, isize, usize, u32);

impl From<RangeFull> for SliceArg {
    fn from(_: RangeFull) -> SliceArg {
        SliceArg::range(None, None, false)
    }
}
impl From<NewAxis> for SliceArg {
    fn from(_: NewAxis) -> SliceArg {
        SliceArg::NewAxis
    }
}
impl From<Ellipsis> for SliceArg {
    fn from(_: Ellipsis) -> SliceArg {
        SliceArg::Ellipsis
    }
}

/// Builds an index expression (a `Vec<Result<SliceArg>>`) for [`Tensor::slice`](crate::Tensor::slice)
/// and friends, like ndarray's `s!` with NumPy's meaning: integers, ranges with Python's rules
/// (`a..b`, `..`, `-3..`, `..=b`), a step after `;` (any non-zero value, negative too),
/// `NewAxis`, and `...` or `Ellipsis`.
///
/// ```
/// use strata_core::{s, Device, DType, Tensor};
/// let t = Tensor::arange(0, 24, 1, DType::I32, &Device::cpu()).unwrap().reshape([2, 3, 4]).unwrap();
/// let v = t.slice(s![-1, 1.., ..;-2]).unwrap();
/// assert_eq!(v.shape(), &[2, 2]);
/// assert_eq!(v.to_vec::<i32>().unwrap(), vec![19, 17, 23, 21]);
/// ```
#[macro_export]
macro_rules! s {
    (@acc [$($out:expr,)*]) => { vec![$($out,)*] };
    (@acc [$($out:expr,)*] ... $(, $($rest:tt)*)?) => {
        $crate::s!(@acc [$($out,)* Ok($crate::index::SliceArg::Ellipsis),] $($($rest)*)?)
    };
    (@acc [$($out:expr,)*] $e:expr ; $step:expr $(, $($rest:tt)*)?) => {
        $crate::s!(@acc [$($out,)* $crate::s!(@arg $e).with_step($step as isize),] $($($rest)*)?)
    };
    (@acc [$($out:expr,)*] $e:expr $(, $($rest:tt)*)?) => {
        $crate::s!(@acc [$($out,)* Ok::<$crate::index::SliceArg, $crate::error::Error>($crate::s!(@arg $e)),] $($($rest)*)?)
    };
    // Python-style ranges such as `1..-1` or `7..2` look empty to Rust's lints; they are not.
    (@arg $e:expr) => {{
        #[allow(clippy::reversed_empty_ranges)]
        let arg = $crate::index::SliceArg::from($e);
        arg
    }};
    ($($t:tt)*) => {{
        #[allow(unused_imports)]
        use $crate::index::{Ellipsis, NewAxis};
        $crate::s!(@acc [] $($t)*)
    }};
}

/// An index expression: what [`s!`](crate::s) builds, or a plain `Vec`/slice of [`SliceArg`].
///
/// ```
/// use strata_core::{IndexArgs, SliceArg};
/// let args = vec![SliceArg::Index(0)].into_args().unwrap();
/// assert_eq!(args, vec![SliceArg::Index(0)]);
/// ```
pub trait IndexArgs {
    /// The arguments, or the first error a step produced.
    fn into_args(self) -> Result<Vec<SliceArg>>;
}
impl IndexArgs for Vec<Result<SliceArg>> {
    fn into_args(self) -> Result<Vec<SliceArg>> {
        self.into_iter().collect()
    }
}
impl IndexArgs for Vec<SliceArg> {
    fn into_args(self) -> Result<Vec<SliceArg>> {
        Ok(self)
    }
}
impl IndexArgs for &[SliceArg] {
    fn into_args(self) -> Result<Vec<SliceArg>> {
        Ok(self.to_vec())
    }
}

/// The positions a range selects along an axis of size `n`: `(first, count, step)`, with
/// Python's `slice.indices` rules.
///
/// ```
/// use strata_core::index::resolve_range;
/// assert_eq!(resolve_range(None, None, false, -1, 4).unwrap(), (3, 4, -1));
/// assert_eq!(resolve_range(Some(-3), None, false, 1, 4).unwrap(), (1, 3, 1));
/// assert_eq!(resolve_range(Some(0), Some(4), false, -1, 4).unwrap().1, 0);
/// ```
pub fn resolve_range(
    start: Option<isize>,
    end: Option<isize>,
    inclusive: bool,
    step: isize,
    n: usize,
) -> Result<(usize, usize, isize)> {
    if step == 0 {
        return Err(Error::Invalid("slice step must not be 0".into()));
    }
    // i128 keeps extreme bounds and steps (isize::MIN, ..=isize::MAX) from overflowing.
    let (n, step_wide) = (n as i128, step as i128);
    let wrap = |i: isize| {
        let i = i as i128;
        if i < 0 {
            i + n
        } else {
            i
        }
    };
    // An inclusive end becomes an exclusive one after wrapping; past the first element (when
    // walking backwards) it means "no bound".
    let end = end.map(wrap).and_then(|e| match (inclusive, step > 0) {
        (false, _) => Some(e),
        (true, true) => Some(e + 1),
        (true, false) => (e > 0).then_some(e - 1),
    });
    let (first, count) = if step > 0 {
        let s = start.map(wrap).unwrap_or(0).clamp(0, n);
        let e = end.unwrap_or(n).clamp(0, n);
        (
            s,
            if e > s {
                (e - s + step_wide - 1) / step_wide
            } else {
                0
            },
        )
    } else {
        let s = start.map(wrap).unwrap_or(n - 1).clamp(-1, n - 1);
        let e = end.unwrap_or(-1).clamp(-1, n - 1);
        let back = -step_wide;
        (s, if s > e { (s - e + back - 1) / back } else { 0 })
    };
    Ok((
        if count > 0 { first as usize } else { 0 },
        count as usize,
        step,
    ))
}

/// `shape` with axis `axis` replaced by the axes of an index tensor of shape `index_shape`.
pub(crate) fn with_index_axes(shape: &[usize], axis: usize, index_shape: &[usize]) -> Vec<usize> {
    shape[..axis]
        .iter()
        .chain(index_shape)
        .chain(&shape[axis + 1..])
        .copied()
        .collect()
}

/// How many axes of the indexed tensor `args` consume (new axes and the ellipsis consume none).
fn consuming(args: &[SliceArg]) -> usize {
    args.iter()
        .filter(|a| {
            matches!(
                a,
                SliceArg::Index(_) | SliceArg::Range { .. } | SliceArg::Tensor(_)
            )
        })
        .count()
}

/// The view of `layout` selected by `args` (NumPy basic indexing).
pub(crate) fn apply(layout: &Layout, args: &[SliceArg]) -> Result<Layout> {
    let consuming = consuming(args);
    let ellipses = args
        .iter()
        .filter(|a| matches!(a, SliceArg::Ellipsis))
        .count();
    if ellipses > 1 {
        return Err(Error::Index(format!(
            "an index may contain at most one ellipsis, {args:?} has {ellipses}"
        )));
    }
    if consuming > layout.ndim() {
        return Err(Error::Index(format!(
            "too many indices: {consuming} given for a tensor of shape {:?}",
            layout.shape()
        )));
    }
    let mut out = layout.clone();
    let mut axis = 0usize; // the axis of `out` the next argument applies to
    for arg in args {
        match *arg {
            SliceArg::Tensor(_) => {
                return Err(Error::Index(
                    "a tensor index selects a copy; use Tensor::slice, not a view".into(),
                ))
            }
            SliceArg::Ellipsis => axis += layout.ndim() - consuming,
            SliceArg::NewAxis => {
                out.insert_axis(axis);
                axis += 1;
            }
            SliceArg::Index(i) => {
                let n = out.shape()[axis];
                let pos = if i < 0 { i + n as isize } else { i };
                if pos < 0 || pos >= n as isize {
                    return Err(Error::Index(format!(
                        "index {i} is out of range for axis {axis} of size {n} (shape {:?})",
                        layout.shape()
                    )));
                }
                out.select(axis, pos as usize);
            }
            SliceArg::Range {
                start,
                end,
                inclusive,
                step,
            } => {
                let (first, count, step) =
                    resolve_range(start, end, inclusive, step, out.shape()[axis])?;
                out.restrict(axis, first, count, step);
                axis += 1;
            }
        }
    }
    Ok(out)
}

/// Splits off the one tensor index of `args`: the basic arguments with a full range in its
/// place, and the axis of the basic view it selects along.
pub(crate) fn split_tensor_index(
    args: &[SliceArg],
    ndim: usize,
) -> Result<Option<(Vec<SliceArg>, usize, crate::tensor::Tensor)>> {
    let tensors = args
        .iter()
        .filter(|a| matches!(a, SliceArg::Tensor(_)))
        .count();
    if tensors == 0 {
        return Ok(None);
    }
    if tensors > 1 {
        return Err(Error::Index(format!(
            "an index expression may hold one index tensor, this one has {tensors}; \
             index one axis at a time"
        )));
    }
    let consuming = consuming(args);
    let mut axis = 0;
    let mut basic = Vec::with_capacity(args.len());
    let mut found = None;
    for arg in args {
        match arg {
            SliceArg::Tensor(t) => {
                found = Some((axis, t.clone()));
                basic.push(SliceArg::from(..));
            }
            other => {
                axis += match other {
                    SliceArg::Range { .. } | SliceArg::NewAxis => 1,
                    SliceArg::Ellipsis => ndim.saturating_sub(consuming),
                    _ => 0,
                };
                basic.push(other.clone());
            }
        }
    }
    Ok(found.map(|(axis, t)| (basic, axis, t)))
}
