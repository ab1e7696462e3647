//! Blocks of typed values: the CPU backend evaluates an expression tree a block at a time, so
//! every inner loop is a monomorphized loop over a slice (no per-element dispatch).

use crate::dtype::{DType, Scalar};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, UnaryOp};
use half::{bf16, f16};

/// One block of values of one dtype.
#[derive(Debug, Clone)]
pub(crate) enum Block {
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
macro_rules! with_block {
    ($v:expr, $x:ident : $T:ident => $body:expr) => {
        match $v {
            $crate::cpu::block::Block::Bool($x) => {
                #[allow(dead_code)]
                type $T = bool;
                $body
            }
            $crate::cpu::block::Block::U8($x) => {
                #[allow(dead_code)]
                type $T = u8;
                $body
            }
            $crate::cpu::block::Block::U16($x) => {
                #[allow(dead_code)]
                type $T = u16;
                $body
            }
            $crate::cpu::block::Block::U32($x) => {
                #[allow(dead_code)]
                type $T = u32;
                $body
            }
            $crate::cpu::block::Block::U64($x) => {
                #[allow(dead_code)]
                type $T = u64;
                $body
            }
            $crate::cpu::block::Block::I8($x) => {
                #[allow(dead_code)]
                type $T = i8;
                $body
            }
            $crate::cpu::block::Block::I16($x) => {
                #[allow(dead_code)]
                type $T = i16;
                $body
            }
            $crate::cpu::block::Block::I32($x) => {
                #[allow(dead_code)]
                type $T = i32;
                $body
            }
            $crate::cpu::block::Block::I64($x) => {
                #[allow(dead_code)]
                type $T = i64;
                $body
            }
            $crate::cpu::block::Block::F16($x) => {
                #[allow(dead_code)]
                type $T = half::f16;
                $body
            }
            $crate::cpu::block::Block::BF16($x) => {
                #[allow(dead_code)]
                type $T = half::bf16;
                $body
            }
            $crate::cpu::block::Block::F32($x) => {
                #[allow(dead_code)]
                type $T = f32;
                $body
            }
            $crate::cpu::block::Block::F64($x) => {
                #[allow(dead_code)]
                type $T = f64;
                $body
            }
        }
    };
}
pub(crate) use with_block;

/// Expands `$body` for the element type of `$dtype`, bound to `$T`.
macro_rules! with_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::dtype::DType::Bool => {
                #[allow(dead_code)]
                type $T = bool;
                $body
            }
            $crate::dtype::DType::U8 => {
                #[allow(dead_code)]
                type $T = u8;
                $body
            }
            $crate::dtype::DType::U16 => {
                #[allow(dead_code)]
                type $T = u16;
                $body
            }
            $crate::dtype::DType::U32 => {
                #[allow(dead_code)]
                type $T = u32;
                $body
            }
            $crate::dtype::DType::U64 => {
                #[allow(dead_code)]
                type $T = u64;
                $body
            }
            $crate::dtype::DType::I8 => {
                #[allow(dead_code)]
                type $T = i8;
                $body
            }
            $crate::dtype::DType::I16 => {
                #[allow(dead_code)]
                type $T = i16;
                $body
            }
            $crate::dtype::DType::I32 => {
                #[allow(dead_code)]
                type $T = i32;
                $body
            }
            $crate::dtype::DType::I64 => {
                #[allow(dead_code)]
                type $T = i64;
                $body
            }
            $crate::dtype::DType::F16 => {
                #[allow(dead_code)]
                type $T = half::f16;
                $body
            }
            $crate::dtype::DType::BF16 => {
                #[allow(dead_code)]
                type $T = half::bf16;
                $body
            }
            $crate::dtype::DType::F32 => {
                #[allow(dead_code)]
                type $T = f32;
                $body
            }
            $crate::dtype::DType::F64 => {
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
    fn wrap(v: Vec<Self>) -> Block;
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
            fn wrap(v: Vec<Self>) -> Block { Block::$d(v) }
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
            fn wrap(v: Vec<Self>) -> Block { Block::$d(v) }
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
    fn wrap(v: Vec<Self>) -> Block {
        Block::Bool(v)
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

impl Block {
    pub(crate) fn dtype(&self) -> DType {
        with_block!(self, _x: T => <T as Prim>::DTYPE)
    }

    pub(crate) fn len(&self) -> usize {
        with_block!(self, x: T => x.len())
    }

    /// `len` copies of `s` (already of the wanted dtype).
    pub(crate) fn splat(s: Scalar, len: usize) -> Block {
        match s {
            Scalar::Bool(v) => Block::Bool(vec![v; len]),
            Scalar::U8(v) => Block::U8(vec![v; len]),
            Scalar::U16(v) => Block::U16(vec![v; len]),
            Scalar::U32(v) => Block::U32(vec![v; len]),
            Scalar::U64(v) => Block::U64(vec![v; len]),
            Scalar::I8(v) => Block::I8(vec![v; len]),
            Scalar::I16(v) => Block::I16(vec![v; len]),
            Scalar::I32(v) => Block::I32(vec![v; len]),
            Scalar::I64(v) => Block::I64(vec![v; len]),
            Scalar::F16(v) => Block::F16(vec![v; len]),
            Scalar::BF16(v) => Block::BF16(vec![v; len]),
            Scalar::F32(v) => Block::F32(vec![v; len]),
            Scalar::F64(v) => Block::F64(vec![v; len]),
        }
    }

    /// Converts every value to `to` with strata's cast rules.
    pub(crate) fn cast(&self, to: DType, saturate: bool) -> Block {
        with_block!(self, x: S => with_dtype!(to, D => D::wrap(cast_vec::<S, D>(x, saturate))))
    }

    /// Reads every value's bits as `to`, a dtype of the same size (core checks the sizes).
    pub(crate) fn bitcast(&self, to: DType) -> Result<Block> {
        if self.dtype().itemsize() != to.itemsize()
            || self.dtype() == DType::Bool
            || to == DType::Bool
        {
            return Err(Error::Unsupported(format!(
                "IR op Bitcast is not defined from {} to {to}",
                self.dtype()
            )));
        }
        Ok(with_block!(self, x: S => with_dtype!(to, D => D::wrap(
            x.iter()
                // SAFETY: `S` and `D` are primitives of one size (checked above) and neither is
                // bool, so every bit pattern of an `S` is a valid, aligned `D`.
                .map(|v| unsafe { D::load((v as *const S).cast::<u8>()) })
                .collect()
        ))))
    }
}

/// Integer element types: the IR's integer semantics, written once for all eight.
trait Int: Prim + Ord {
    const ZERO: Self;
    const ONE: Self;
    fn wadd(self, o: Self) -> Self;
    fn wsub(self, o: Self) -> Self;
    fn wmul(self, o: Self) -> Self;
    fn sadd(self, o: Self) -> Self;
    fn ssub(self, o: Self) -> Self;
    fn smul(self, o: Self) -> Self;
    fn sdiv(self, o: Self) -> Self;
    fn floor_div(self, o: Self) -> Self;
    fn rem_py(self, o: Self) -> Self;
    fn pow(self, o: Self) -> Self;
    fn shl(self, o: Self) -> Self;
    fn shr(self, o: Self) -> Self;
    fn wneg(self) -> Self;
    fn sneg(self) -> Self;
    fn wabs(self) -> Self;
    fn sign(self) -> Self;
    fn and(self, o: Self) -> Self;
    fn or(self, o: Self) -> Self;
    fn xor(self, o: Self) -> Self;
    fn not(self) -> Self;
}

macro_rules! int_impl {
    ($($t:ty: $signed:expr),*) => {$(
        impl Int for $t {
            const ZERO: Self = 0;
            const ONE: Self = 1;
            #[inline(always)] fn wadd(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline(always)] fn wsub(self, o: Self) -> Self { self.wrapping_sub(o) }
            #[inline(always)] fn wmul(self, o: Self) -> Self { self.wrapping_mul(o) }
            #[inline(always)] fn sadd(self, o: Self) -> Self { self.saturating_add(o) }
            #[inline(always)] fn ssub(self, o: Self) -> Self { self.saturating_sub(o) }
            #[inline(always)] fn smul(self, o: Self) -> Self { self.saturating_mul(o) }
            fn sdiv(self, o: Self) -> Self { if o == 0 { 0 } else { self.saturating_div(o) } }
            fn floor_div(self, o: Self) -> Self {
                if o == 0 { return 0; }
                let q = self.wrapping_div(o);
                // Truncation rounds toward zero; step down when the signs differ and it was inexact.
                if q.wrapping_mul(o) != self && ((self < Self::ZERO) != (o < Self::ZERO)) { q.wrapping_sub(1) } else { q }
            }
            fn rem_py(self, o: Self) -> Self {
                if o == 0 { return 0; }
                let r = self.wrapping_rem(o);
                if r != 0 && ((r < Self::ZERO) != (o < Self::ZERO)) { r.wrapping_add(o) } else { r }
            }
            fn pow(self, o: Self) -> Self {
                if o < Self::ZERO {
                    // 1 / self truncated: only 1 and -1 survive.
                    return if self == Self::ONE { 1 } else if $signed && self == Self::ONE.wrapping_neg() {
                        if o.rem_py(2) == 0 { 1 } else { self }
                    } else { 0 };
                }
                let (mut base, mut exp, mut acc) = (self, o as u64, 1 as $t);
                while exp > 0 {
                    if exp & 1 == 1 { acc = acc.wrapping_mul(base); }
                    base = base.wrapping_mul(base);
                    exp >>= 1;
                }
                acc
            }
            fn shl(self, o: Self) -> Self {
                if o < Self::ZERO || o as u64 >= <$t>::BITS as u64 { 0 } else { self << (o as u32) }
            }
            fn shr(self, o: Self) -> Self {
                if o < Self::ZERO || o as u64 >= <$t>::BITS as u64 {
                    if self < Self::ZERO { Self::ONE.wrapping_neg() } else { 0 }
                } else { self >> (o as u32) }
            }
            #[inline(always)] fn wneg(self) -> Self { self.wrapping_neg() }
            fn sneg(self) -> Self { if $signed { (0 as $t).saturating_sub(self) } else { 0 } }
            #[inline(always)] fn wabs(self) -> Self { if self < Self::ZERO { self.wrapping_neg() } else { self } }
            fn sign(self) -> Self { if self > 0 { 1 } else if self == 0 { 0 } else { Self::ONE.wrapping_neg() } }
            #[inline(always)] fn and(self, o: Self) -> Self { self & o }
            #[inline(always)] fn or(self, o: Self) -> Self { self | o }
            #[inline(always)] fn xor(self, o: Self) -> Self { self ^ o }
            #[inline(always)] fn not(self) -> Self { !self }
        }
    )*};
}
int_impl!(u8: false, u16: false, u32: false, u64: false, i8: true, i16: true, i32: true, i64: true);

fn zip<T: Copy, U>(a: &[T], b: &[T], f: impl Fn(T, T) -> U) -> Vec<U> {
    a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect()
}

fn map<T: Copy, U>(a: &[T], f: impl Fn(T) -> U) -> Vec<U> {
    a.iter().map(|&x| f(x)).collect()
}

fn unsupported(what: impl std::fmt::Debug, dtype: DType) -> Error {
    Error::Unsupported(format!("IR op {what:?} is not defined for {dtype}"))
}

/// Comparisons and logical ops shared by every dtype.
fn compare<T: Prim + PartialOrd>(op: BinaryOp, a: &[T], b: &[T]) -> Option<Block> {
    use BinaryOp::*;
    let v = match op {
        Eq => zip(a, b, |x, y| x == y),
        Ne => zip(a, b, |x, y| x != y),
        Lt => zip(a, b, |x, y| x < y),
        Le => zip(a, b, |x, y| x <= y),
        Gt => zip(a, b, |x, y| x > y),
        Ge => zip(a, b, |x, y| x >= y),
        LogicalAnd => zip(a, b, |x, y| x.nonzero() && y.nonzero()),
        LogicalOr => zip(a, b, |x, y| x.nonzero() || y.nonzero()),
        LogicalXor => zip(a, b, |x, y| x.nonzero() != y.nonzero()),
        _ => return None,
    };
    Some(Block::Bool(v))
}

fn int_binary<T: Int>(op: BinaryOp, a: &[T], b: &[T]) -> Result<Block> {
    use BinaryOp::*;
    if let Some(v) = compare(op, a, b) {
        return Ok(v);
    }
    let f: fn(T, T) -> T = match op {
        Add => T::wadd,
        Sub => T::wsub,
        Mul => T::wmul,
        AddSat => T::sadd,
        SubSat => T::ssub,
        MulSat => T::smul,
        DivSat => T::sdiv,
        FloorDiv => T::floor_div,
        Rem => T::rem_py,
        Pow => T::pow,
        Max => |x, y| x.max(y),
        Min => |x, y| x.min(y),
        BitAnd => T::and,
        BitOr => T::or,
        BitXor => T::xor,
        Shl => T::shl,
        Shr => T::shr,
        _ => return Err(unsupported(op, T::DTYPE)),
    };
    Ok(T::wrap(zip(a, b, f)))
}

/// Python's modulo for floats: the sign of the divisor.
fn rem_py_f64(x: f64, y: f64) -> f64 {
    let r = x % y;
    if r != 0.0 && ((r < 0.0) != (y < 0.0)) {
        r + y
    } else {
        r
    }
}

/// Python's float floor division (CPython's algorithm, which NumPy and PyTorch share): the
/// quotient of `a` less its exact remainder, corrected to the divisor's sign and rounded to
/// the nearest whole number, so `-9.0 // -1e-10` is 89999999999, not `floor(a / b)` = 9e10.
/// Division by zero gives IEEE's `a / b` (Python raises; NumPy and PyTorch return this).
macro_rules! floor_div_py {
    ($name:ident, $t:ty) => {
        fn $name(a: $t, b: $t) -> $t {
            if b == 0.0 {
                return a / b;
            }
            let m = a % b;
            let mut div = (a - m) / b;
            if m != 0.0 && ((b < 0.0) != (m < 0.0)) {
                div -= 1.0;
            }
            if div == 0.0 {
                return (0.0 as $t).copysign(a / b);
            }
            let f = div.floor();
            if div - f > 0.5 {
                f + 1.0
            } else {
                f
            }
        }
    };
}
floor_div_py!(floor_div_f64, f64);
floor_div_py!(floor_div_f32, f32);

/// IEEE 754-2019 `maximum`: NaN if either is NaN, and +0 above -0, so the result does not
/// depend on the operands' order (the same rule on every backend).
fn nan_max(x: f64, y: f64) -> f64 {
    if x.is_nan() || y.is_nan() {
        f64::NAN
    } else if x == y {
        if x.is_sign_negative() {
            y
        } else {
            x
        }
    } else if x > y {
        x
    } else {
        y
    }
}

/// IEEE 754-2019 `minimum`: NaN if either is NaN, and -0 below +0.
fn nan_min(x: f64, y: f64) -> f64 {
    if x.is_nan() || y.is_nan() {
        f64::NAN
    } else if x == y {
        if x.is_sign_negative() {
            x
        } else {
            y
        }
    } else if x < y {
        x
    } else {
        y
    }
}

/// Float ops run in f64 and round once to `T`: for `+ − × ÷` that is exactly IEEE arithmetic
/// in `T` (f64 has more than twice the precision of f32 and the 16-bit floats).
fn float_binary<T: Prim + PartialOrd>(op: BinaryOp, a: &[T], b: &[T]) -> Result<Block> {
    use BinaryOp::*;
    if let Some(v) = compare(op, a, b) {
        return Ok(v);
    }
    let f: fn(f64, f64) -> f64 = match op {
        Add | AddSat => |x, y| x + y,
        Sub | SubSat => |x, y| x - y,
        Mul | MulSat => |x, y| x * y,
        Div | DivSat => |x, y| x / y,
        FloorDiv => floor_div_f64,
        Rem => rem_py_f64,
        Pow => f64::powf,
        Max => nan_max,
        Min => nan_min,
        Atan2 => f64::atan2,
        _ => return Err(unsupported(op, T::DTYPE)),
    };
    // Native f32/f64 arithmetic is exactly the rounded f64 result for + − × ÷, and vectorizes.
    macro_rules! native {
        ($t:ty, $v:ident) => {
            if T::DTYPE == <$t as Prim>::DTYPE {
                // SAFETY: T is $t (same DType), so the slices have the same type.
                let (x, y) = unsafe {
                    (
                        &*(a as *const [T] as *const [$t]),
                        &*(b as *const [T] as *const [$t]),
                    )
                };
                // One closure per arm (not a function pointer), so each loop inlines and
                // vectorizes. Max/Min: NaN if either is NaN, +0 over -0 (as `nan_max`).
                match op {
                    Add | AddSat => return Ok(Block::$v(zip(x, y, |p, q| p + q))),
                    Sub | SubSat => return Ok(Block::$v(zip(x, y, |p, q| p - q))),
                    Mul | MulSat => return Ok(Block::$v(zip(x, y, |p, q| p * q))),
                    Div | DivSat => return Ok(Block::$v(zip(x, y, |p, q| p / q))),
                    Max => {
                        return Ok(Block::$v(zip(x, y, |p: $t, q: $t| {
                            if p.is_nan() || q.is_nan() {
                                <$t>::NAN
                            } else if p == q {
                                if p.is_sign_negative() {
                                    q
                                } else {
                                    p
                                }
                            } else if p > q {
                                p
                            } else {
                                q
                            }
                        })))
                    }
                    Min => {
                        return Ok(Block::$v(zip(x, y, |p: $t, q: $t| {
                            if p.is_nan() || q.is_nan() {
                                <$t>::NAN
                            } else if p == q {
                                if p.is_sign_negative() {
                                    p
                                } else {
                                    q
                                }
                            } else if p < q {
                                p
                            } else {
                                q
                            }
                        })))
                    }
                    _ => {}
                }
            }
        };
    }
    native!(f32, F32);
    native!(f64, F64);
    let in_f32 = match T::DTYPE {
        DType::F32 => matches!(op, FloorDiv | Rem | Pow | Atan2),
        // 16-bit floats compute in f32 on the GPUs; floor division's steps round there.
        DType::F16 | DType::BF16 => op == FloorDiv,
        _ => false,
    };
    if in_f32 {
        // Keep f32 results what an f32 evaluation gives (the quotient is rounded to f32 first).
        return Ok(T::wrap(zip(a, b, |x, y| {
            let (x, y) = (x.to_f64() as f32, y.to_f64() as f32);
            T::from_f64(match op {
                FloorDiv => floor_div_f32(x, y) as f64,
                Rem => rem_py_f64(x as f64, y as f64),
                Pow => x.powf(y) as f64,
                _ => x.atan2(y) as f64,
            })
        })));
    }
    Ok(T::wrap(zip(a, b, |x, y| {
        T::from_f64(f(x.to_f64(), y.to_f64()))
    })))
}

fn bool_binary(op: BinaryOp, a: &[bool], b: &[bool]) -> Result<Block> {
    use BinaryOp::*;
    if let Some(v) = compare(op, a, b) {
        return Ok(v);
    }
    let f: fn(bool, bool) -> bool = match op {
        BitAnd => |x, y| x & y,
        BitOr => |x, y| x | y,
        BitXor => |x, y| x ^ y,
        _ => return Err(unsupported(op, DType::Bool)),
    };
    Ok(Block::Bool(zip(a, b, f)))
}

/// `op(a, b)` elementwise; both blocks have one dtype.
pub(crate) fn binary(op: BinaryOp, a: &Block, b: &Block) -> Result<Block> {
    use Block as V;
    match (a, b) {
        (V::Bool(x), V::Bool(y)) => bool_binary(op, x, y),
        (V::U8(x), V::U8(y)) => int_binary(op, x, y),
        (V::U16(x), V::U16(y)) => int_binary(op, x, y),
        (V::U32(x), V::U32(y)) => int_binary(op, x, y),
        (V::U64(x), V::U64(y)) => int_binary(op, x, y),
        (V::I8(x), V::I8(y)) => int_binary(op, x, y),
        (V::I16(x), V::I16(y)) => int_binary(op, x, y),
        (V::I32(x), V::I32(y)) => int_binary(op, x, y),
        (V::I64(x), V::I64(y)) => int_binary(op, x, y),
        (V::F16(x), V::F16(y)) => float_binary(op, x, y),
        (V::BF16(x), V::BF16(y)) => float_binary(op, x, y),
        (V::F32(x), V::F32(y)) => float_binary(op, x, y),
        (V::F64(x), V::F64(y)) => float_binary(op, x, y),
        _ => Err(Error::Unsupported(format!(
            "IR op {op:?} on {} and {}",
            a.dtype(),
            b.dtype()
        ))),
    }
}

fn int_unary<T: Int>(op: UnaryOp, a: &[T]) -> Result<Block> {
    use UnaryOp::*;
    let f: fn(T) -> T = match op {
        Neg => T::wneg,
        NegSat => T::sneg,
        Abs => T::wabs,
        Sign => T::sign,
        Square => |x| x.wmul(x),
        BitNot => T::not,
        LogicalNot => return Ok(Block::Bool(map(a, |x| !x.nonzero()))),
        _ => return Err(unsupported(op, T::DTYPE)),
    };
    Ok(T::wrap(map(a, f)))
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn float_unary<T: Prim>(op: UnaryOp, a: &[T]) -> Result<Block> {
    use UnaryOp::*;
    // Ops exact in the native type run there, one closure per arm so each loop vectorizes.
    macro_rules! native {
        ($t:ty, $v:ident) => {
            if T::DTYPE == <$t as Prim>::DTYPE {
                // SAFETY: T is $t (same DType).
                let x = unsafe { &*(a as *const [T] as *const [$t]) };
                match op {
                    Neg | NegSat => return Ok(Block::$v(map(x, |v| -v))),
                    Abs => return Ok(Block::$v(map(x, <$t>::abs))),
                    Relu => {
                        return Ok(Block::$v(map(x, |v: $t| {
                            if v > 0.0 || v.is_nan() {
                                v
                            } else {
                                0.0
                            }
                        })))
                    }
                    Sqrt => return Ok(Block::$v(map(x, <$t>::sqrt))),
                    Floor => return Ok(Block::$v(map(x, <$t>::floor))),
                    Ceil => return Ok(Block::$v(map(x, <$t>::ceil))),
                    Trunc => return Ok(Block::$v(map(x, <$t>::trunc))),
                    Round => return Ok(Block::$v(map(x, <$t>::round_ties_even))),
                    _ => {}
                }
            }
        };
    }
    native!(f32, F32);
    native!(f64, F64);
    let pred = |p: fn(f64) -> bool| Ok(Block::Bool(map(a, |x| p(x.to_f64()))));
    let f: fn(f64) -> f64 = match op {
        IsNan => return pred(f64::is_nan),
        IsInf => return pred(f64::is_infinite),
        IsFinite => return pred(f64::is_finite),
        LogicalNot => return pred(|x| x == 0.0),
        Neg | NegSat => |x| -x,
        Abs => f64::abs,
        Sign => |x| {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else if x == 0.0 {
                0.0
            } else {
                x
            }
        },
        Square => |x| x * x,
        Sqrt => f64::sqrt,
        Rsqrt => |x| 1.0 / x.sqrt(),
        Reciprocal => |x| 1.0 / x,
        Exp => f64::exp,
        Exp2 => f64::exp2,
        Expm1 => f64::exp_m1,
        Log => f64::ln,
        Log2 => f64::log2,
        Log10 => f64::log10,
        Log1p => f64::ln_1p,
        Sin => f64::sin,
        Cos => f64::cos,
        Tan => f64::tan,
        Tanh => f64::tanh,
        Sigmoid => sigmoid,
        Relu => |x| if x > 0.0 || x.is_nan() { x } else { 0.0 },
        // erfc, not 1 + erf: no cancellation for x ≪ 0 (docs/semantics.md).
        Gelu => |x| 0.5 * x * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2),
        Erf => libm::erf,
        Floor => f64::floor,
        Ceil => f64::ceil,
        Round => f64::round_ties_even,
        Trunc => f64::trunc,
        BitNot => return Err(unsupported(op, T::DTYPE)),
    };
    if T::DTYPE == DType::F32 && matches!(op, Square | Rsqrt) {
        // Two roundings in f32, as an f32 evaluation gives.
        return Ok(T::wrap(map(a, |x| {
            let x = x.to_f64() as f32;
            T::from_f64(if op == Square { x * x } else { 1.0 / x.sqrt() } as f64)
        })));
    }
    Ok(T::wrap(map(a, |x| T::from_f64(f(x.to_f64())))))
}

/// `op(a)` elementwise.
pub(crate) fn unary(op: UnaryOp, a: &Block) -> Result<Block> {
    use Block as V;
    use UnaryOp::*;
    match a {
        V::Bool(x) => match op {
            LogicalNot => Ok(V::Bool(map(x, |v| !v))),
            _ => Err(unsupported(op, DType::Bool)),
        },
        V::U8(x) => int_unary(op, x),
        V::U16(x) => int_unary(op, x),
        V::U32(x) => int_unary(op, x),
        V::U64(x) => int_unary(op, x),
        V::I8(x) => int_unary(op, x),
        V::I16(x) => int_unary(op, x),
        V::I32(x) => int_unary(op, x),
        V::I64(x) => int_unary(op, x),
        V::F16(x) => float_unary(op, x),
        V::BF16(x) => float_unary(op, x),
        V::F32(x) => float_unary(op, x),
        V::F64(x) => float_unary(op, x),
    }
}

/// `a · b + c` elementwise with one rounding for f32/f64 (16-bit floats go through f32).
pub(crate) fn fma(a: &Block, b: &Block, c: &Block) -> Result<Block> {
    use Block as V;
    fn ints<T: Int>(a: &[T], b: &[T], c: &[T]) -> Vec<T> {
        a.iter()
            .zip(b)
            .zip(c)
            .map(|((&x, &y), &z)| x.wmul(y).wadd(z))
            .collect()
    }
    fn via_f32<T: Prim>(a: &[T], b: &[T], c: &[T]) -> Vec<T> {
        a.iter()
            .zip(b)
            .zip(c)
            .map(|((x, y), z)| {
                let r = (x.to_f64() as f32).mul_add(y.to_f64() as f32, z.to_f64() as f32);
                T::from_f64(r as f64)
            })
            .collect()
    }
    Ok(match (a, b, c) {
        (V::U8(x), V::U8(y), V::U8(z)) => V::U8(ints(x, y, z)),
        (V::U16(x), V::U16(y), V::U16(z)) => V::U16(ints(x, y, z)),
        (V::U32(x), V::U32(y), V::U32(z)) => V::U32(ints(x, y, z)),
        (V::U64(x), V::U64(y), V::U64(z)) => V::U64(ints(x, y, z)),
        (V::I8(x), V::I8(y), V::I8(z)) => V::I8(ints(x, y, z)),
        (V::I16(x), V::I16(y), V::I16(z)) => V::I16(ints(x, y, z)),
        (V::I32(x), V::I32(y), V::I32(z)) => V::I32(ints(x, y, z)),
        (V::I64(x), V::I64(y), V::I64(z)) => V::I64(ints(x, y, z)),
        (V::F16(x), V::F16(y), V::F16(z)) => V::F16(via_f32(x, y, z)),
        (V::BF16(x), V::BF16(y), V::BF16(z)) => V::BF16(via_f32(x, y, z)),
        (V::F32(x), V::F32(y), V::F32(z)) => V::F32(via_f32(x, y, z)),
        (V::F64(x), V::F64(y), V::F64(z)) => V::F64(
            x.iter()
                .zip(y)
                .zip(z)
                .map(|((&p, &q), &r)| p.mul_add(q, r))
                .collect(),
        ),
        _ => {
            return Err(Error::Unsupported(format!(
                "fma on {}, {} and {}",
                a.dtype(),
                b.dtype(),
                c.dtype()
            )))
        }
    })
}

/// `cond ? a : b` elementwise.
pub(crate) fn select(cond: &[bool], a: &Block, b: &Block) -> Result<Block> {
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
                $((Block::$v(x), Block::$v(y)) => Ok(Block::$v(pick(cond, x, y))),)*
                _ => Err(mismatch()),
            }
        };
    }
    arms!(Bool, U8, U16, U32, U64, I8, I16, I32, I64, F16, BF16, F32, F64)
}
