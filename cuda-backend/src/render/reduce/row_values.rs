//! The parts of a row's expression that hold one value a row (core's
//! [`row_values`](strata_core::lower::row_values)), declared once before the loop over the row.
//! The same expression gives the same bits wherever it is computed (NVRTC runs with
//! `--fmad=false`), so the kernel's values do not change.

use crate::render::{compute_type, from_storage};
use std::fmt::Write;
use strata_core::ir::Expr;
use strata_core::lower::operands::ReduceMap;
use strata_core::lower::row_values::hoist;
use strata_core::Result;

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
    fn row_values_are_declared_once_each() {
        let x = |k| Expr::input(k, DType::F32);
        let mean = Expr::binary(BinaryOp::Div, x(1), Expr::scalar(0, DType::F32));
        let eps = Expr::binary(BinaryOp::Add, x(2), Expr::scalar(1, DType::F32));
        let scale = Expr::unary(UnaryOp::Rsqrt, eps);
        let mut s = String::new();
        declare(&mut s, &[mean, scale], 5, "  ", &mut 0).unwrap();
        assert!(
            s.contains("const float x5 = ") && s.contains("const float x6 = "),
            "{s}"
        );
    }
}
