//! A map's program (core's linearized trees, [`Program`]) as WGSL statements: one `let` per
//! instruction, so a fused tree is straight-line code. Scalars are `s{k}` and an element's
//! position `li` (`u32`); what depends on where the element is (an input of a lane, its
//! position, a hoisted Philox word) the caller names.

use super::prelude::math_type;
use super::{bitcast, cast, compute_type, is_nan, literal, round_to, undefined, Caps};
use std::fmt::Write;
use strata_core::ir::{BinaryOp, Expr, UnaryOp};
use strata_core::lower::program::{Lanes, Op, Program};
use strata_core::{DType, Error, Result};

/// How a renderer reads the leaves that depend on where the element is: input `k` of lane
/// `l` (`Op::Input`), a hoisted Philox word (`Op::Word`, `Op::KnownWord`), each as a value of
/// the instruction's dtype, and a lane's position (`Op::Position`) as a `u32`. `None`: not one
/// of those.
pub(crate) type Leaves<'a> = dyn Fn(&Op, DType) -> Option<String> + 'a;

/// Statements computing every value of `program` into `out`, value `i` in the local
/// `v{base + i}` (a shader holding several programs numbers them apart); returns each
/// value's expression. f32 sines and cosines (and 16-bit floats', in f32) take both from one
/// `sincos_fast_f32` call per value, so a sine and a cosine of one angle (Box–Muller's pair)
/// make one call.
pub(crate) fn emit(
    program: &Program,
    out: &mut String,
    base: usize,
    caps: Caps,
    leaves: &Leaves,
) -> Result<Vec<String>> {
    let mut values: Vec<String> = Vec::with_capacity(program.instrs.len());
    // A position held as a `u32` (no 64-bit integers): only a cast reads it.
    let mut narrow = vec![false; program.instrs.len()];
    // The `sincos_fast_f32` of each value taken so far.
    let mut both: Vec<(usize, String)> = Vec::new();
    for (i, instr) in program.instrs.iter().enumerate() {
        let d = instr.dtype;
        let local = format!("v{}", base + i);
        let arg = |a: usize| -> Result<&str> {
            if narrow[a] {
                return Err(Error::Unsupported(
                    "the linear index is i64, which this adapter lacks (SHADER_INT64)".into(),
                ));
            }
            Ok(&values[a])
        };
        let value = match &instr.op {
            Op::Scalar(k) => format!("s{k}"),
            Op::Literal(bits) => literal_value(d, *bits, caps)?,
            Op::Position { .. } => {
                let position = leaves(&instr.op, d).ok_or_else(|| no_leaf(&instr.op))?;
                if !caps.int64 {
                    // Casting the position to a narrower type needs no 64-bit integers.
                    narrow[i] = true;
                    values.push(position);
                    continue;
                }
                format!("bitcast<i64>(u64({position}))")
            }
            Op::Philox(w) => {
                // The element's counter offset `q` and word, from its position `li` (u32).
                let per = w.per_counter.max(1) as u32;
                let q = if per == 1 {
                    "li".to_string()
                } else {
                    format!("(li / {per}u)")
                };
                let word = if per == 1 {
                    format!("{}u", w.word)
                } else {
                    format!(
                        "((li % {per}u) / {}u) * {}u + {}u",
                        w.shared,
                        w.group_width(),
                        w.word
                    )
                };
                let (k, c) = (w.key, w.counter);
                format!(
                    "philox(s{k}lo, s{k}hi, s{c}lo + {q}, s{c}hi + select(0u, 1u, s{c}lo + {q} < {q}), {word})"
                )
            }
            Op::Cast(a, saturate) if narrow[*a] => cast(&values[*a], DType::U32, d, *saturate),
            Op::Cast(a, saturate) => cast(arg(*a)?, program.instrs[*a].dtype, d, *saturate),
            Op::Bitcast(a) => bitcast(arg(*a)?, program.instrs[*a].dtype, d),
            Op::Unary(op @ (UnaryOp::Sin | UnaryOp::Cos), a)
                if compute_type(program.instrs[*a].dtype) == "f32" && caps.f64 =>
            {
                let pair = match both.iter().find(|(b, _)| b == a) {
                    Some((_, name)) => name.clone(),
                    None => {
                        let name = format!("{local}_sincos");
                        let _ = writeln!(
                            out,
                            "  let {name}: vec2<f32> = sincos_fast_f32({});",
                            arg(*a)?
                        );
                        both.push((*a, name.clone()));
                        name
                    }
                };
                let half = if *op == UnaryOp::Sin { "x" } else { "y" };
                round_to(program.instrs[*a].dtype, format!("{pair}.{half}"))
            }
            Op::Unary(op, a) => unary(*op, program.instrs[*a].dtype, arg(*a)?, caps)?,
            Op::Binary(op, a, b) => {
                binary(*op, program.instrs[*a].dtype, arg(*a)?, arg(*b)?, caps)?
            }
            Op::Fma(a, b, c) => fma(d, arg(*a)?, arg(*b)?, arg(*c)?, caps)?,
            Op::Where(c, a, b) => {
                let cond = truthy(program.instrs[*c].dtype, arg(*c)?);
                format!("select({}, {}, {cond})", arg(*b)?, arg(*a)?)
            }
            leaf => leaves(leaf, d).ok_or_else(|| no_leaf(leaf))?,
        };
        let _ = writeln!(out, "  let {local}: {} = {value};", compute_type(d));
        values.push(local);
    }
    Ok(values)
}

/// The error of a leaf the renderer does not read here.
fn no_leaf(op: &Op) -> Error {
    Error::Backend(format!(
        "internal error: the WGSL renderer has no reading of {op:?} here"
    ))
}

/// Statements computing `expr` for one element whose input `k` is `x{k}` and position `li`
/// (a reduction's fused map); returns the local of its value. `next` numbers the locals, so
/// one shader may hold several trees.
pub(crate) fn emit_tree(
    expr: &Expr,
    out: &mut String,
    next: &mut usize,
    caps: Caps,
) -> Result<String> {
    let program = Program::build(std::slice::from_ref(expr), Lanes::one());
    let leaves = |op: &Op, _: DType| match op {
        Op::Input { input, .. } => Some(format!("x{input}")),
        Op::Position { .. } => Some("li".to_string()),
        _ => None,
    };
    let values = emit(&program, out, *next, caps, &leaves)?;
    *next += program.instrs.len();
    Ok(values[program.outputs[0][0]].clone())
}

/// The compute value of a literal of dtype `d` whose bits are `bits`.
fn literal_value(d: DType, bits: u64, caps: Caps) -> Result<String> {
    if d.itemsize() == 8 && !caps.int64 {
        return Err(Error::Unsupported(format!(
            "a {d} constant needs 64-bit integers, which this adapter lacks (SHADER_INT64)"
        )));
    }
    let (lo, hi) = (
        format!("{}u", bits as u32),
        format!("{}u", (bits >> 32) as u32),
    );
    Ok(super::scalar_value(d, &lo, &hi))
}

/// `v != 0` for any dtype.
fn truthy(d: DType, v: &str) -> String {
    super::ne_zero(d, v)
}

/// A float math function `name_<t>` applied to `args` of dtype `d`, through the math type.
fn math(d: DType, caps: Caps, name: &str, args: &[&str]) -> String {
    let mt = math_type(caps);
    let ct = compute_type(d);
    let conv: Vec<String> = args
        .iter()
        .map(|a| {
            if ct == mt {
                a.to_string()
            } else {
                format!("{mt}({a})")
            }
        })
        .collect();
    let call = format!("{name}_{mt}({})", conv.join(", "));
    if ct == mt {
        call
    } else {
        format!("{ct}({call})")
    }
}

/// `b` read so that a compiler cannot tell it is `a`'s value: a select on a condition only
/// the running kernel knows (the `params` binding is never empty). NVIDIA's Vulkan driver
/// folds `x - x` to 0, which IEEE 754 makes NaN for ±inf and NaN (issue 44); an operation
/// whose two operands are one value (`x - x`, `x / x`, `x == x`) reads the second through
/// this. `STRATA_WGPU_FOLD_GUARD=0` renders them as written, to see what a driver folds.
fn unfoldable<'a>(a: &str, b: &'a str) -> std::borrow::Cow<'a, str> {
    static GUARD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let guard =
        *GUARD.get_or_init(|| std::env::var("STRATA_WGPU_FOLD_GUARD").as_deref() != Ok("0"));
    if guard && a == b {
        opaque(b).into()
    } else {
        b.into()
    }
}

/// `v` read through a condition only the running kernel knows (never true), so a compiler
/// cannot fold an operation on it with the value it came from (see [`unfoldable`]).
pub(crate) fn opaque(v: &str) -> String {
    format!("select({v}, -{v}, arrayLength(&params) == 0u)")
}

fn binary(op: BinaryOp, d: DType, a: &str, b: &str, caps: Caps) -> Result<String> {
    use BinaryOp::*;
    let b = &*if d.is_float() {
        unfoldable(a, b)
    } else {
        b.into()
    };
    let cmp_operands = |x: &str| {
        if d == DType::Bool {
            format!("select(0u, 1u, {x})")
        } else {
            x.to_string()
        }
    };
    let (ca, cb) = (cmp_operands(a), cmp_operands(b));
    match op {
        Eq => return Ok(format!("({a} == {b})")),
        // `!(a == b)`: true with NaN even where a driver compiles `!=` as an ordered compare.
        Ne => return Ok(format!("(!({a} == {b}))")),
        Lt => return Ok(format!("({ca} < {cb})")),
        Le => return Ok(format!("({ca} <= {cb})")),
        Gt => return Ok(format!("({ca} > {cb})")),
        Ge => return Ok(format!("({ca} >= {cb})")),
        LogicalAnd => return Ok(format!("({} && {})", truthy(d, a), truthy(d, b))),
        LogicalOr => return Ok(format!("({} || {})", truthy(d, a), truthy(d, b))),
        LogicalXor => return Ok(format!("({} != {})", truthy(d, a), truthy(d, b))),
        _ => {}
    }
    if d == DType::Bool {
        return match op {
            BitAnd => Ok(format!("({a} && {b})")),
            BitOr => Ok(format!("({a} || {b})")),
            BitXor => Ok(format!("({a} != {b})")),
            _ => Err(undefined(op, d)),
        };
    }
    if d.is_float() {
        let ct = compute_type(d);
        let v = match op {
            Add | AddSat => format!("({a} + {b})"),
            Sub | SubSat => format!("({a} - {b})"),
            Mul | MulSat => format!("({a} * {b})"),
            // Correctly rounded in f32 (see the prelude's div_f32).
            Div | DivSat if ct == "f32" => format!("div_f32({a}, {b})"),
            Div | DivSat => format!("({a} / {b})"),
            FloorDiv => format!("floordiv_{ct}({a}, {b})"),
            Rem => math(d, caps, "rem", &[a, b]),
            Pow => math(d, caps, "pow", &[a, b]),
            Max => format!("fmax_{ct}({a}, {b})"),
            Min => format!("fmin_{ct}({a}, {b})"),
            Atan2 => math(d, caps, "atan2", &[a, b]),
            _ => return Err(undefined(op, d)),
        };
        return Ok(round_to(d, v));
    }
    let nm = d.name();
    let helper = |f: &str| format!("{f}_{nm}({a}, {b})");
    Ok(match op {
        Add => super::wrap(d, &format!("({a} + {b})")),
        Sub => super::wrap(d, &format!("({a} - {b})")),
        Mul => super::wrap(d, &format!("({a} * {b})")),
        AddSat => helper("adds"),
        SubSat => helper("subs"),
        MulSat => helper("muls"),
        DivSat => helper("divs"),
        FloorDiv => helper("floordiv"),
        Rem => helper("rem"),
        Pow => helper("pow"),
        Shl => helper("shl"),
        Shr => helper("shr"),
        Max => format!("max({a}, {b})"),
        Min => format!("min({a}, {b})"),
        BitAnd => format!("({a} & {b})"),
        BitOr => format!("({a} | {b})"),
        BitXor => format!("({a} ^ {b})"),
        _ => return Err(undefined(op, d)),
    })
}

fn unary(op: UnaryOp, d: DType, a: &str, caps: Caps) -> Result<String> {
    use UnaryOp::*;
    if d == DType::Bool {
        return match op {
            LogicalNot => Ok(format!("(!{a})")),
            _ => Err(undefined(op, d)),
        };
    }
    let t = compute_type(d);
    let z = literal(d, 0);
    if !d.is_float() {
        let signed = t.starts_with('i');
        return Ok(match op {
            Neg => super::wrap(d, &format!("({z} - {a})")),
            NegSat => format!("negs_{}({a})", d.name()),
            Abs if signed => super::wrap(d, &format!("select({a}, -{a}, {a} < {z})")),
            Abs => a.to_string(),
            Sign if signed => format!(
                "select(select({z}, {}, {a} < {z}), {}, {a} > {z})",
                literal(d, -1),
                literal(d, 1)
            ),
            Sign => format!("select({z}, {}, {a} > {z})", literal(d, 1)),
            Square => super::wrap(d, &format!("({a} * {a})")),
            BitNot => super::wrap(d, &format!("(~{a})")),
            LogicalNot => format!("({a} == {z})"),
            _ => return Err(undefined(op, d)),
        });
    }
    let one = literal(d, 1);
    let m = |name: &str| math(d, caps, name, &[a]);
    let inf_bits = |v: &str| {
        if t == "f64" {
            format!(
                "((bitcast<u64>({v}) & 0x7fffffffffffffff{}) == 0x7ff0000000000000lu)",
                "lu"
            )
        } else {
            format!("((bitcast<u32>({v}) & 0x7fffffffu) == 0x7f800000u)")
        }
    };
    let v = match op {
        IsNan => return Ok(is_nan(d, a)),
        IsInf => return Ok(inf_bits(a)),
        IsFinite => return Ok(format!("(!{} && !{})", is_nan(d, a), inf_bits(a))),
        LogicalNot => return Ok(format!("(!{})", truthy(d, a))),
        Neg | NegSat => format!("(-{a})"),
        Abs => format!("abs({a})"),
        // NaN stays NaN; both zeros give +0 (PyTorch's `(0 < x) - (x < 0)`).
        Sign => format!(
            "select(select(select({a}, {z}, {a} == {z}), -{one}, {a} < {z}), {one}, {a} > {z})"
        ),
        Square => format!("({a} * {a})"),
        Sqrt if t == "f32" => format!("sqrt_f32({a})"),
        Sqrt => format!("sqrt({a})"),
        Rsqrt if t == "f32" => format!("div_f32({one}, sqrt_f32({a}))"),
        Rsqrt => format!("({one} / sqrt({a}))"),
        Reciprocal if t == "f32" => format!("div_f32({one}, {a})"),
        Reciprocal => format!("({one} / {a})"),
        // f32 (and 16-bit floats, computed in f32) in f32: see F32_FAST in prelude.rs.
        Exp if t == "f32" => format!("exp_fast_f32({a})"),
        Exp => m("exp"),
        Exp2 => via_math(d, caps, a, |x, mt| {
            format!("exp_{mt}({x} * {})", lit(mt, std::f64::consts::LN_2))
        }),
        Expm1 if t == "f32" => format!("expm1_fast_f32({a})"),
        Expm1 => m("expm1"),
        Log if t == "f32" => format!("log_fast_f32({a})"),
        Log => m("log"),
        Log2 => via_math(d, caps, a, |x, mt| {
            format!("(log_{mt}({x}) * {})", lit(mt, std::f64::consts::LOG2_E))
        }),
        Log10 => via_math(d, caps, a, |x, mt| {
            format!("(log_{mt}({x}) * {})", lit(mt, std::f64::consts::LOG10_E))
        }),
        Log1p if t == "f32" => format!("log1p_fast_f32({a})"),
        Log1p => m("log1p"),
        // (f32 and 16-bit floats where the adapter has f64: emit_noting, with F32_SINCOS.)
        Sin => via_math(d, caps, a, |x, mt| format!("sincos_{mt}({x}).x")),
        Cos => via_math(d, caps, a, |x, mt| format!("sincos_{mt}({x}).y")),
        Tan => via_math(d, caps, a, |x, mt| format!("tan_{mt}({x})")),
        Tanh if t == "f32" => format!("tanh_fast_f32({a})"),
        Tanh => m("tanh"),
        Sigmoid => via_math(d, caps, a, |x, mt| {
            format!("(1.0{s} / (1.0{s} + exp_{mt}(-{x})))", s = suffix(mt))
        }),
        Relu => format!("select({z}, {a}, {a} > {z} || {})", is_nan(d, a)),
        // 0.5·x·erfc(−x/√2) equals 0.5·x·(1 + erf(x/√2)) without its cancellation for x ≪ 0.
        Gelu if t == "f32" => format!("(0.5f * {a} * erfc_fast_f32(-{a} * 0.70710677f))"),
        Gelu => via_math(d, caps, a, |x, mt| {
            format!(
                "(0.5{s} * {x} * erfc_{mt}(-{x} * {}))",
                lit(mt, std::f64::consts::FRAC_1_SQRT_2),
                s = suffix(mt)
            )
        }),
        Erf if t == "f32" => format!("erf_fast_f32({a})"),
        Erf => m("erf"),
        Floor => format!("floor({a})"),
        Ceil => format!("ceil({a})"),
        Round if t == "f64" => format!("round_even_f64({a})"),
        Round => format!("round({a})"),
        Trunc => format!("trunc({a})"),
        BitNot => return Err(undefined(op, d)),
    };
    Ok(round_to(d, v))
}

/// `f(x, mt)` evaluated in the math type `mt` for the argument `a` of dtype `d`, converted back
/// to `d`'s compute type.
fn via_math(d: DType, caps: Caps, a: &str, f: impl Fn(&str, &str) -> String) -> String {
    let mt = math_type(caps);
    let ct = compute_type(d);
    if ct == mt {
        f(a, mt)
    } else {
        format!("{ct}({})", f(&format!("{mt}({a})"), mt))
    }
}

/// The literal suffix of float type `t`.
fn suffix(t: &str) -> &'static str {
    if t == "f64" {
        "lf"
    } else {
        "f"
    }
}

/// A float literal in WGSL type `t`.
fn lit(t: &str, v: f64) -> String {
    if t == "f64" {
        format!("{v:?}lf")
    } else {
        format!("{:?}f", v as f32)
    }
}

fn fma(d: DType, a: &str, b: &str, c: &str, caps: Caps) -> Result<String> {
    Ok(match d {
        DType::Bool => return Err(undefined("Fma", d)),
        // The f64 product of two f32 values is exact, so only the sum rounds (drivers may
        // split WGSL's `fma` into a multiply and an add).
        _ if compute_type(d) == "f32" && caps.f64 => {
            round_to(d, format!("f32(f64({a}) * f64({b}) + f64({c}))"))
        }
        _ if d.is_float() => round_to(d, format!("fma({a}, {b}, {c})")),
        _ => super::wrap(d, &format!("({a} * {b} + {c})")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_becomes_one_let_per_node() {
        let x = Expr::input(0, DType::F32);
        let e = Expr::unary(
            UnaryOp::Relu,
            Expr::binary(BinaryOp::Mul, x, Expr::scalar(0, DType::F32)),
        );
        let mut src = String::new();
        let v = emit_tree(&e, &mut src, &mut 0, Caps::default()).unwrap();
        assert_eq!(v, "v3");
        assert!(src.contains("let v0: f32 = x0;"), "{src}");
        assert!(src.contains("let v2: f32 = (v0 * v1);"), "{src}");
    }

    #[test]
    fn undefined_ops_are_errors() {
        let e = Expr::unary(UnaryOp::Sqrt, Expr::input(0, DType::I32));
        assert!(emit_tree(&e, &mut String::new(), &mut 0, Caps::default()).is_err());
    }
}
