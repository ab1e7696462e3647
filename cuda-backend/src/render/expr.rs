//! A `Map` expression tree as CUDA C statements. Inputs arrive as compute values `x{k}`,
//! scalars as `s{k}`, the output's row-major position as `li`; every node becomes one
//! `const` local, so a fused tree is straight-line code the compiler schedules freely.

use super::{cast, compute_type, round_to, undefined};
use std::fmt::Write;
use strata_core::ir::{BinaryOp, Expr, Node, UnaryOp};
use strata_core::lower::{output_locals, NodeLocals};
use strata_core::{DType, Result};

/// Emits statements computing `expr` into `out` (indented by `indent`); returns the name of
/// the local holding the value.
pub(crate) fn emit(
    expr: &Expr,
    out: &mut String,
    indent: &str,
    next: &mut usize,
) -> Result<String> {
    emit_noting(expr, out, indent, next, &mut Vec::new())
}

/// Emits the trees of a multi-output map (see [`output_locals`]); returns the locals, one
/// per tree.
pub(crate) fn emit_outputs(
    trees: &[Expr],
    out: &mut String,
    indent: &str,
    next: &mut usize,
) -> Result<Vec<String>> {
    output_locals(trees, |e, names| emit_noting(e, out, indent, next, names))
}

/// [`emit`], noting each named node's local in `names` (an input or a scalar is read by
/// name and not noted).
fn emit_noting<'e>(
    expr: &'e Expr,
    out: &mut String,
    indent: &str,
    next: &mut usize,
    names: &mut NodeLocals<'e>,
) -> Result<String> {
    let value = match &expr.node {
        Node::Input(k) => return Ok(format!("x{k}")),
        Node::Scalar(k) => return Ok(format!("s{k}")),
        Node::Literal(bits) => super::scalar_from_word(expr.dtype, &format!("{bits}ull")),
        Node::LinearIndex => "((i64)li)".to_string(),
        Node::Philox(w) if w.per_counter <= 1 => format!(
            "philox((u64)s{}, (u64)s{} + (u64)li, {})",
            w.key, w.counter, w.word
        ),
        // Neighbours share a counter; shifts and masks, as per_counter is a power of two.
        // (Vectorized maps call Philox once per counter before their lanes: codegen/map.rs.)
        Node::Philox(w) => {
            let (shift, mask) = (w.per_counter.trailing_zeros(), w.per_counter - 1);
            format!(
                "philox((u64)s{}, (u64)s{} + upos(li >> {shift}), \
                 (int)((li & {mask}) / {}) * {} + {})",
                w.key,
                w.counter,
                w.shared,
                w.group_width(),
                w.word
            )
        }
        Node::Cast { arg, saturate } => {
            let a = emit_noting(arg, out, indent, next, names)?;
            cast(&a, arg.dtype, expr.dtype, *saturate)
        }
        Node::Unary(op, arg) => {
            let a = emit_noting(arg, out, indent, next, names)?;
            unary(*op, arg.dtype, &a)?
        }
        Node::Binary(op, l, r) => {
            let a = emit_noting(l, out, indent, next, names)?;
            let b = emit_noting(r, out, indent, next, names)?;
            binary(*op, l.dtype, &a, &b)?
        }
        Node::Fma(a, b, c) => {
            let (x, y, z) = (
                emit_noting(a, out, indent, next, names)?,
                emit_noting(b, out, indent, next, names)?,
                emit_noting(c, out, indent, next, names)?,
            );
            fma(a.dtype, &x, &y, &z)?
        }
        Node::Where(c, a, b) => {
            let cond = emit_noting(c, out, indent, next, names)?;
            let (x, y) = (
                emit_noting(a, out, indent, next, names)?,
                emit_noting(b, out, indent, next, names)?,
            );
            format!("(({cond} != 0) ? {x} : {y})")
        }
    };
    let name = format!("v{}", *next);
    *next += 1;
    let _ = writeln!(
        out,
        "{indent}const {} {name} = {value};",
        compute_type(expr.dtype)
    );
    names.push((expr, name.clone()));
    Ok(name)
}

/// The C function name for a float math function in f32 (`sinf`) or f64 (`sin`).
fn math(d: DType, name: &str) -> String {
    if d == DType::F64 {
        name.to_string()
    } else {
        format!("{name}f")
    }
}

pub(crate) fn binary(op: BinaryOp, d: DType, a: &str, b: &str) -> Result<String> {
    use BinaryOp::*;
    let cmp = |o: &str| format!("({a} {o} {b})");
    match op {
        Eq => return Ok(cmp("==")),
        Ne => return Ok(cmp("!=")),
        Lt => return Ok(cmp("<")),
        Le => return Ok(cmp("<=")),
        Gt => return Ok(cmp(">")),
        Ge => return Ok(cmp(">=")),
        LogicalAnd => return Ok(format!("(({a} != 0) && ({b} != 0))")),
        LogicalOr => return Ok(format!("(({a} != 0) || ({b} != 0))")),
        LogicalXor => return Ok(format!("(({a} != 0) != ({b} != 0))")),
        _ => {}
    }
    let t = compute_type(d);
    if d == DType::Bool {
        return match op {
            BitAnd => Ok(format!("(bool)({a} & {b})")),
            BitOr => Ok(format!("(bool)({a} | {b})")),
            BitXor => Ok(format!("(bool)({a} ^ {b})")),
            _ => Err(undefined(op, d)),
        };
    }
    if d.is_float() {
        let v = match op {
            Add | AddSat => format!("({a} + {b})"),
            Sub | SubSat => format!("({a} - {b})"),
            Mul | MulSat => format!("({a} * {b})"),
            Div | DivSat => format!("({a} / {b})"),
            FloorDiv => format!("f_floordiv({a}, {b})"),
            Rem => format!("f_rem({a}, {b})"),
            Pow => format!("{}({a}, {b})", math(d, "pow")),
            Max => format!("f_max({a}, {b})"),
            Min => format!("f_min({a}, {b})"),
            Atan2 => format!("{}({a}, {b})", math(d, "atan2")),
            _ => return Err(undefined(op, d)),
        };
        return Ok(round_to(d, v));
    }
    let f = match op {
        Add => "w_add",
        Sub => "w_sub",
        Mul => "w_mul",
        AddSat => "s_add",
        SubSat => "s_sub",
        MulSat => "s_mul",
        DivSat => "s_div",
        FloorDiv => "i_floordiv",
        Rem => "i_rem",
        Pow => "i_pow",
        Shl => "i_shl",
        Shr => "i_shr",
        Max => return Ok(format!("({a} > {b} ? {a} : {b})")),
        Min => return Ok(format!("({a} < {b} ? {a} : {b})")),
        BitAnd => return Ok(format!("({t})({a} & {b})")),
        BitOr => return Ok(format!("({t})({a} | {b})")),
        BitXor => return Ok(format!("({t})({a} ^ {b})")),
        _ => return Err(undefined(op, d)),
    };
    Ok(format!("{f}<{t}>({a}, {b})"))
}

pub(crate) fn unary(op: UnaryOp, d: DType, a: &str) -> Result<String> {
    use UnaryOp::*;
    if d == DType::Bool {
        return match op {
            LogicalNot => Ok(format!("(!{a})")),
            _ => Err(undefined(op, d)),
        };
    }
    let t = compute_type(d);
    if !d.is_float() {
        return Ok(match op {
            Neg => format!("w_neg<{t}>({a})"),
            NegSat => format!("s_neg<{t}>({a})"),
            Abs => format!("i_abs<{t}>({a})"),
            Sign => format!("i_sign<{t}>({a})"),
            Square => format!("w_mul<{t}>({a}, {a})"),
            BitNot => format!("({t})(~{a})"),
            LogicalNot => format!("({a} == 0)"),
            _ => return Err(undefined(op, d)),
        });
    }
    let one = if d == DType::F64 { "1.0" } else { "1.0f" };
    let m = |name: &str| format!("{}({a})", math(d, name));
    let v = match op {
        IsNan => return Ok(format!("({a} != {a})")),
        IsInf => return Ok(format!("f_isinf({a})")),
        IsFinite => return Ok(format!("({a} == {a} && !f_isinf({a}))")),
        LogicalNot => return Ok(format!("({a} == 0)")),
        Neg | NegSat => format!("(-{a})"),
        Abs => m("fabs"),
        Sign => format!("f_sign({a})"),
        Square => format!("({a} * {a})"),
        Sqrt => m("sqrt"),
        Rsqrt => format!("({one} / {})", m("sqrt")),
        Reciprocal => format!("({one} / {a})"),
        Exp => m("exp"),
        Exp2 => m("exp2"),
        Expm1 => m("expm1"),
        Log => m("log"),
        Log2 => m("log2"),
        Log10 => m("log10"),
        Log1p => m("log1p"),
        Sin => m("sin"),
        Cos => m("cos"),
        Tan => m("tan"),
        Tanh => m("tanh"),
        Sigmoid => format!("({one} / ({one} + {}(-{a})))", math(d, "exp")),
        Relu => format!("(({a} > 0 || {a} != {a}) ? {a} : ({t})0)"),
        // 0.5·x·erfc(−x/√2) equals 0.5·x·(1 + erf(x/√2)) without its cancellation for x ≪ 0.
        Gelu => format!(
            "(({t})0.5 * {a} * {}(-{a} * ({t})0.70710678118654752440))",
            math(d, "erfc")
        ),
        Erf => m("erf"),
        Floor => m("floor"),
        Ceil => m("ceil"),
        Round => m("rint"),
        Trunc => m("trunc"),
        BitNot => return Err(undefined(op, d)),
    };
    Ok(round_to(d, v))
}

pub(crate) fn fma(d: DType, a: &str, b: &str, c: &str) -> Result<String> {
    let t = compute_type(d);
    Ok(match d {
        DType::Bool => return Err(undefined("Fma", d)),
        DType::F64 => format!("fma({a}, {b}, {c})"),
        _ if d.is_float() => round_to(d, format!("fmaf({a}, {b}, {c})")),
        _ => format!("w_add<{t}>(w_mul<{t}>({a}, {b}), {c})"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_becomes_one_local_per_node() {
        let x = Expr::input(0, DType::F32);
        let e = Expr::unary(
            UnaryOp::Relu,
            Expr::binary(BinaryOp::Mul, x.clone(), Expr::scalar(0, DType::F32)),
        );
        let mut src = String::new();
        let v = emit(&e, &mut src, "", &mut 0).unwrap();
        assert_eq!(v, "v1");
        assert!(src.contains("const float v0 = (x0 * s0);"), "{src}");
        assert!(src.contains("const float v1 = ((v0 > 0 || v0 != v0) ? v0 : (float)0);"));
    }

    #[test]
    fn undefined_ops_are_errors() {
        let e = Expr::unary(UnaryOp::Sqrt, Expr::input(0, DType::I32));
        assert!(emit(&e, &mut String::new(), "", &mut 0).is_err());
    }
}
