//! The elementwise methods users call, as tables of ops with their docs: binary ops (with
//! their in-place and `out=` forms), unary ops, predicates, and `where_cond`, `clamp`, `fma`,
//! `lerp`.

use super::super::promote::result_type_of;
use super::{binary, unary, OpOperands};
use crate::assign::{Value, ValueRef};
use crate::dtype::{DType, Scalar};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, Expr, UnaryOp};
use crate::tensor::Tensor;

/// Defines `name`, `name_` (in place) and `name_out` methods for binary ops.
macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident, $inplace:ident, $out:ident => $op:ident, $ex:ident;)*) => {
        impl Tensor {$(
            $(#[$doc])*
            #[track_caller]
            pub fn $name(&self, other: impl Into<Value>) -> Result<Tensor> {
                binary(BinaryOp::$op, self.into(), (&other.into()).into(), None, stringify!($name))
            }

            #[doc = concat!("In-place [`", stringify!($name), "`](Tensor::", stringify!($name),
                "): writes the result into `self` (through views), which must have the \
                broadcast shape and a dtype the result may be cast to.")]
            ///
            /// ```
            /// use strata_core::{Device, DType, Tensor};
            #[doc = concat!("let t = Tensor::ones([2], DType::", stringify!($ex), ", &Device::cpu()).unwrap();")]
            #[doc = concat!("t.", stringify!($inplace), "(1).unwrap();")]
            /// assert_eq!(t.shape(), &[2]);
            /// ```
            #[track_caller]
            pub fn $inplace(&self, other: impl Into<Value>) -> Result<()> {
                binary(BinaryOp::$op, self.into(), (&other.into()).into(), Some(self), stringify!($inplace))
                    .map(|_| ())
            }

            #[doc = concat!("[`", stringify!($name), "`](Tensor::", stringify!($name),
                ") written into `out` (augpy's `out=`), whose shape must be the result's and \
                whose dtype must accept it.")]
            ///
            /// ```
            /// use strata_core::{Device, DType, Tensor};
            /// let dev = Device::cpu();
            #[doc = concat!("let t = Tensor::ones([2], DType::", stringify!($ex), ", &dev).unwrap();")]
            /// let out = Tensor::zeros([2], DType::F64, &dev).unwrap();
            #[doc = concat!("t.", stringify!($out), "(1, &out).unwrap();")]
            /// assert!(t.ones_like().unwrap().add_out(1, &Tensor::zeros([3], DType::I32, &dev).unwrap()).is_err());
            /// ```
            #[track_caller]
            pub fn $out(&self, other: impl Into<Value>, out: &Tensor) -> Result<()> {
                binary(BinaryOp::$op, self.into(), (&other.into()).into(), Some(out), stringify!($out))
                    .map(|_| ())
            }
        )*}
    };
}

binary_methods! {
    /// `self + other`, broadcasting; integers wrap; bool + bool is logical or.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([2], 200, DType::U8, &Device::cpu()).unwrap();
    /// assert_eq!(t.add(100).unwrap().to_vec::<u8>().unwrap(), vec![44, 44]);
    /// ```
    add, add_, add_out => Add, I32;
    /// `self - other`, broadcasting; integers wrap.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1], 40, DType::U8, &Device::cpu()).unwrap();
    /// assert_eq!(t.ones_like().unwrap().sub(&t).unwrap().to_vec::<u8>().unwrap(), vec![217]);
    /// ```
    sub, sub_, sub_out => Sub, I32;
    /// `self * other`, broadcasting; integers wrap; bool * bool is logical and.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([2], 3, DType::I8, &Device::cpu()).unwrap();
    /// assert_eq!(t.mul(50).unwrap().to_vec::<i8>().unwrap(), vec![-106, -106]);
    /// ```
    mul, mul_, mul_out => Mul, I32;
    /// True division: integer operands give the default float dtype (f32), as PyTorch.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1], 7, DType::I32, &Device::cpu()).unwrap();
    /// let q = t.div(2).unwrap();
    /// assert_eq!((q.dtype(), q.item::<f32>().unwrap()), (DType::F32, 3.5));
    /// ```
    div, div_, div_out => Div, F32;
    /// Floor division; integer division by zero gives 0.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[-7i32, 7, 7], [3], &Device::cpu()).unwrap();
    /// assert_eq!(t.floor_divide(&Tensor::from_slice(&[2i32, -2, 0], [3], &Device::cpu()).unwrap()).unwrap().to_vec::<i32>().unwrap(), vec![-4, -4, 0]);
    /// ```
    floor_divide, floor_divide_, floor_divide_out => FloorDiv, I32;
    /// Python's modulo (the result has the divisor's sign); integer `x % 0` gives 0.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[-7i32, 7], [2], &Device::cpu()).unwrap();
    /// assert_eq!(t.remainder(3).unwrap().to_vec::<i32>().unwrap(), vec![2, 1]);
    /// ```
    remainder, remainder_, remainder_out => Rem, I32;
    /// `self` to the power `other`; integers wrap.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[2i64, 3], [2], &Device::cpu()).unwrap();
    /// assert_eq!(t.pow(3).unwrap().to_vec::<i64>().unwrap(), vec![8, 27]);
    /// ```
    pow, pow_, pow_out => Pow, I32;
    /// The larger of each pair; NaN propagates.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[1.0f32, f32::NAN], [2], &Device::cpu()).unwrap();
    /// let m = t.maximum(2.0).unwrap().to_vec::<f32>().unwrap();
    /// assert!(m[0] == 2.0 && m[1].is_nan());
    /// ```
    maximum, maximum_, maximum_out => Max, I32;
    /// The smaller of each pair; NaN propagates.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[1i8, 5], [2], &Device::cpu()).unwrap();
    /// assert_eq!(t.minimum(3).unwrap().to_vec::<i8>().unwrap(), vec![1, 3]);
    /// ```
    minimum, minimum_, minimum_out => Min, I32;
    /// `atan2(self, other)`; integers give f32.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::ones([1], DType::F64, &Device::cpu()).unwrap();
    /// assert_eq!(t.atan2(1.0).unwrap().item::<f64>().unwrap(), std::f64::consts::FRAC_PI_4);
    /// ```
    atan2, atan2_, atan2_out => Atan2, F32;
    /// Bitwise and of integers or bools; floats are an `Err`.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1], 0b1100, DType::U8, &Device::cpu()).unwrap();
    /// assert_eq!(t.bitwise_and(0b1010).unwrap().item::<u8>().unwrap(), 0b1000);
    /// ```
    bitwise_and, bitwise_and_, bitwise_and_out => BitAnd, I32;
    /// Bitwise or of integers or bools.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1], 0b1100, DType::U8, &Device::cpu()).unwrap();
    /// assert_eq!(t.bitwise_or(0b1010).unwrap().item::<u8>().unwrap(), 0b1110);
    /// ```
    bitwise_or, bitwise_or_, bitwise_or_out => BitOr, I32;
    /// Bitwise xor of integers or bools.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1], 0b1100, DType::U8, &Device::cpu()).unwrap();
    /// assert_eq!(t.bitwise_xor(0b1010).unwrap().item::<u8>().unwrap(), 0b0110);
    /// ```
    bitwise_xor, bitwise_xor_, bitwise_xor_out => BitXor, I32;
    /// `self << other` for integers; shifts below 0 or of the bit width or more give 0.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([2], 3, DType::U8, &Device::cpu()).unwrap();
    /// assert_eq!(t.bitwise_left_shift(&Tensor::from_slice(&[2u8, 9], [2], &Device::cpu()).unwrap()).unwrap().to_vec::<u8>().unwrap(), vec![12, 0]);
    /// ```
    bitwise_left_shift, bitwise_left_shift_, bitwise_left_shift_out => Shl, I32;
    /// `self >> other` (arithmetic for signed integers); shifts below 0 or of the bit width or
    /// more give 0, or -1 for negative values.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1], -16, DType::I8, &Device::cpu()).unwrap();
    /// assert_eq!(t.bitwise_right_shift(2).unwrap().item::<i8>().unwrap(), -4);
    /// assert_eq!(t.bitwise_right_shift(8).unwrap().item::<i8>().unwrap(), -1);
    /// ```
    bitwise_right_shift, bitwise_right_shift_, bitwise_right_shift_out => Shr, I32;
    /// Saturating `self + other` (augpy): integers clamp to their range.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1], 200, DType::U8, &Device::cpu()).unwrap();
    /// assert_eq!(t.add_sat(100).unwrap().item::<u8>().unwrap(), 255);
    /// ```
    add_sat, add_sat_, add_sat_out => AddSat, I32;
    /// Saturating `self - other`: `u8(0) - 40` is 0.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([1], DType::U8, &Device::cpu()).unwrap();
    /// assert_eq!(t.sub_sat(40).unwrap().item::<u8>().unwrap(), 0);
    /// ```
    sub_sat, sub_sat_, sub_sat_out => SubSat, I32;
    /// Saturating `self * other`.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1], -100, DType::I8, &Device::cpu()).unwrap();
    /// assert_eq!(t.mul_sat(2).unwrap().item::<i8>().unwrap(), -128);
    /// ```
    mul_sat, mul_sat_, mul_sat_out => MulSat, I32;
    /// Saturating division: integers truncate and stay integers (`MIN / -1` is `MAX`,
    /// `x / 0` is 0); floats divide.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1], -128, DType::I8, &Device::cpu()).unwrap();
    /// assert_eq!(t.div_sat(-1).unwrap().item::<i8>().unwrap(), 127);
    /// ```
    div_sat, div_sat_, div_sat_out => DivSat, I32;
    /// Both non-zero, as bool.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[0.0f32, 2.0], [2], &Device::cpu()).unwrap();
    /// assert_eq!(t.logical_and(true).unwrap().to_vec::<bool>().unwrap(), vec![false, true]);
    /// ```
    logical_and, logical_and_, logical_and_out => LogicalAnd, I32;
    /// Either non-zero, as bool.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[0u8, 2], [2], &Device::cpu()).unwrap();
    /// assert_eq!(t.logical_or(false).unwrap().to_vec::<bool>().unwrap(), vec![false, true]);
    /// ```
    logical_or, logical_or_, logical_or_out => LogicalOr, I32;
    /// Exactly one non-zero, as bool.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[0u8, 2], [2], &Device::cpu()).unwrap();
    /// assert_eq!(t.logical_xor(true).unwrap().to_vec::<bool>().unwrap(), vec![true, false]);
    /// ```
    logical_xor, logical_xor_, logical_xor_out => LogicalXor, I32;
    /// `self == other` as bool.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[1i32, 2], [2], &Device::cpu()).unwrap();
    /// assert_eq!(t.eq(2).unwrap().to_vec::<bool>().unwrap(), vec![false, true]);
    /// ```
    eq, eq_, eq_out => Eq, I32;
    /// `self != other` as bool.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[1i32, 2], [2], &Device::cpu()).unwrap();
    /// assert_eq!(t.ne(2).unwrap().to_vec::<bool>().unwrap(), vec![true, false]);
    /// ```
    ne, ne_, ne_out => Ne, I32;
    /// `self < other` as bool.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[1u8, 2], [2], &Device::cpu()).unwrap();
    /// assert_eq!(t.lt(1.5).unwrap().to_vec::<bool>().unwrap(), vec![true, false]);
    /// ```
    lt, lt_, lt_out => Lt, I32;
    /// `self <= other` as bool.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[1u8, 2], [2], &Device::cpu()).unwrap();
    /// assert_eq!(t.le(1).unwrap().to_vec::<bool>().unwrap(), vec![true, false]);
    /// ```
    le, le_, le_out => Le, I32;
    /// `self > other` as bool.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[1u8, 2], [2], &Device::cpu()).unwrap();
    /// assert_eq!(t.gt(1).unwrap().to_vec::<bool>().unwrap(), vec![false, true]);
    /// ```
    gt, gt_, gt_out => Gt, I32;
    /// `self >= other` as bool.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[1u8, 2], [2], &Device::cpu()).unwrap();
    /// assert_eq!(t.ge(2).unwrap().to_vec::<bool>().unwrap(), vec![false, true]);
    /// ```
    ge, ge_, ge_out => Ge, I32;
}

/// Defines `name`, `name_` (in place) and `name_out` methods for unary ops.
macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident, $inplace:ident, $out:ident => $op:ident, $ex:ident;)*) => {
        impl Tensor {$(
            $(#[$doc])*
            #[track_caller]
            pub fn $name(&self) -> Result<Tensor> {
                unary(UnaryOp::$op, self, None, stringify!($name))
            }

            #[doc = concat!("In-place [`", stringify!($name), "`](Tensor::", stringify!($name),
                "): the dtype must accept the result (float functions need a float tensor).")]
            ///
            /// ```
            /// use strata_core::{Device, DType, Tensor};
            #[doc = concat!("let t = Tensor::ones([2], DType::", stringify!($ex), ", &Device::cpu()).unwrap();")]
            #[doc = concat!("t.", stringify!($inplace), "().unwrap();")]
            /// ```
            #[track_caller]
            pub fn $inplace(&self) -> Result<()> {
                unary(UnaryOp::$op, self, Some(self), stringify!($inplace)).map(|_| ())
            }

            #[doc = concat!("[`", stringify!($name), "`](Tensor::", stringify!($name),
                ") written into `out`, whose shape must be `self`'s and whose dtype must \
                accept the result.")]
            ///
            /// ```
            /// use strata_core::{Device, DType, Tensor};
            #[doc = concat!("let t = Tensor::ones([2], DType::", stringify!($ex), ", &Device::cpu()).unwrap();")]
            /// let out = Tensor::zeros([2], DType::F64, &Device::cpu()).unwrap();
            #[doc = concat!("t.", stringify!($out), "(&out).unwrap();")]
            /// ```
            #[track_caller]
            pub fn $out(&self, out: &Tensor) -> Result<()> {
                unary(UnaryOp::$op, self, Some(out), stringify!($out)).map(|_| ())
            }
        )*}
    };
}

/// Defines a unary op whose result is always bool (no in-place form).
macro_rules! predicate_methods {
    ($($(#[$doc:meta])* $name:ident, $out:ident => $op:ident;)*) => {
        impl Tensor {$(
            $(#[$doc])*
            #[track_caller]
            pub fn $name(&self) -> Result<Tensor> {
                unary(UnaryOp::$op, self, None, stringify!($name))
            }

            #[doc = concat!("[`", stringify!($name), "`](Tensor::", stringify!($name),
                ") written into `out` (shape of `self`).")]
            ///
            /// ```
            /// use strata_core::{Device, DType, Tensor};
            /// let t = Tensor::ones([2], DType::F32, &Device::cpu()).unwrap();
            /// let out = Tensor::zeros([2], DType::Bool, &Device::cpu()).unwrap();
            #[doc = concat!("t.", stringify!($out), "(&out).unwrap();")]
            /// ```
            #[track_caller]
            pub fn $out(&self, out: &Tensor) -> Result<()> {
                unary(UnaryOp::$op, self, Some(out), stringify!($out)).map(|_| ())
            }
        )*}
    };
}

unary_methods! {
    /// `-self`; integers wrap; bool is an `Err`.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1], -128, DType::I8, &Device::cpu()).unwrap();
    /// assert_eq!(t.neg().unwrap().item::<i8>().unwrap(), -128);
    /// ```
    neg, neg_, neg_out => Neg, I32;
    /// Saturating `-self`: `-(-128i8)` is 127, unsigned values give 0.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1], -128, DType::I8, &Device::cpu()).unwrap();
    /// assert_eq!(t.neg_sat().unwrap().item::<i8>().unwrap(), 127);
    /// ```
    neg_sat, neg_sat_, neg_sat_out => NegSat, I32;
    /// `|self|`.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1], -2.5, DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.abs().unwrap().item::<f32>().unwrap(), 2.5);
    /// ```
    abs, abs_, abs_out => Abs, I32;
    /// -1, 0 or 1.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[-3i16, 0, 9], [3], &Device::cpu()).unwrap();
    /// assert_eq!(t.sign().unwrap().to_vec::<i16>().unwrap(), vec![-1, 0, 1]);
    /// ```
    sign, sign_, sign_out => Sign, I32;
    /// `self * self`.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1], -3, DType::I32, &Device::cpu()).unwrap();
    /// assert_eq!(t.square().unwrap().item::<i32>().unwrap(), 9);
    /// ```
    square, square_, square_out => Square, I32;
    /// Square root (integers give f32).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1], 9, DType::I32, &Device::cpu()).unwrap();
    /// assert_eq!(t.sqrt().unwrap().item::<f32>().unwrap(), 3.0);
    /// ```
    sqrt, sqrt_, sqrt_out => Sqrt, F32;
    /// `1 / √self`.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1], 4.0, DType::F64, &Device::cpu()).unwrap();
    /// assert_eq!(t.rsqrt().unwrap().item::<f64>().unwrap(), 0.5);
    /// ```
    rsqrt, rsqrt_, rsqrt_out => Rsqrt, F32;
    /// `1 / self`.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1], 4.0, DType::F64, &Device::cpu()).unwrap();
    /// assert_eq!(t.reciprocal().unwrap().item::<f64>().unwrap(), 0.25);
    /// ```
    reciprocal, reciprocal_, reciprocal_out => Reciprocal, F32;
    /// `e^self`.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([1], DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.exp().unwrap().item::<f32>().unwrap(), 1.0);
    /// ```
    exp, exp_, exp_out => Exp, F32;
    /// `2^self`.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1], 3.0, DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.exp2().unwrap().item::<f32>().unwrap(), 8.0);
    /// ```
    exp2, exp2_, exp2_out => Exp2, F32;
    /// `e^self - 1`, accurate near 0.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1], 1e-10, DType::F64, &Device::cpu()).unwrap();
    /// assert!((t.expm1().unwrap().item::<f64>().unwrap() - 1e-10).abs() < 1e-20);
    /// ```
    expm1, expm1_, expm1_out => Expm1, F32;
    /// Natural logarithm.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::ones([1], DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.log().unwrap().item::<f32>().unwrap(), 0.0);
    /// ```
    log, log_, log_out => Log, F32;
    /// Base-2 logarithm.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1], 8.0, DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.log2().unwrap().item::<f32>().unwrap(), 3.0);
    /// ```
    log2, log2_, log2_out => Log2, F32;
    /// Base-10 logarithm.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1], 100.0, DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.log10().unwrap().item::<f32>().unwrap(), 2.0);
    /// ```
    log10, log10_, log10_out => Log10, F32;
    /// `ln(1 + self)`, accurate near 0.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([1], DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.log1p().unwrap().item::<f32>().unwrap(), 0.0);
    /// ```
    log1p, log1p_, log1p_out => Log1p, F32;
    /// Sine.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([1], DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.sin().unwrap().item::<f32>().unwrap(), 0.0);
    /// ```
    sin, sin_, sin_out => Sin, F32;
    /// Cosine.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([1], DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.cos().unwrap().item::<f32>().unwrap(), 1.0);
    /// ```
    cos, cos_, cos_out => Cos, F32;
    /// Tangent.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([1], DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.tan().unwrap().item::<f32>().unwrap(), 0.0);
    /// ```
    tan, tan_, tan_out => Tan, F32;
    /// Hyperbolic tangent.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([1], DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.tanh().unwrap().item::<f32>().unwrap(), 0.0);
    /// ```
    tanh, tanh_, tanh_out => Tanh, F32;
    /// `1 / (1 + e^-self)`.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([1], DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.sigmoid().unwrap().item::<f32>().unwrap(), 0.5);
    /// ```
    sigmoid, sigmoid_, sigmoid_out => Sigmoid, F32;
    /// `max(self, 0)`.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[-1i32, 2], [2], &Device::cpu()).unwrap();
    /// assert_eq!(t.relu().unwrap().to_vec::<i32>().unwrap(), vec![0, 2]);
    /// ```
    relu, relu_, relu_out => Relu, I32;
    /// GELU with the exact error function: `x · Φ(x)`.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([1], DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.gelu().unwrap().item::<f32>().unwrap(), 0.0);
    /// ```
    gelu, gelu_, gelu_out => Gelu, F32;
    /// The error function.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([1], DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.erf().unwrap().item::<f32>().unwrap(), 0.0);
    /// ```
    erf, erf_, erf_out => Erf, F32;
    /// Round down (integers unchanged).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1], -1.5, DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.floor().unwrap().item::<f32>().unwrap(), -2.0);
    /// ```
    floor, floor_, floor_out => Floor, I32;
    /// Round up (integers unchanged).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1], -1.5, DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.ceil().unwrap().item::<f32>().unwrap(), -1.0);
    /// ```
    ceil, ceil_, ceil_out => Ceil, I32;
    /// Round half to even (integers unchanged).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[0.5f32, 1.5, 2.5], [3], &Device::cpu()).unwrap();
    /// assert_eq!(t.round().unwrap().to_vec::<f32>().unwrap(), vec![0.0, 2.0, 2.0]);
    /// ```
    round, round_, round_out => Round, I32;
    /// Round toward zero (integers unchanged).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([1], -1.7, DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.trunc().unwrap().item::<f32>().unwrap(), -1.0);
    /// ```
    trunc, trunc_, trunc_out => Trunc, I32;
    /// Bitwise not (bool: logical not); floats are an `Err`.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([1], DType::U8, &Device::cpu()).unwrap();
    /// assert_eq!(t.bitwise_not().unwrap().item::<u8>().unwrap(), 255);
    /// ```
    bitwise_not, bitwise_not_, bitwise_not_out => BitNot, I32;
}

predicate_methods! {
    /// NaN test, as bool.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[f32::NAN, 1.0], [2], &Device::cpu()).unwrap();
    /// assert_eq!(t.isnan().unwrap().to_vec::<bool>().unwrap(), vec![true, false]);
    /// ```
    isnan, isnan_out => IsNan;
    /// ±infinity test, as bool.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[f32::INFINITY, 1.0], [2], &Device::cpu()).unwrap();
    /// assert_eq!(t.isinf().unwrap().to_vec::<bool>().unwrap(), vec![true, false]);
    /// ```
    isinf, isinf_out => IsInf;
    /// Neither NaN nor infinite, as bool.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[f32::NAN, 1.0], [2], &Device::cpu()).unwrap();
    /// assert_eq!(t.isfinite().unwrap().to_vec::<bool>().unwrap(), vec![false, true]);
    /// ```
    isfinite, isfinite_out => IsFinite;
    /// `self == 0`, as bool.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[0i32, 3], [2], &Device::cpu()).unwrap();
    /// assert_eq!(t.logical_not().unwrap().to_vec::<bool>().unwrap(), vec![true, false]);
    /// ```
    logical_not, logical_not_out => LogicalNot;
}

impl Tensor {
    /// `cond ? a : b` elementwise, broadcasting all three; `cond` must be bool. The result
    /// has the promoted dtype of `a` and `b`.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let x = Tensor::from_slice(&[-1.0f32, 2.0], [2], &dev).unwrap();
    /// let y = Tensor::where_cond(&x.gt(0.0).unwrap(), &x, 0.0).unwrap();
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![0.0, 2.0]);
    /// ```
    #[track_caller]
    pub fn where_cond(cond: &Tensor, a: impl Into<Value>, b: impl Into<Value>) -> Result<Tensor> {
        if cond.dtype() != DType::Bool {
            return Err(Error::DType(format!(
                "where_cond needs a bool condition, not {}; compare first (e.g. .ne(0))",
                cond.dtype()
            )));
        }
        let (a, b) = (a.into(), b.into());
        let (a, b, c) = (ValueRef::from(&a), ValueRef::from(&b), ValueRef::from(cond));
        let (mut l, device_of) = OpOperands::new(&[c, a, b], "where_cond")?;
        let dtype = result_type_of([a, b]);
        let cond = l.leaf(c, DType::Bool)?;
        let (x, y) = (l.leaf(a, dtype)?, l.leaf(b, dtype)?);
        l.finish(Expr::select(cond, x, y), device_of, None, "where_cond")
    }

    /// Each element limited to `[min, max]` (tensors or scalars, broadcasting); NaN stays NaN.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::arange(0, 5, 1, DType::I32, &Device::cpu()).unwrap();
    /// assert_eq!(t.clamp(1, 3).unwrap().to_vec::<i32>().unwrap(), vec![1, 1, 2, 3, 3]);
    /// ```
    #[track_caller]
    pub fn clamp(&self, min: impl Into<Value>, max: impl Into<Value>) -> Result<Tensor> {
        let (lo, hi) = (min.into(), max.into());
        let tensors = [&lo, &hi].into_iter().filter_map(|v| match v {
            Value::Tensor(t) => Some(t),
            Value::Scalar(_) => None,
        });
        if crate::autograd::needed(std::iter::once(self).chain(tensors)) {
            let out = crate::autograd::no_grad(|| self.clamp(lo.clone(), hi.clone()))?;
            return Ok(record_clamp(self, lo, hi, out));
        }
        let (x, lo, hi) = (
            ValueRef::from(self),
            ValueRef::from(&lo),
            ValueRef::from(&hi),
        );
        let (mut l, device_of) = OpOperands::new(&[x, lo, hi], "clamp")?;
        let dtype = result_type_of([x, lo, hi]);
        let (x, lo, hi) = (l.leaf(x, dtype)?, l.leaf(lo, dtype)?, l.leaf(hi, dtype)?);
        let expr = Expr::binary(BinaryOp::Min, Expr::binary(BinaryOp::Max, x, lo), hi);
        l.finish(expr, device_of, None, "clamp")
    }

    /// `self · b + c` with one rounding for f32 and f64 (augpy's fma), broadcasting.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::full([2], 3, DType::I32, &Device::cpu()).unwrap();
    /// assert_eq!(t.fma(4, 5).unwrap().to_vec::<i32>().unwrap(), vec![17, 17]);
    /// ```
    #[track_caller]
    pub fn fma(&self, b: impl Into<Value>, c: impl Into<Value>) -> Result<Tensor> {
        let (b, c) = (b.into(), c.into());
        let (a, b, c) = (ValueRef::from(self), ValueRef::from(&b), ValueRef::from(&c));
        let (mut l, device_of) = OpOperands::new(&[a, b, c], "fma")?;
        let dtype = result_type_of([a, b, c]);
        if !crate::lower::legal::fma_defined(dtype) {
            return Err(Error::DType("fma is not defined for bool operands".into()));
        }
        let (x, y, z) = (l.leaf(a, dtype)?, l.leaf(b, dtype)?, l.leaf(c, dtype)?);
        l.finish(Expr::fma(x, y, z), device_of, None, "fma")
    }

    /// Linear interpolation `self + weight · (end - self)` for floats, computed as PyTorch
    /// does (from `end` when `weight ≥ 0.5`, for accuracy).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([1], DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.lerp(10.0, 0.25).unwrap().item::<f32>().unwrap(), 2.5);
    /// ```
    #[track_caller]
    pub fn lerp(&self, end: impl Into<Value>, weight: impl Into<Value>) -> Result<Tensor> {
        let (b, w) = (end.into(), weight.into());
        let (a, b, w) = (ValueRef::from(self), ValueRef::from(&b), ValueRef::from(&w));
        let (mut l, device_of) = OpOperands::new(&[a, b, w], "lerp")?;
        let dtype = result_type_of([a, b, w]);
        if !dtype.is_float() {
            return Err(Error::DType(format!(
                "lerp is defined for float tensors, not {dtype}; convert with to_dtype"
            )));
        }
        let (a, b, w) = (l.leaf(a, dtype)?, l.leaf(b, dtype)?, l.leaf(w, dtype)?);
        l.scalars.extend([
            Scalar::F64(0.5).cast(dtype, false),
            Scalar::F64(1.0).cast(dtype, false),
        ]);
        let (half, one) = (l.scalars.len() - 2, l.scalars.len() - 1);
        let diff = Expr::binary(BinaryOp::Sub, b.clone(), a.clone());
        let low = Expr::binary(
            BinaryOp::Add,
            a,
            Expr::binary(BinaryOp::Mul, w.clone(), diff.clone()),
        );
        let rest = Expr::binary(BinaryOp::Sub, Expr::scalar(one, dtype), w.clone());
        let high = Expr::binary(BinaryOp::Sub, b, Expr::binary(BinaryOp::Mul, diff, rest));
        let use_low = Expr::binary(BinaryOp::Lt, w, Expr::scalar(half, dtype));
        l.finish(Expr::select(use_low, low, high), device_of, None, "lerp")
    }
}

/// `out = x.clamp(lo, hi)` with its backward node (PyTorch's rule): `x` gets the gradient where
/// `lo ≤ x ≤ hi` (its bounds included), a tensor `lo` where `x < lo`, a tensor `hi` where
/// `x > hi`, each summed back to its shape.
fn record_clamp(x: &Tensor, lo: Value, hi: Value, out: Tensor) -> Tensor {
    use crate::autograd::graph::Saved;
    let xs = Saved::new(x, "clamp");
    let described = vec![xs.describe()];
    let bound = |v: &Value| match v {
        Value::Tensor(t) => Some(t.clone()),
        Value::Scalar(_) => None,
    };
    let (lo_t, hi_t) = (bound(&lo), bound(&hi));
    let mut inputs: Vec<&Tensor> = vec![x];
    inputs.extend(lo_t.as_ref());
    inputs.extend(hi_t.as_ref());
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
    let dtypes: Vec<DType> = inputs.iter().map(|t| t.dtype()).collect();
    let (lo_s, hi_s) = (
        lo_t.as_ref().map(|t| Saved::new(t, "clamp")),
        hi_t.as_ref().map(|t| Saved::new(t, "clamp")),
    );
    crate::autograd::record("ClampBackward", &inputs, out, described, move |g| {
        let x = xs.get()?;
        let value = |saved: &Option<Saved>, v: &Value| -> Result<Value> {
            Ok(match saved {
                Some(s) => Value::Tensor(s.get()?.clone()),
                None => v.clone(),
            })
        };
        let (lo, hi) = (value(&lo_s, &lo)?, value(&hi_s, &hi)?);
        let inside = x.ge(lo.clone())?.logical_and(&x.le(hi.clone())?)?;
        let mut grads = vec![Tensor::where_cond(&inside, g, 0.0)?];
        if lo_s.is_some() {
            grads.push(Tensor::where_cond(&x.lt(lo)?, g, 0.0)?);
        }
        if hi_s.is_some() {
            grads.push(Tensor::where_cond(&x.gt(hi)?, g, 0.0)?);
        }
        grads
            .into_iter()
            .zip(shapes.iter().zip(&dtypes))
            .map(|(gk, (shape, &dtype))| {
                let gk = crate::autograd::sum_to_shape(&gk, shape)?;
                Ok(Some(if gk.dtype() == dtype {
                    gk
                } else {
                    gk.to_dtype(dtype)?
                }))
            })
            .collect()
    })
}
