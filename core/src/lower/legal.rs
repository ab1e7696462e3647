//! Which `(op, dtype)` pairs exist, and the canonical form of each: some ops are other ops on
//! some dtypes (bool `+` is or, an integer's `floor` is the integer, `isnan` of an integer is
//! false). The rewrites happen here, once, when a tree is built, so no backend decides them:
//! every backend implements exactly the pairs whose rule is [`Rule::Kernel`].
//!
//! ```
//! use strata_core::lower::legal::{binary_rule, unary_rule, Rule};
//! use strata_core::ir::{BinaryOp, UnaryOp};
//! use strata_core::DType;
//! assert_eq!(binary_rule(BinaryOp::Add, DType::Bool), Rule::Binary(BinaryOp::BitOr));
//! assert_eq!(unary_rule(UnaryOp::Floor, DType::I32), Rule::Identity);
//! assert_eq!(unary_rule(UnaryOp::Sqrt, DType::I32), Rule::Undefined);
//! assert_eq!(unary_rule(UnaryOp::Sqrt, DType::F16), Rule::Kernel);
//! ```

use crate::dtype::DType;
use crate::ir::{BinaryOp, Expr, UnaryOp};

/// How an op on a dtype reaches a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// The backends implement it as it is.
    Kernel,
    /// The operand itself (an integer's `floor`, a bool's `abs`).
    Identity,
    /// A constant of the node's dtype (`isnan` of an integer is false).
    Constant(bool),
    /// Another unary op (a bool's bitwise not is its logical not).
    Unary(UnaryOp),
    /// Another binary op (bool `+` is or, `*` is and).
    Binary(BinaryOp),
    /// `max(x, 0)`: `relu` of an integer.
    MaxWithZero,
    /// Not defined: core refuses it before building a kernel.
    Undefined,
}

impl Rule {
    /// True unless the op is undefined on the dtype.
    ///
    /// ```
    /// use strata_core::lower::legal::Rule;
    /// assert!(Rule::Identity.defined() && !Rule::Undefined.defined());
    /// ```
    pub fn defined(self) -> bool {
        self != Rule::Undefined
    }
}

/// The rule for unary `op` on an operand of `dtype`.
///
/// ```
/// use strata_core::lower::legal::{unary_rule, Rule};
/// use strata_core::{ir::UnaryOp, DType};
/// assert_eq!(unary_rule(UnaryOp::Relu, DType::I8), Rule::MaxWithZero);
/// assert_eq!(unary_rule(UnaryOp::IsFinite, DType::U16), Rule::Constant(true));
/// ```
pub fn unary_rule(op: UnaryOp, dtype: DType) -> Rule {
    use UnaryOp::*;
    if dtype == DType::Bool {
        return match op {
            LogicalNot => Rule::Kernel,
            BitNot => Rule::Unary(LogicalNot),
            Abs | Floor | Ceil | Round | Trunc | Relu | Sign | Square => Rule::Identity,
            IsNan | IsInf => Rule::Constant(false),
            IsFinite => Rule::Constant(true),
            _ => Rule::Undefined,
        };
    }
    if dtype.is_float() {
        return match op {
            BitNot => Rule::Undefined,
            _ => Rule::Kernel,
        };
    }
    match op {
        Neg | NegSat | Abs | Sign | Square | BitNot | LogicalNot => Rule::Kernel,
        Floor | Ceil | Round | Trunc => Rule::Identity,
        IsNan | IsInf => Rule::Constant(false),
        IsFinite => Rule::Constant(true),
        Relu => Rule::MaxWithZero,
        _ => Rule::Undefined,
    }
}

/// The rule for binary `op` on operands of `dtype`.
///
/// ```
/// use strata_core::lower::legal::{binary_rule, Rule};
/// use strata_core::{ir::BinaryOp, DType};
/// assert_eq!(binary_rule(BinaryOp::Min, DType::Bool), Rule::Binary(BinaryOp::BitAnd));
/// assert_eq!(binary_rule(BinaryOp::Shl, DType::F32), Rule::Undefined);
/// ```
pub fn binary_rule(op: BinaryOp, dtype: DType) -> Rule {
    use BinaryOp::*;
    if op.returns_bool() {
        return Rule::Kernel; // comparisons and logical ops: every dtype
    }
    if dtype == DType::Bool {
        return match op {
            BitAnd | BitOr | BitXor => Rule::Kernel,
            Add | Max => Rule::Binary(BitOr),
            Mul | Min => Rule::Binary(BitAnd),
            _ => Rule::Undefined,
        };
    }
    if dtype.is_float() {
        return match op {
            BitAnd | BitOr | BitXor | Shl | Shr => Rule::Undefined,
            _ => Rule::Kernel,
        };
    }
    match op {
        Div | Atan2 => Rule::Undefined,
        _ => Rule::Kernel,
    }
}

/// True when `a · b + c` is defined on `dtype` (every dtype but bool).
///
/// ```
/// assert!(!strata_core::lower::legal::fma_defined(strata_core::DType::Bool));
/// ```
pub fn fma_defined(dtype: DType) -> bool {
    dtype != DType::Bool
}

/// `op(arg)` in canonical form (what [`Expr::unary`] builds).
///
/// ```
/// use strata_core::{ir::{Expr, UnaryOp}, lower::legal::unary, DType};
/// let x = Expr::input(0, DType::U8);
/// assert_eq!(unary(UnaryOp::Trunc, x.clone()), x);
/// ```
pub fn unary(op: UnaryOp, arg: Expr) -> Expr {
    match unary_rule(op, arg.dtype) {
        Rule::Identity => arg,
        Rule::Constant(v) => Expr::literal(crate::dtype::Scalar::Bool(v)),
        Rule::Unary(other) => Expr::raw_unary(other, arg),
        Rule::MaxWithZero => {
            let zero = Expr::literal(crate::dtype::Scalar::I8(0).cast(arg.dtype, false));
            Expr::raw_binary(BinaryOp::Max, arg, zero)
        }
        Rule::Kernel | Rule::Undefined | Rule::Binary(_) => Expr::raw_unary(op, arg),
    }
}

/// `op(lhs, rhs)` in canonical form (what [`Expr::binary`] builds).
///
/// ```
/// use strata_core::{ir::{BinaryOp, Expr, Node}, lower::legal::binary, DType};
/// let b = || Expr::input(0, DType::Bool);
/// assert!(matches!(binary(BinaryOp::Add, b(), b()).node, Node::Binary(BinaryOp::BitOr, ..)));
/// ```
pub fn binary(op: BinaryOp, lhs: Expr, rhs: Expr) -> Expr {
    match binary_rule(op, lhs.dtype) {
        Rule::Binary(other) => Expr::raw_binary(other, lhs, rhs),
        _ => Expr::raw_binary(op, lhs, rhs),
    }
}

/// The canonical constructors live beside the table they follow, so the IR does not depend on
/// the lowering layer.
impl Expr {
    /// `op(lhs, rhs)` in canonical form ([`binary`]:
    /// bool `+` is or, ...); the operands must share a dtype.
    ///
    /// ```
    /// use strata_core::{DType, ir::{BinaryOp, Expr}};
    /// let e = Expr::binary(BinaryOp::Lt, Expr::input(0, DType::I8), Expr::input(1, DType::I8));
    /// assert_eq!(e.dtype, DType::Bool);
    /// ```
    pub fn binary(op: BinaryOp, lhs: Expr, rhs: Expr) -> Expr {
        binary(op, lhs, rhs)
    }

    /// `op(arg)` in canonical form ([`unary`]: an
    /// integer's `floor` is the integer, ...).
    ///
    /// ```
    /// use strata_core::{DType, ir::{Expr, UnaryOp}};
    /// assert_eq!(Expr::unary(UnaryOp::IsNan, Expr::input(0, DType::F16)).dtype, DType::Bool);
    /// ```
    pub fn unary(op: UnaryOp, arg: Expr) -> Expr {
        unary(op, arg)
    }
}

/// An `Err` naming the first node of `expr` whose op its dtype does not define: what reaches a
/// backend is checked once, here.
///
/// ```
/// use strata_core::{ir::{Expr, UnaryOp}, lower::legal::check, DType};
/// assert!(check(&Expr::unary(UnaryOp::Exp, Expr::input(0, DType::F32))).is_ok());
/// assert!(check(&Expr::unary(UnaryOp::Exp, Expr::input(0, DType::I32))).is_err());
/// ```
pub fn check(expr: &Expr) -> crate::error::Result<()> {
    use crate::ir::Node;
    // Inline for the trees of single ops: this runs on every launch.
    let mut stack: smallvec::SmallVec<[&Expr; 16]> = smallvec::smallvec![expr];
    while let Some(e) = stack.pop() {
        let bad = match &e.node {
            Node::Unary(op, a) => {
                stack.push(a);
                (unary_rule(*op, a.dtype) != Rule::Kernel).then(|| format!("{op:?}"))
            }
            Node::Binary(op, a, b) => {
                stack.extend([&**a, &**b]);
                (binary_rule(*op, a.dtype) != Rule::Kernel).then(|| format!("{op:?}"))
            }
            Node::Fma(a, b, c) => {
                stack.extend([&**a, &**b, &**c]);
                (!fma_defined(a.dtype)).then(|| "Fma".to_string())
            }
            Node::Where(c, a, b) => {
                stack.extend([&**c, &**a, &**b]);
                None
            }
            Node::Cast { arg, .. } => {
                stack.push(arg);
                None
            }
            Node::Bitcast(arg) => {
                stack.push(arg);
                let fits = arg.dtype.itemsize() == e.dtype.itemsize()
                    && arg.dtype != DType::Bool
                    && e.dtype != DType::Bool;
                (!fits).then(|| format!("Bitcast from {}", arg.dtype))
            }
            Node::Input(_)
            | Node::Scalar(_)
            | Node::Literal(_)
            | Node::LinearIndex
            | Node::Philox(_) => None,
        };
        if let Some(op) = bad {
            return Err(crate::error::Error::Unsupported(format!(
                "IR op {op} is not defined for {} (or not in canonical form)",
                match &e.node {
                    Node::Unary(_, a) | Node::Binary(_, a, _) | Node::Fma(a, _, _) => a.dtype,
                    _ => e.dtype,
                }
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_trees_hold_only_kernel_pairs() {
        use BinaryOp::*;
        use UnaryOp::*;
        for d in DType::ALL {
            let x = || Expr::input(0, d);
            for op in [Abs, Floor, Relu, IsNan, IsFinite, BitNot, Sign, Square] {
                if unary_rule(op, d).defined() {
                    check(&Expr::unary(op, x())).unwrap();
                }
            }
            for op in [Add, Mul, Max, Min, BitXor, Lt] {
                if binary_rule(op, d).defined() {
                    check(&Expr::binary(op, x(), x())).unwrap();
                }
            }
        }
    }

    #[test]
    fn integer_relu_is_max_with_zero() {
        let e = Expr::unary(UnaryOp::Relu, Expr::input(0, DType::I16));
        let crate::ir::Node::Binary(BinaryOp::Max, _, zero) = &e.node else {
            panic!("{e:?}")
        };
        assert_eq!(zero.node, crate::ir::Node::Literal(0));
        assert_eq!(zero.dtype, DType::I16);
    }
}
