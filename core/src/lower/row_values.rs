//! The parts of a row's expression that hold one value a row (a layer norm's `s / n` and
//! `rsqrt(v / n + eps)`, which core's splicing writes into each element's tree): a kernel that
//! walks a row computes them once before its loop instead of at every element. The same
//! expression gives the same value wherever it is computed, so only where a driver contracts
//! a product into a sum across the cut can the bits move (wgpu's fused results already allow
//! for that).
//!
//! ```
//! use strata_core::ir::{BinaryOp, Expr};
//! use strata_core::lower::row_values::hoist;
//! use strata_core::DType;
//! // x0 − x1 / s0, where input 1 holds one value a row: `x1 / s0` becomes input 4.
//! let x = |k| Expr::input(k, DType::F32);
//! let mean = Expr::binary(BinaryOp::Div, x(1), Expr::scalar(0, DType::F32));
//! let (e, values) = hoist(&Expr::binary(BinaryOp::Sub, x(0), mean.clone()), &|k| k == 1, 4);
//! assert_eq!((e, values), (Expr::binary(BinaryOp::Sub, x(0), x(4)), vec![mean]));
//! ```

use crate::ir::{Expr, Node};

/// True when `e` reads only the inputs `row` picks (one value a row), scalars and literals.
pub fn one_a_row(e: &Expr, row: &dyn Fn(usize) -> bool) -> bool {
    match e.node {
        Node::Input(k) => row(k),
        Node::Scalar(_) | Node::Literal(_) => true,
        Node::LinearIndex | Node::Philox(_) => false,
        _ => e.children().all(|c| one_a_row(c, row)),
    }
}

/// `expr` with each largest subtree of one value a row that is not a leaf read as input
/// `first`, `first + 1`, … instead (equal subtrees as one input), and those subtrees in that
/// order.
pub fn hoist(expr: &Expr, row: &dyn Fn(usize) -> bool, first: usize) -> (Expr, Vec<Expr>) {
    fn replace(
        e: &Expr,
        row: &dyn Fn(usize) -> bool,
        first: usize,
        values: &mut Vec<Expr>,
    ) -> Expr {
        let leaf = matches!(e.node, Node::Input(_) | Node::Scalar(_) | Node::Literal(_));
        if !leaf && one_a_row(e, row) {
            let k = match values.iter().position(|v| v == e) {
                Some(k) => k,
                None => {
                    values.push(e.clone());
                    values.len() - 1
                }
            };
            return Expr::input(first + k, e.dtype);
        }
        e.map_children(|c| replace(c, row, first, values))
    }
    let mut values = Vec::new();
    let e = replace(expr, row, first, &mut values);
    (e, values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinaryOp, UnaryOp};
    use crate::DType;

    #[test]
    fn one_value_a_row_is_read_as_a_new_input_and_equal_subtrees_once() {
        // `(x − s/n) · rsqrt(v/n + eps) · (x − s/n)`, x input 0, s and v inputs 1 and 2.
        let x = |k| Expr::input(k, DType::F32);
        let mean = Expr::binary(BinaryOp::Div, x(1), Expr::scalar(0, DType::F32));
        let centred = Expr::binary(BinaryOp::Sub, x(0), mean.clone());
        let var = Expr::binary(BinaryOp::Div, x(2), Expr::scalar(0, DType::F32));
        let eps = Expr::binary(BinaryOp::Add, var, Expr::scalar(1, DType::F32));
        let scale = Expr::unary(UnaryOp::Rsqrt, eps.clone());
        let e = Expr::binary(
            BinaryOp::Mul,
            Expr::binary(BinaryOp::Mul, centred.clone(), scale.clone()),
            centred,
        );
        let (hoisted, values) = hoist(&e, &|k| k > 0, 5);
        assert_eq!(values, vec![mean, scale]);
        let centred = Expr::binary(BinaryOp::Sub, x(0), x(5));
        let want = Expr::binary(
            BinaryOp::Mul,
            Expr::binary(BinaryOp::Mul, centred.clone(), x(6)),
            centred,
        );
        assert_eq!(hoisted, want);
        // A leaf stays as it is; a tree of the element's own input is not a row's value.
        assert!(hoist(&x(1), &|k| k > 0, 5).1.is_empty());
        assert!(hoist(&Expr::unary(UnaryOp::Exp, x(0)), &|k| k > 0, 5)
            .1
            .is_empty());
    }
}
