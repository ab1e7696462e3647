//! Blocks of typed values: the CPU backend evaluates an expression tree a block at a time, so
//! every inner loop is a monomorphized loop over a slice (no per-element dispatch).

use crate::dtype::{DType, Scalar};
use crate::error::{Error, Result};
use crate::ir::BinaryOp;
use half::{bf16, f16};

/// One block of values of one dtype.
#[derive(Debug, Clone)]
pub(crate) enum Values {
    Bool(Vec<bool>),
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
    U64(Vec<u64>),
    I8(Vec<i8>),
    I16(Vec<i16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F32(Vec<f32>),
    F64(Vec<f64>),
}

/// Expands `$body` once per variant with `$x` bound to the vector and `$T` to its element type.
macro_rules! with_values {
    ($v:expr, $x:ident : $T:ident => $body:expr) => {
        match $v {
            $crate::cpu::values::Values::Bool($x) => {
                #[allow(dead_code)]
                type $T = bool;
                $body
            }
            $crate::cpu::values::Values::U8($x) => {
                #[allow(dead_code)]
                type $T = u8;
                $body
            }
            $crate::cpu::values::Values::U16($x) => {
                #[allow(dead_code)]
                type $T = u16;
                $body
            }
            $crate::cpu::values::Values::U32($x) => {
                #[allow(dead_code)]
                type $T = u32;
                $body
            }
            $crate::cpu::values::Values::U64($x) => {
                #[allow(dead_code)]
                type $T = u64;
                $body
            }
            $crate::cpu::values::Values::I8($x) => {
                #[allow(dead_code)]
                type $T = i8;
                $body
            }
            $crate::cpu::values::Values::I16($x) => {
                #[allow(dead_code)]
                type $T = i16;
                $body
            }
            $crate::cpu::values::Values::I32($x) => {
                #[allow(dead_code)]
                type $T = i32;
                $body
            }
            $crate::cpu::values::Values::I64($x) => {
                #[allow(dead_code)]
                type $T = i64;
                $body
            }
            $crate::cpu::values::Values::F16($x) => {
                #[allow(dead_code)]
                type $T = half::f16;
                $body
            }
            $crate::cpu::values::Values::BF16($x) => {
                #[allow(dead_code)]
                type $T = half::bf16;
                $body
            }
            $crate::cpu::values::Values::F32($x) => {
                #[allow(dead_code)]
                type $T = f32;
                $body
            }
            $crate::cpu::values::Values::F64($x) => {
                #[allow(dead_code)]
                type $T = f64;
                $body
            }
        }
    };
}
pub(crate) use with_values;

/// Expands `$body` for the element type of `$dtype`, bound to `$T`.
macro_rules! with_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DType::Bool => {
                #[allow(dead_code)]
                type $T = bool;
                $body
            }
            $crate::DType::U8 => {
                #[allow(dead_code)]
                type $T = u8;
                $body
            }
            $crate::DType::U16 => {
                #[allow(dead_code)]
                type $T = u16;
                $body
            }
            $crate::DType::U32 => {
                #[allow(dead_code)]
                type $T = u32;
                $body
            }
            $crate::DType::U64 => {
                #[allow(dead_code)]
                type $T = u64;
                $body
            }
            $crate::DType::I8 => {
                #[allow(dead_code)]
                type $T = i8;
                $body
            }
            $crate::DType::I16 => {
                #[allow(dead_code)]
                type $T = i16;
                $body
            }
            $crate::DType::I32 => {
                #[allow(dead_code)]
                type $T = i32;
                $body
            }
            $crate::DType::I64 => {
                #[allow(dead_code)]
                type $T = i64;
                $body
            }
            $crate::DType::F16 => {
                #[allow(dead_code)]
                type $T = half::f16;
                $body
            }
            $crate::DType::BF16 => {
                #[allow(dead_code)]
                type $T = half::bf16;
                $body
            }
            $crate::DType::F32 => {
                #[allow(dead_code)]
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                #[allow(dead_code)]
                type $T = f64;
                $body
            }
        }
    };
}
pub(crate) use with_dtype;

/// A primitive element type as the CPU kernels see it.
pub(crate) trait Prim: Copy + Send + Sync + 'static {
    const DTYPE: DType;
    fn wrap(v: Vec<Self>) -> Values;
    fn nonzero(self) -> bool;
    fn to_f64(self) -> f64;
    fn to_i128(self) -> i128;
    /// From an exact float value: floats round to nearest, integers truncate and saturate
    /// (NaN → 0).
    fn from_f64(v: f64) -> Self;
    /// From an exact integer value: integers wrap, or clamp when `saturate`; floats round.
    fn from_i128(v: i128, saturate: bool) -> Self;
    fn from_bool(b: bool) -> Self;
    /// Reads one element from storage (bool bytes other than 0 read as true).
    ///
    /// # Safety
    /// `p` must point at a readable, aligned element.
    unsafe fn load(p: *const u8) -> Self;
}

macro_rules! prim_int {
    ($($t:ty => $d:ident),*) => {$(
        impl Prim for $t {
            const DTYPE: DType = DType::$d;
            fn wrap(v: Vec<Self>) -> Values { Values::$d(v) }
            fn nonzero(self) -> bool { self != 0 }
            fn to_f64(self) -> f64 { self as f64 }
            fn to_i128(self) -> i128 { self as i128 }
            fn from_f64(v: f64) -> Self { v as $t }
            fn from_i128(v: i128, saturate: bool) -> Self {
                if saturate { v.clamp(<$t>::MIN as i128, <$t>::MAX as i128) as $t } else { v as $t }
            }
            fn from_bool(b: bool) -> Self { b as $t }
            unsafe fn load(p: *const u8) -> Self { *(p as *const $t) }
        }
    )*};
}
prim_int!(u8 => U8, u16 => U16, u32 => U32, u64 => U64, i8 => I8, i16 => I16, i32 => I32, i64 => I64);

macro_rules! prim_float {
    ($($t:ty => $d:ident, $from64:expr, $to64:expr, $fromi:expr);*) => {$(
        impl Prim for $t {
            const DTYPE: DType = DType::$d;
            fn wrap(v: Vec<Self>) -> Values { Values::$d(v) }
            fn nonzero(self) -> bool { self.to_f64() != 0.0 }
            fn to_f64(self) -> f64 { $to64(self) }
            fn to_i128(self) -> i128 { self.to_f64() as i128 }
            fn from_f64(v: f64) -> Self { $from64(v) }
            fn from_i128(v: i128, _saturate: bool) -> Self { $fromi(v) }
            fn from_bool(b: bool) -> Self { $from64(b as u8 as f64) }
            unsafe fn load(p: *const u8) -> Self { *(p as *const $t) }
        }
    )*};
}
prim_float!(
    f32 => F32, |v: f64| v as f32, |x: f32| x as f64, |v: i128| v as f32;
    f64 => F64, |v: f64| v, |x: f64| x, |v: i128| v as f64;
    f16 => F16, f16::from_f64, |x: f16| x.to_f64(), |v: i128| f16::from_f64(v as f64);
    bf16 => BF16, bf16::from_f64, |x: bf16| x.to_f64(), |v: i128| bf16::from_f64(v as f64)
);

impl Prim for bool {
    const DTYPE: DType = DType::Bool;
    fn wrap(v: Vec<Self>) -> Values {
        Values::Bool(v)
    }
    fn nonzero(self) -> bool {
        self
    }
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
    fn to_i128(self) -> i128 {
        self as i128
    }
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    fn from_i128(v: i128, _saturate: bool) -> Self {
        v != 0
    }
    fn from_bool(b: bool) -> Self {
        b
    }
    unsafe fn load(p: *const u8) -> Self {
        *p != 0
    }
}

/// strata's cast rule for one element (see `Scalar::cast`, which it must agree with).
#[inline(always)]
fn cast_elem<T: Prim, U: Prim>(x: T, saturate: bool) -> U {
    if U::DTYPE == DType::Bool {
        U::from_bool(x.nonzero())
    } else if T::DTYPE.is_float() {
        U::from_f64(x.to_f64())
    } else {
        U::from_i128(x.to_i128(), saturate)
    }
}

fn cast_vec<T: Prim, U: Prim>(x: &[T], saturate: bool) -> Vec<U> {
    x.iter().map(|&v| cast_elem::<T, U>(v, saturate)).collect()
}

impl Values {
    pub(crate) fn dtype(&self) -> DType {
        with_values!(self, _x: T => <T as Prim>::DTYPE)
    }

    pub(crate) fn len(&self) -> usize {
        with_values!(self, x: T => x.len())
    }

    /// `len` copies of `s` (already of the wanted dtype).
    pub(crate) fn splat(s: Scalar, len: usize) -> Values {
        match s {
            Scalar::Bool(v) => Values::Bool(vec![v; len]),
            Scalar::U8(v) => Values::U8(vec![v; len]),
            Scalar::U16(v) => Values::U16(vec![v; len]),
            Scalar::U32(v) => Values::U32(vec![v; len]),
            Scalar::U64(v) => Values::U64(vec![v; len]),
            Scalar::I8(v) => Values::I8(vec![v; len]),
            Scalar::I16(v) => Values::I16(vec![v; len]),
            Scalar::I32(v) => Values::I32(vec![v; len]),
            Scalar::I64(v) => Values::I64(vec![v; len]),
            Scalar::F16(v) => Values::F16(vec![v; len]),
            Scalar::BF16(v) => Values::BF16(vec![v; len]),
            Scalar::F32(v) => Values::F32(vec![v; len]),
            Scalar::F64(v) => Values::F64(vec![v; len]),
        }
    }

    /// Converts every value to `to` with strata's cast rules.
    pub(crate) fn cast(&self, to: DType, saturate: bool) -> Values {
        with_values!(self, x: S => with_dtype!(to, D => D::wrap(cast_vec::<S, D>(x, saturate))))
    }
}

/// Arithmetic of the IR for one element type.
trait Arith: Prim + PartialOrd {
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div(self, o: Self) -> Option<Self>;
}

macro_rules! arith_int {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline(always)] fn sub(self, o: Self) -> Self { self.wrapping_sub(o) }
            #[inline(always)] fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            fn div(self, _o: Self) -> Option<Self> { None }
        }
    )*};
}
arith_int!(u8, u16, u32, u64, i8, i16, i32, i64);

macro_rules! arith_float {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn add(self, o: Self) -> Self { self + o }
            #[inline(always)] fn sub(self, o: Self) -> Self { self - o }
            #[inline(always)] fn mul(self, o: Self) -> Self { self * o }
            #[inline(always)] fn div(self, o: Self) -> Option<Self> { Some(self / o) }
        }
    )*};
}
arith_float!(f16, bf16, f32, f64);

fn zip<T: Copy, U>(a: &[T], b: &[T], f: impl Fn(T, T) -> U) -> Vec<U> {
    a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect()
}

fn binary_typed<T: Arith>(op: BinaryOp, a: &[T], b: &[T]) -> Result<Values> {
    Ok(match op {
        BinaryOp::Add => T::wrap(zip(a, b, T::add)),
        BinaryOp::Sub => T::wrap(zip(a, b, T::sub)),
        BinaryOp::Mul => T::wrap(zip(a, b, T::mul)),
        BinaryOp::Lt => Values::Bool(zip(a, b, |x, y| x < y)),
        BinaryOp::Div => {
            if T::DTYPE.is_int() {
                return Err(unsupported(op, T::DTYPE));
            }
            T::wrap(zip(a, b, |x, y| x.div(y).unwrap_or(x)))
        }
    })
}

fn unsupported(op: BinaryOp, dtype: DType) -> Error {
    Error::Unsupported(format!("IR op {op:?} is not defined for {dtype}"))
}

/// `op(a, b)` elementwise; both blocks have one dtype.
pub(crate) fn binary(op: BinaryOp, a: &Values, b: &Values) -> Result<Values> {
    use Values as V;
    match (a, b) {
        (V::U8(x), V::U8(y)) => binary_typed(op, x, y),
        (V::U16(x), V::U16(y)) => binary_typed(op, x, y),
        (V::U32(x), V::U32(y)) => binary_typed(op, x, y),
        (V::U64(x), V::U64(y)) => binary_typed(op, x, y),
        (V::I8(x), V::I8(y)) => binary_typed(op, x, y),
        (V::I16(x), V::I16(y)) => binary_typed(op, x, y),
        (V::I32(x), V::I32(y)) => binary_typed(op, x, y),
        (V::I64(x), V::I64(y)) => binary_typed(op, x, y),
        (V::F16(x), V::F16(y)) => binary_typed(op, x, y),
        (V::BF16(x), V::BF16(y)) => binary_typed(op, x, y),
        (V::F32(x), V::F32(y)) => binary_typed(op, x, y),
        (V::F64(x), V::F64(y)) => binary_typed(op, x, y),
        (V::Bool(x), V::Bool(y)) if op == BinaryOp::Lt => Ok(V::Bool(zip(x, y, |p, q| !p & q))),
        _ => Err(Error::Unsupported(format!(
            "IR op {op:?} on {} and {}",
            a.dtype(),
            b.dtype()
        ))),
    }
}

/// `cond ? a : b` elementwise.
pub(crate) fn select(cond: &[bool], a: &Values, b: &Values) -> Result<Values> {
    fn pick<T: Copy>(c: &[bool], a: &[T], b: &[T]) -> Vec<T> {
        c.iter()
            .zip(a.iter().zip(b))
            .map(|(&c, (&x, &y))| if c { x } else { y })
            .collect()
    }
    let mismatch = || {
        Error::Unsupported(format!(
            "where with branches of {} and {}",
            a.dtype(),
            b.dtype()
        ))
    };
    macro_rules! arms {
        ($($v:ident),*) => {
            match (a, b) {
                $((Values::$v(x), Values::$v(y)) => Ok(Values::$v(pick(cond, x, y))),)*
                _ => Err(mismatch()),
            }
        };
    }
    arms!(Bool, U8, U16, U32, U64, I8, I16, I32, I64, F16, BF16, F32, F64)
}
