//! Rust's arithmetic operators on tensors and scalars, each the method of the same name.

use super::binary;
use crate::assign::ValueRef;
use crate::error::Result;
use crate::ir::BinaryOp;
use crate::tensor::Tensor;

/// Implements a Rust operator for tensor/tensor, tensor/scalar and scalar/tensor pairs.
/// Scalars in operators are `i64` and `f64` (Python's `int` and `float`), so literals like
/// `&t + 3` and `1.0 - &t` infer; methods (`t.add(3u8)`) take any scalar type.
macro_rules! operator {
    ($trait:ident, $method:ident, $op:ident) => {
        impl std::ops::$trait<&Tensor> for &Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                binary(BinaryOp::$op, ValueRef::from(self), ValueRef::from(rhs), None, stringify!($method))
            }
        }
        impl std::ops::$trait<Tensor> for &Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                self.$method(&rhs)
            }
        }
        impl std::ops::$trait<&Tensor> for Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                (&self).$method(rhs)
            }
        }
        impl std::ops::$trait<Tensor> for Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                (&self).$method(&rhs)
            }
        }
        operator!(@scalars $trait, $method, $op, i64, f64);
    };
    (@scalars $trait:ident, $method:ident, $op:ident, $($t:ty),*) => {$(
        impl std::ops::$trait<$t> for &Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: $t) -> Result<Tensor> {
                binary(BinaryOp::$op, ValueRef::from(self), ValueRef::Scalar(rhs.into()), None, stringify!($method))
            }
        }
        impl std::ops::$trait<$t> for Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: $t) -> Result<Tensor> {
                (&self).$method(rhs)
            }
        }
        impl std::ops::$trait<&Tensor> for $t {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                binary(BinaryOp::$op, ValueRef::Scalar(self.into()), ValueRef::from(rhs), None, stringify!($method))
            }
        }
        impl std::ops::$trait<Tensor> for $t {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                self.$method(&rhs)
            }
        }
    )*};
}

operator!(Add, add, Add);
operator!(Sub, sub, Sub);
operator!(Mul, mul, Mul);
operator!(Div, div, Div);
operator!(Rem, rem, Rem);

impl std::ops::Neg for &Tensor {
    type Output = Result<Tensor>;
    #[track_caller]
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(self)
    }
}

impl std::ops::Neg for Tensor {
    type Output = Result<Tensor>;
    #[track_caller]
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(&self)
    }
}
