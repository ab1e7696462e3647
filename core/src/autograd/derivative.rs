//! Gradients of elementwise expressions: the derivative of each IR node, once. An elementwise
//! op's backward function is its expression differentiated in reverse (a vector-Jacobian
//! product): for each input, one expression over the output's gradient and the op's inputs,
//! which runs as one map kernel (lazy fusion may join it to its neighbours). A value the
//! derivative needs (`exp(x)` for `exp`) is computed again from the inputs inside that kernel
//! instead of being kept from the forward pass. PyTorch's conventions where the derivative
//! is not defined: `relu`, `abs` and `sign` give 0 at 0, `maximum`/`minimum` split a tie in
//! half, rounding ops give 0, and `pow`'s exponent gets 0 where the base is 0.

use crate::dtype::{DType, Scalar};
use crate::ir::{BinaryOp, Expr, Node, UnaryOp};

/// The gradients of `expr` (over inputs `0..wanted.len()` and launch scalars) for the inputs
/// whose `wanted` is true: each an expression over input 0, the gradient of `expr`'s value
/// (its dtype), and inputs `1..`, the op's inputs in order, with the same scalars; in the
/// input's dtype. `None` where no path reaches the input (an integer or bool input, say).
/// For `x * y`: `g * y` for `x` (input 0 is `g`, 1 is `x`, 2 is `y`) and `g * x` for `y`.
pub(crate) fn vjp(expr: &Expr, wanted: &[bool]) -> Vec<Option<Expr>> {
    let shifted = shift_inputs(expr);
    let mut grads: Vec<Option<Expr>> = vec![None; wanted.len()];
    if expr.dtype.is_float() {
        back(&shifted, Expr::input(0, expr.dtype), wanted, &mut grads);
    }
    grads
}

/// `e` with input `k` renumbered `k + 1` (input 0 becomes the gradient).
fn shift_inputs(e: &Expr) -> Expr {
    match e.node {
        Node::Input(k) => Expr::input(k + 1, e.dtype),
        _ => e.map_children(shift_inputs),
    }
}

/// True when `e` reads a wanted input (shifted numbering).
fn reaches(e: &Expr, wanted: &[bool]) -> bool {
    match e.node {
        Node::Input(k) => wanted.get(k - 1).copied().unwrap_or(false),
        _ => e.children().any(|c| reaches(c, wanted)),
    }
}

/// Passes the gradient `a` of node `e` on to its operands (recursion as deep as one op's
/// expression: a few nodes).
fn back(e: &Expr, a: Expr, wanted: &[bool], grads: &mut [Option<Expr>]) {
    if !reaches(e, wanted) {
        return;
    }
    let d = e.dtype;
    match &e.node {
        Node::Input(k) => {
            let slot = &mut grads[k - 1];
            *slot = Some(match slot.take() {
                Some(earlier) => add(earlier, a),
                None => a,
            });
        }
        // Bits carry no gradient (stochastic rounding records the plain cast's instead).
        Node::Scalar(_)
        | Node::Literal(_)
        | Node::LinearIndex
        | Node::Philox(_)
        | Node::Bitcast(_) => {}
        Node::Cast { arg, .. } => {
            // Between float dtypes the gradient converts back; from or to an integer there
            // is none.
            if d.is_float() && arg.dtype.is_float() {
                back(arg, a.cast(arg.dtype, false), wanted, grads);
            }
        }
        Node::Unary(op, x) => {
            if d.is_float() {
                if let Some(gx) = unary(*op, x, e, a) {
                    back(x, gx, wanted, grads);
                }
            }
        }
        Node::Binary(op, x, z) => {
            if d.is_float() {
                let (gx, gz) = binary(*op, x, z, e, a);
                if let Some(gx) = gx {
                    back(x, gx, wanted, grads);
                }
                if let Some(gz) = gz {
                    back(z, gz, wanted, grads);
                }
            }
        }
        Node::Fma(x, y, z) => {
            if d.is_float() {
                back(x, mul(a.clone(), (**y).clone()), wanted, grads);
                back(y, mul(a.clone(), (**x).clone()), wanted, grads);
                back(z, a, wanted, grads);
            }
        }
        Node::Where(c, x, z) => {
            if d.is_float() {
                let zero = lit(0.0, d);
                back(
                    x,
                    select((**c).clone(), a.clone(), zero.clone()),
                    wanted,
                    grads,
                );
                back(z, select((**c).clone(), zero, a), wanted, grads);
            }
        }
    }
}

/// The gradient of `x` through `y = op(x)`, given `y`'s gradient `a`.
fn unary(op: UnaryOp, x: &Expr, y: &Expr, a: Expr) -> Option<Expr> {
    use UnaryOp::*;
    let d = y.dtype;
    let (x, y) = (x.clone(), y.clone());
    let one = || lit(1.0, d);
    Some(match op {
        Neg | NegSat => un(Neg, a),
        Abs => mul(a, un(Sign, x)),
        Sign | Floor | Ceil | Round | Trunc => lit(0.0, d),
        Square => mul(a, mul(x, lit(2.0, d))),
        Sqrt => div(a, mul(y, lit(2.0, d))),
        Rsqrt => mul(a, mul(lit(-0.5, d), mul(y.clone(), mul(y.clone(), y)))),
        Reciprocal => mul(a, un(Neg, mul(y.clone(), y))),
        Exp => mul(a, y),
        Exp2 => mul(a, mul(y, lit(std::f64::consts::LN_2, d))),
        Expm1 => mul(a, add(y, one())),
        Log => div(a, x),
        Log2 => div(a, mul(x, lit(std::f64::consts::LN_2, d))),
        Log10 => div(a, mul(x, lit(std::f64::consts::LN_10, d))),
        Log1p => div(a, add(x, one())),
        Sin => mul(a, un(Cos, x)),
        Cos => mul(a, un(Neg, un(Sin, x))),
        Tan => mul(a, add(one(), mul(y.clone(), y))),
        Tanh => mul(a, sub(one(), mul(y.clone(), y))),
        Sigmoid => mul(a, mul(y.clone(), sub(one(), y))),
        // PyTorch's threshold_backward: the gradient where x > 0 (0 at 0 and for NaN).
        Relu => select(bin(BinaryOp::Gt, x, lit(0.0, d)), a, lit(0.0, d)),
        // GELU(x) = x·Φ(x): Φ(x) + x·φ(x).
        Gelu => {
            let cdf = mul(
                lit(0.5, d),
                add(
                    one(),
                    un(Erf, mul(x.clone(), lit(std::f64::consts::FRAC_1_SQRT_2, d))),
                ),
            );
            let pdf = mul(
                lit(
                    0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2,
                    d,
                ),
                un(Exp, mul(lit(-0.5, d), mul(x.clone(), x.clone()))),
            );
            mul(a, add(cdf, mul(x, pdf)))
        }
        Erf => mul(
            a,
            mul(
                lit(std::f64::consts::FRAC_2_SQRT_PI, d),
                un(Exp, un(Neg, mul(x.clone(), x))),
            ),
        ),
        IsNan | IsInf | IsFinite | LogicalNot | BitNot => return None,
    })
}

/// The gradients of `x` and `z` through `y = op(x, z)`, given `y`'s gradient `a`.
fn binary(op: BinaryOp, x: &Expr, z: &Expr, y: &Expr, a: Expr) -> (Option<Expr>, Option<Expr>) {
    use BinaryOp::*;
    let d = y.dtype;
    let (x, z, y) = (x.clone(), z.clone(), y.clone());
    let zero = || lit(0.0, d);
    match op {
        Add | AddSat => (Some(a.clone()), Some(a)),
        Sub | SubSat => (Some(a.clone()), Some(un(UnaryOp::Neg, a))),
        Mul | MulSat => (Some(mul(a.clone(), z)), Some(mul(a, x))),
        Div | DivSat => {
            let gz = un(
                UnaryOp::Neg,
                div(mul(a.clone(), x), mul(z.clone(), z.clone())),
            );
            (Some(div(a, z)), Some(gz))
        }
        Pow => {
            // PyTorch's pow_backward: 0 where the exponent is 0 (self), and where the base
            // is 0 with a non-negative exponent (exponent).
            let gx = select(
                bin(Eq, z.clone(), zero()),
                zero(),
                mul(
                    a.clone(),
                    mul(z.clone(), bin(Pow, x.clone(), sub(z.clone(), lit(1.0, d)))),
                ),
            );
            let base_zero = bin(Eq, x.clone(), zero());
            let exp_nonneg = bin(Ge, z, zero());
            let gz = select(
                bin(LogicalAnd, base_zero, exp_nonneg),
                zero(),
                mul(a, mul(y, un(UnaryOp::Log, x))),
            );
            (Some(gx), Some(gz))
        }
        Max | Min => {
            // A tie splits the gradient in half; otherwise it goes to the larger (smaller).
            let (loses_x, loses_z) = match op {
                Max => (Lt, Gt),
                _ => (Gt, Lt),
            };
            let tie = bin(Eq, x.clone(), z.clone());
            let half = mul(a.clone(), lit(0.5, d));
            let gx = select(
                tie.clone(),
                half.clone(),
                select(bin(loses_x, x.clone(), z.clone()), zero(), a.clone()),
            );
            let gz = select(tie, half, select(bin(loses_z, x, z), zero(), a));
            (Some(gx), Some(gz))
        }
        Atan2 => {
            let denom = add(mul(x.clone(), x.clone()), mul(z.clone(), z.clone()));
            let gx = div(mul(a.clone(), z), denom.clone());
            let gz = div(mul(a, un(UnaryOp::Neg, x)), denom);
            (Some(gx), Some(gz))
        }
        Rem => {
            let gz = un(UnaryOp::Neg, mul(a.clone(), bin(FloorDiv, x, z)));
            (Some(a), Some(gz))
        }
        FloorDiv => (Some(zero()), Some(zero())),
        BitAnd | BitOr | BitXor | Shl | Shr | LogicalAnd | LogicalOr | LogicalXor | Eq | Ne
        | Lt | Le | Gt | Ge => (None, None),
    }
}

/// The constant `v` in dtype `d`.
fn lit(v: f64, d: DType) -> Expr {
    Expr::literal(Scalar::F64(v).cast(d, false))
}

fn un(op: UnaryOp, x: Expr) -> Expr {
    Expr::unary(op, x)
}

fn bin(op: BinaryOp, x: Expr, z: Expr) -> Expr {
    Expr::binary(op, x, z)
}

fn add(x: Expr, z: Expr) -> Expr {
    bin(BinaryOp::Add, x, z)
}

fn sub(x: Expr, z: Expr) -> Expr {
    bin(BinaryOp::Sub, x, z)
}

fn mul(x: Expr, z: Expr) -> Expr {
    bin(BinaryOp::Mul, x, z)
}

fn div(x: Expr, z: Expr) -> Expr {
    bin(BinaryOp::Div, x, z)
}

fn select(c: Expr, x: Expr, z: Expr) -> Expr {
    Expr::select(c, x, z)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x(k: usize) -> Expr {
        Expr::input(k, DType::F32)
    }

    #[test]
    fn a_product_gives_each_factor_the_other() {
        let e = mul(x(0), x(1));
        let g = vjp(&e, &[true, true]);
        // Inputs shift by one: the gradient is input 0.
        assert_eq!(g[0], Some(mul(x(0), x(2))));
        assert_eq!(g[1], Some(mul(x(0), x(1))));
    }

    #[test]
    fn an_input_read_twice_sums_its_gradients() {
        let e = mul(x(0), x(0));
        let g = vjp(&e, &[true]);
        assert_eq!(g[0], Some(add(mul(x(0), x(1)), mul(x(0), x(1)))));
    }

    #[test]
    fn unwanted_and_integer_inputs_get_none() {
        let i = Expr::input(1, DType::I32).cast(DType::F32, false);
        let e = add(x(0), i);
        let g = vjp(&e, &[false, true]);
        assert_eq!(g, vec![None, None]);
        let cmp = bin(BinaryOp::Lt, x(0), x(1));
        assert_eq!(vjp(&cmp, &[true, true]), vec![None, None]);
    }

    #[test]
    fn a_cast_between_floats_converts_the_gradient_back() {
        let h = Expr::input(0, DType::F16).cast(DType::F32, false);
        let e = un(UnaryOp::Exp, h);
        let g = vjp(&e, &[true]);
        assert_eq!(g[0].as_ref().unwrap().dtype, DType::F16);
    }
}
