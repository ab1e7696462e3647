//! PyTorch's type promotion: which dtype an op computes in.
//!
//! Operands come in three priorities: tensors with dimensions, 0-d tensors, and Rust scalars.
//! A lower-priority operand changes the result only when it is of a higher category
//! (bool < integer < float); then it contributes its own dtype (0-d tensor) or its category's
//! default (scalar: `i64` for integers, `f32` for floats). So `u8 tensor + 3` stays `u8`,
//! `u8 tensor + 3.5` is `f32`, and `i32 tensor + f16 tensor` is `f16`.

use crate::assign::{Value, ValueRef};
use crate::dtype::{Category, DType};

/// The dtype both of two dtypes convert to without losing their category (PyTorch's
/// `promote_types`). PyTorch refuses to mix `u16`/`u32`/`u64` with signed types; strata follows
/// NumPy there: the smallest signed type holding both, or `f64` for `u64` with a signed type.
///
/// ```
/// use strata_core::{DType::*, ops::promote_types};
/// assert_eq!(promote_types(U8, I8), I16);
/// assert_eq!(promote_types(I32, F16), F16);
/// assert_eq!(promote_types(F16, BF16), F32);
/// assert_eq!(promote_types(Bool, U8), U8);
/// assert_eq!(promote_types(U64, I8), F64);
/// ```
pub fn promote_types(a: DType, b: DType) -> DType {
    use Category::{Bool, Float, Signed, Unsigned};
    use DType::{BF16, F16, F32, F64, I16, I32, I64};
    if a == b {
        return a;
    }
    let (ca, cb) = (a.category(), b.category());
    match (ca, cb) {
        (Bool, _) => b,
        (_, Bool) => a,
        (Float, Float) => {
            if (a == F16 && b == BF16) || (a == BF16 && b == F16) {
                F32
            } else if a.itemsize() >= b.itemsize() {
                a
            } else {
                b
            }
        }
        (Float, _) => a,
        (_, Float) => b,
        (Unsigned, Unsigned) | (Signed, Signed) => {
            if a.itemsize() >= b.itemsize() {
                a
            } else {
                b
            }
        }
        _ => {
            let (u, s) = if ca == Unsigned { (a, b) } else { (b, a) };
            match (u.itemsize() * 2).max(s.itemsize()) {
                2 => I16,
                4 => I32,
                8 => I64,
                _ => F64,
            }
        }
    }
}

/// The default float dtype: what integer division and float functions of integers return.
///
/// ```
/// assert_eq!(strata_core::ops::DEFAULT_FLOAT, strata_core::DType::F32);
/// ```
pub const DEFAULT_FLOAT: DType = DType::F32;

/// PyTorch's `combine_categories`: `higher` wins unless `lower` is of a higher category.
fn combine(higher: Option<DType>, lower: Option<DType>) -> Option<DType> {
    match (higher, lower) {
        (Some(h), _) if h.is_float() => Some(h),
        (Some(h), Some(l)) if h == DType::Bool || l.is_float() => Some(promote_types(h, l)),
        (Some(h), _) => Some(h),
        (None, l) => l,
    }
}

/// The dtype an op on `operands` computes in, with PyTorch's priorities (dimensioned tensors,
/// then 0-d tensors, then scalars).
///
/// ```
/// use strata_core::{Device, DType, Tensor, Value, ops::result_type};
/// let dev = Device::cpu();
/// let u8s = Tensor::zeros([2], DType::U8, &dev).unwrap();
/// assert_eq!(result_type(&[Value::from(&u8s), Value::from(3)]), DType::U8);
/// assert_eq!(result_type(&[Value::from(&u8s), Value::from(3.5)]), DType::F32);
/// let zero_d = Tensor::scalar(1.0f64, &dev).unwrap();
/// assert_eq!(result_type(&[Value::from(&u8s), Value::from(&zero_d)]), DType::F64);
/// ```
pub fn result_type(operands: &[Value]) -> DType {
    result_type_of(operands.iter().map(ValueRef::from))
}

/// [`result_type`] of borrowed operands (no clone of each tensor on every op).
pub(crate) fn result_type_of<'a>(operands: impl IntoIterator<Item = ValueRef<'a>>) -> DType {
    let (mut dims, mut zero_d, mut scalars) = (None, None, None);
    for op in operands {
        let (slot, dtype) = match op {
            ValueRef::Tensor(t) if t.ndim() > 0 => (&mut dims, t.dtype()),
            ValueRef::Tensor(t) => (&mut zero_d, t.dtype()),
            ValueRef::Scalar(s) => (
                &mut scalars,
                match s.dtype().category() {
                    Category::Bool => DType::Bool,
                    Category::Float => DEFAULT_FLOAT,
                    _ => DType::I64,
                },
            ),
        };
        *slot = Some(slot.map_or(dtype, |d| promote_types(d, dtype)));
    }
    combine(dims, combine(zero_d, scalars)).unwrap_or(DEFAULT_FLOAT)
}

/// True when a value of `from` may be written into a tensor of `to` by an in-place or `out`
/// op: the category must not go down (float into integer, integer into bool), as PyTorch.
///
/// ```
/// use strata_core::{DType, ops::can_cast};
/// assert!(can_cast(DType::U8, DType::F16));
/// assert!(!can_cast(DType::F32, DType::I64));
/// assert!(can_cast(DType::I64, DType::U8)); // same category: allowed, wraps
/// ```
pub fn can_cast(from: DType, to: DType) -> bool {
    let rank = |c: Category| match c {
        Category::Bool => 0,
        Category::Unsigned | Category::Signed => 1,
        Category::Float => 2,
    };
    rank(from.category()) <= rank(to.category())
}
