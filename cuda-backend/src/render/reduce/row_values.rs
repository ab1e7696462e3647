//! The parts of a row's expression that hold one value a row, computed once before the loop
//! over the row instead of at every element: a layer norm's `s / n` and `rsqrt(v / n + eps)`,
//! which core's splicing (`strata_core::fusion::splice`) writes into each element's tree. The
//! same expression gives the same bits wherever it is computed (NVRTC runs with
//! `--fmad=false`), so the kernel's values do not change.

use crate::render::{compute_type, from_storage};
use std::fmt::Write;
use strata_core::ir::{Expr, Node};
use strata_core::lower::operands::ReduceMap;
use strata_core::Result;

/// True when `e` reads only the inputs `row` picks (one value a row), scalars and literals.
fn one_a_row(e: &Expr, row: &dyn Fn(usize) -> bool) -> bool {
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
pub(super) fn hoist(expr: &Expr, row: &dyn Fn(usize) -> bool, first: usize) -> (Expr, Vec<Expr>) {
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

/// `const T x{first + i} = …;` (at `indent`) for each of `values`, their locals numbered from
/// `next` (the inputs they read declared before).
pub(super) fn declare(
    s: &mut String,
    values: &[Expr],
    first: usize,
    indent: &str,
    next: &mut usize,
) -> Result<()> {
    for (i, v) in values.iter().enumerate() {
        let name = crate::render::expr::emit_tree(v, s, indent, next)?;
        let _ = writeln!(
            s,
            "{indent}const {} x{} = {name};",
            compute_type(v.dtype),
            first + i
        );
    }
    Ok(())
}

/// `expr` (over a reduction map's inputs, or the epilogue's) with its values of one a row
/// declared first (at `indent`, locals numbered from `next`) and read as inputs past the
/// map's and its term's: the inputs `declared` picks are declared already (the prologue's
/// and the reduction's results), the other inputs of one value a row (`per_output`) are read
/// here where a value reads them.
pub(super) fn hoisted(
    s: &mut String,
    expr: &Expr,
    m: &ReduceMap,
    declared: &dyn Fn(usize) -> bool,
    (indent, next): (&str, &mut usize),
) -> Result<Expr> {
    let row = |k: usize| declared(k) || m.per_output.get(k) == Some(&true);
    let first = m.inputs.len() + 1;
    let (e, values) = hoist(expr, &row, first);
    for (k, &d) in m.inputs.iter().enumerate() {
        if m.per_output[k] && !declared(k) && values.iter().any(|v| v.reads_input(k)) {
            let at = from_storage(d, &format!("in{k}[ob]"));
            let _ = writeln!(s, "{indent}const {} x{k} = {at};", compute_type(d));
        }
    }
    declare(s, &values, first, indent, next)?;
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_core::ir::{BinaryOp, UnaryOp};
    use strata_core::DType;

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
        let mut s = String::new();
        declare(&mut s, &values, 5, "  ", &mut 0).unwrap();
        assert!(
            s.contains("const float x5 = ") && s.contains("const float x6 = "),
            "{s}"
        );
    }
}
