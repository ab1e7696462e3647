//! A map's program (core's linearized trees, [`Program`]) as CUDA C statements: one `const`
//! local `v{i}` per instruction, so a fused tree is straight-line code the compiler schedules
//! freely. Scalars are `s{k}` and an element's position `li`; what depends on where the
//! element is (an input of a lane, its position, a hoisted Philox word) the caller names.

use super::{bitcast, cast, compute_type, round_to, undefined};
use std::fmt::Write;
use strata_core::ir::{BinaryOp, Expr, UnaryOp};
use strata_core::lower::program::{Lanes, Op, Program};
use strata_core::{DType, Result};

/// How a renderer reads the leaves that depend on where the element is: its input `k` of
/// lane `l` (`Op::Input`), its position (`Op::Position`), a hoisted Philox word
/// (`Op::Word`, `Op::KnownWord`), each of the instruction's dtype. `None`: not one of those.
pub(crate) type Leaves<'a> = dyn Fn(&Op, DType) -> Option<String> + 'a;

/// Statements computing every value of `program` into `out` (indented by `indent`), value
/// `i` in the local `v{base + i}` (a kernel holding several programs numbers them apart);
/// returns each value's local. A sine and a cosine of one f32 or f64 value (Box–Muller's
/// pair) come from one `sincos` call: one range reduction instead of two, the same bits.
pub(crate) fn emit(
    program: &Program,
    out: &mut String,
    indent: &str,
    base: usize,
    leaves: &Leaves,
) -> Result<Vec<String>> {
    let local = |i: usize| format!("v{}", base + i);
    let pairs = sincos_pairs(program);
    for (i, instr) in program.instrs.iter().enumerate() {
        let d = instr.dtype;
        let t = compute_type(d);
        let v = |a: &usize| local(*a);
        let value = match &instr.op {
            Op::Scalar(k) => format!("s{k}"),
            Op::Literal(bits) => super::scalar_from_word(d, &format!("{bits}ull")),
            // Neighbours share a counter; shifts and masks, as per_counter is a power of two.
            Op::Philox(w) if w.per_counter <= 1 => format!(
                "philox((u64)s{}, (u64)s{} + (u64)li, {})",
                w.key, w.counter, w.word
            ),
            Op::Philox(w) => {
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
            Op::Cast(a, saturate) => cast(&v(a), program.instrs[*a].dtype, d, *saturate),
            Op::Bitcast(a) => bitcast(&v(a), program.instrs[*a].dtype, d),
            Op::Unary(op @ (UnaryOp::Sin | UnaryOp::Cos), a) => {
                match pairs.iter().find(|&&(s, c)| s == i || c == i) {
                    Some(&(s, c)) if i == s.min(c) => {
                        let f = if d == DType::F64 { "" } else { "f" };
                        let (vs, vc) = (local(s), local(c));
                        let _ = writeln!(
                            out,
                            "{indent}{t} {vs}, {vc}; sincos{f}({}, &{vs}, &{vc});",
                            v(a)
                        );
                        continue;
                    }
                    Some(_) => continue,
                    None => unary(*op, program.instrs[*a].dtype, &v(a))?,
                }
            }
            Op::Unary(op, a) => unary(*op, program.instrs[*a].dtype, &v(a))?,
            Op::Binary(op, a, b) => binary(*op, program.instrs[*a].dtype, &v(a), &v(b))?,
            Op::Fma(a, b, c) => fma(d, &v(a), &v(b), &v(c))?,
            Op::Where(c, a, b) => format!("(({} != 0) ? {} : {})", v(c), v(a), v(b)),
            leaf => leaves(leaf, d).ok_or_else(|| {
                strata_core::Error::Backend(format!(
                    "internal error: the CUDA renderer has no reading of {leaf:?} here"
                ))
            })?,
        };
        let _ = writeln!(out, "{indent}const {t} {} = {value};", local(i));
    }
    Ok((0..program.instrs.len()).map(local).collect())
}

/// The sine and cosine instructions (of f32 or f64) that take the same value: one
/// `sincos` computes both.
fn sincos_pairs(program: &Program) -> Vec<(usize, usize)> {
    let of = |op: UnaryOp| {
        program
            .instrs
            .iter()
            .enumerate()
            .filter(move |(_, i)| matches!(i.dtype, DType::F32 | DType::F64))
            .filter_map(move |(k, i)| match i.op {
                Op::Unary(o, a) if o == op => Some((k, a, i.dtype)),
                _ => None,
            })
    };
    of(UnaryOp::Sin)
        .filter_map(|(s, a, d)| {
            of(UnaryOp::Cos)
                .find(|&(_, b, e)| b == a && e == d)
                .map(|(c, _, _)| (s, c))
        })
        .collect()
}

/// Statements computing `expr` for one element whose input `k` is `x{k}` and position `li`
/// (reduction, softmax and index kernels: a tree read where the renderer has loaded its
/// inputs); returns the local of its value. `next` numbers the locals (`v{next}`..), so one
/// kernel may hold several trees.
pub(crate) fn emit_tree(
    expr: &Expr,
    out: &mut String,
    indent: &str,
    next: &mut usize,
) -> Result<String> {
    let program = Program::build(std::slice::from_ref(expr), Lanes::one());
    let leaves = |op: &Op, _: DType| match op {
        Op::Input { input, .. } => Some(format!("x{input}")),
        Op::Position { .. } => Some("((i64)li)".to_string()),
        _ => None,
    };
    let locals = emit(&program, out, indent, *next, &leaves)?;
    *next += program.instrs.len();
    Ok(locals[program.outputs[0][0]].clone())
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
        let v = emit_tree(&e, &mut src, "", &mut 0).unwrap();
        assert_eq!(v, "v3");
        assert!(src.contains("const float v0 = x0;"), "{src}");
        assert!(src.contains("const float v2 = (v0 * v1);"), "{src}");
        assert!(src.contains("const float v3 = ((v2 > 0 || v2 != v2) ? v2 : (float)0);"));
    }

    #[test]
    fn undefined_ops_are_errors() {
        let e = Expr::unary(UnaryOp::Sqrt, Expr::input(0, DType::I32));
        assert!(emit_tree(&e, &mut String::new(), "", &mut 0).is_err());
    }
}
