//! The map interpreter: one kernel, compiled once per device, that evaluates a map's tree from
//! a list of instructions in its arguments. A map's first launch runs here instead of waiting
//! for NVRTC (35–75 ms for a new kernel on the GPU hosts, see BENCHMARKS.md); its own kernel is
//! compiled from its second launch on. Each instruction's operation is the C that `expr.rs` emits
//! for that op in f32, so an interpreted launch computes the same bits as the compiled kernel.
//!
//! Interpreted: maps whose operands are f32, f16 or bf16, contiguous or strided (broadcast
//! inputs, strided outputs; one offset decoded per strided operand and element), with one
//! output or several (a kept intermediate is a further output), whose nodes are inputs, launch
//! scalars and literals of those dtypes, casts between them, and the ops of [`OPS`]. Every
//! register holds an f32; an op of f16 or bf16 values is what the compiled kernel computes:
//! the f32 op, then its result rounded to the dtype (an instruction's rounding bits, see
//! [`instruction_op`]). Comparisons and the float predicates hold their bool as 0 or 1.
//! Anything else compiles at once.

use super::expr;
use super::{Generated, Optimization, Rendered};
use strata_core::ir::{BinaryOp, UnaryOp};
use strata_core::kernel_cache::Owned;
use strata_core::lower::program::{Op, ValueId};
use strata_core::{DType, Result};

/// Registers of one evaluation: inputs, then constants (launch scalars and literals), then
/// one per operation.
pub(crate) const REGISTERS: usize = 32;
/// The interpreter's argument words (`Args<WORDS>`): a program must fit them.
pub(crate) const WORDS: usize = 256;

/// An interpreted operation: its code is its index in [`OPS`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Opcode {
    Unary(UnaryOp),
    Binary(BinaryOp),
    Fma,
    Where,
    /// A cast between float dtypes: rounds to its precision (none for f32).
    Cast,
}

/// The dtypes the interpreter computes in, each held in an f32 register: an operation's
/// precision is its operands' dtype (a cast's: its result's).
pub(crate) const PRECISIONS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Whether the compiled kernel rounds the result of `op` in `precision` to that dtype: every
/// float result of an f16 or bf16 op, not a bool (a comparison, a predicate) nor `where`'s
/// choice of one of its operands.
fn rounds(op: Opcode, precision: DType) -> bool {
    precision != DType::F32
        && match op {
            Opcode::Unary(u) => !matches!(u, UnaryOp::IsNan | UnaryOp::IsInf | UnaryOp::IsFinite),
            Opcode::Binary(b) => !is_comparison(b),
            Opcode::Fma | Opcode::Cast => true,
            Opcode::Where => false,
        }
}

/// The low bits of an instruction computing `op` in `precision`: its code, and from bit 40 the
/// rounding of its result (0: none, 1: to f16, 2: to bf16).
pub(crate) fn instruction_op(op: Opcode, precision: DType) -> Option<u64> {
    let code = OPS.iter().position(|o| *o == op)? as u64;
    let rounding = match precision {
        _ if !rounds(op, precision) => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        _ => return None,
    };
    Some(code | rounding << 40)
}

/// Every operation the interpreter knows, in opcode order.
pub(crate) const OPS: &[Opcode] = {
    use BinaryOp::*;
    use UnaryOp::*;
    &[
        Opcode::Unary(Neg),
        Opcode::Unary(NegSat),
        Opcode::Unary(Abs),
        Opcode::Unary(Sign),
        Opcode::Unary(Square),
        Opcode::Unary(Sqrt),
        Opcode::Unary(Rsqrt),
        Opcode::Unary(Reciprocal),
        Opcode::Unary(Exp),
        Opcode::Unary(Exp2),
        Opcode::Unary(Expm1),
        Opcode::Unary(Log),
        Opcode::Unary(Log2),
        Opcode::Unary(Log10),
        Opcode::Unary(Log1p),
        Opcode::Unary(Sin),
        Opcode::Unary(Cos),
        Opcode::Unary(Tan),
        Opcode::Unary(Tanh),
        Opcode::Unary(Sigmoid),
        Opcode::Unary(Relu),
        Opcode::Unary(Gelu),
        Opcode::Unary(Erf),
        Opcode::Unary(Floor),
        Opcode::Unary(Ceil),
        Opcode::Unary(Round),
        Opcode::Unary(Trunc),
        Opcode::Unary(IsNan),
        Opcode::Unary(IsInf),
        Opcode::Unary(IsFinite),
        Opcode::Binary(Add),
        Opcode::Binary(Sub),
        Opcode::Binary(Mul),
        Opcode::Binary(Div),
        Opcode::Binary(AddSat),
        Opcode::Binary(SubSat),
        Opcode::Binary(MulSat),
        Opcode::Binary(DivSat),
        Opcode::Binary(Pow),
        Opcode::Binary(Max),
        Opcode::Binary(Min),
        Opcode::Binary(Eq),
        Opcode::Binary(Ne),
        Opcode::Binary(Lt),
        Opcode::Binary(Le),
        Opcode::Binary(Gt),
        Opcode::Binary(Ge),
        Opcode::Fma,
        Opcode::Where,
        Opcode::Cast,
    ]
};

/// The interpreter kernel's signature: there is one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct InterpretSig;

impl Owned for InterpretSig {}

impl Generated for InterpretSig {
    const NAME: &'static str = "strata_interpret";
    fn render(&self) -> Result<Rendered> {
        source().map(Rendered::single)
    }
    /// Its compile is a first call's wait (145–200 ms fully optimized 275–350, on the
    /// development machine); it runs first launches only.
    fn optimization(&self) -> Optimization {
        Optimization::FastCompile
    }
}

/// The interpreter's CUDA C: a grid-stride loop over the elements, each loading its inputs
/// and constants into registers and running the instructions (`op | dst << 8 | a << 16 |
/// b << 24 | c << 32`; every thread runs the same ones, so the switch never diverges).
pub(crate) fn source() -> Result<String> {
    let mut cases = String::new();
    for (code, &op) in OPS.iter().enumerate() {
        let (value, bool_valued) = f32_value(op)?;
        let value = if bool_valued {
            format!("({value}) ? 1.0f : 0.0f")
        } else {
            value
        };
        cases.push_str(&format!("        case {code}: v = {value}; break;\n"));
    }
    // Arguments: n, rank, shape; outputs, inputs; each operand's pointer, its form (bit 0:
    // contiguous; bits 8-9: stored as f32, f16 or bf16) and its strides (`rank` words); each
    // output's register; the constants (f32 bits); the instructions.
    Ok(format!(
        "__device__ __forceinline__ float interpret_load(const Args<{WORDS}>& p, int o, i64 at) {{
  const u64 kind = p.w[o + 1] >> 8;
  if (kind == 1) return f16_to_f32(((const u16*)p.w[o])[at]);
  if (kind == 2) return bf16_to_f32(((const u16*)p.w[o])[at]);
  return ((const float*)p.w[o])[at];
}}

__device__ __forceinline__ void interpret_store(const Args<{WORDS}>& p, int o, i64 at, float v) {{
  const u64 kind = p.w[o + 1] >> 8;
  if (kind == 1) ((u16*)p.w[o])[at] = f32_to_f16(v);
  else if (kind == 2) ((u16*)p.w[o])[at] = f32_to_bf16(v);
  else ((float*)p.w[o])[at] = v;
}}

__device__ __forceinline__ i64 interpret_offset(const Args<{WORDS}>& p, int o, int rank, i64 i) {{
  if (p.w[o + 1] & 1) return i;
  i64 offset = 0;
  for (int d = rank - 1; d >= 0; d--) {{
    const i64 extent = (i64)p.w[2 + d];
    const i64 c = i % extent;
    i /= extent;
    offset += c * (i64)p.w[o + 2 + d];
  }}
  return offset;
}}

extern \"C\" __global__ void strata_interpret(const Args<{WORDS}> p) {{
  const i64 n = (i64)p.w[0];
  const int rank = (int)p.w[1];
  const int outputs = (int)p.w[2 + rank], inputs = (int)p.w[3 + rank];
  const int first_operand = 4 + rank, per_operand = 2 + rank;
  const int results = first_operand + (outputs + inputs) * per_operand;
  const int constants = (int)p.w[results + outputs];
  const int first_constant = results + outputs + 1;
  const int count = (int)p.w[first_constant + constants];
  const int first = first_constant + constants + 1;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {{
    float r[{REGISTERS}];
    for (int k = 0; k < inputs; k++) {{
      const int o = first_operand + (outputs + k) * per_operand;
      r[k] = interpret_load(p, o, interpret_offset(p, o, rank, i));
    }}
    for (int k = 0; k < constants; k++) r[inputs + k] = __uint_as_float((u32)p.w[first_constant + k]);
    for (int t = 0; t < count; t++) {{
      const u64 w = p.w[first + t];
      const float a = r[(w >> 16) & {mask}], b = r[(w >> 24) & {mask}], c = r[(w >> 32) & {mask}];
      float v = 0.0f;
      switch ((int)(w & 255)) {{
{cases}      }}
      const int rounding = (int)(w >> 40) & 3;
      if (rounding == 1) v = round_f16(v);
      else if (rounding == 2) v = round_bf16(v);
      r[(w >> 8) & {mask}] = v;
    }}
    for (int k = 0; k < outputs; k++) {{
      const int o = first_operand + k * per_operand;
      interpret_store(p, o, interpret_offset(p, o, rank, i), r[p.w[results + k] & {mask}]);
    }}
  }}
}}
",
        mask = REGISTERS - 1
    ))
}

/// The C the compiled kernel computes `op` of f32 values with, and whether it is a bool.
fn f32_value(op: Opcode) -> Result<(String, bool)> {
    Ok(match op {
        Opcode::Unary(u) => (
            expr::unary(u, DType::F32, "a")?,
            matches!(u, UnaryOp::IsNan | UnaryOp::IsInf | UnaryOp::IsFinite),
        ),
        Opcode::Binary(b) => (expr::binary(b, DType::F32, "a", "b")?, is_comparison(b)),
        Opcode::Fma => (expr::fma(DType::F32, "a", "b", "c")?, false),
        Opcode::Where => ("((a != 0.0f) ? b : c)".to_string(), false),
        Opcode::Cast => (super::cast("a", DType::F32, DType::F32, false), false),
    })
}

fn is_comparison(op: BinaryOp) -> bool {
    use BinaryOp::*;
    matches!(op, Eq | Ne | Lt | Le | Gt | Ge)
}

/// The interpreted operation of `op`, whose result has dtype `d` and whose operand `a` has
/// dtype `arg(a)`, and its precision: operands of one dtype of [`PRECISIONS`] and a result of
/// it (a bool, kept as 0 or 1, for comparisons and float predicates); a cast between two of
/// them.
pub(crate) fn interpreted_op(
    op: &Op,
    d: DType,
    arg: impl Fn(ValueId) -> DType,
) -> Option<(Opcode, DType)> {
    let float = |t: DType| PRECISIONS.contains(&t);
    let (opcode, precision) = match op {
        Op::Unary(u, a) if float(arg(*a)) => (Opcode::Unary(*u), arg(*a)),
        Op::Binary(b, x, y) if float(arg(*x)) && arg(*x) == arg(*y) => {
            (Opcode::Binary(*b), arg(*x))
        }
        Op::Fma(a, b, c) if float(d) && [a, b, c].iter().all(|v| arg(**v) == d) => (Opcode::Fma, d),
        Op::Where(c, a, b)
            if arg(*c) == DType::Bool && float(d) && arg(*a) == d && arg(*b) == d =>
        {
            (Opcode::Where, d)
        }
        // A cast to its own dtype is no op (the compiled kernel's too).
        Op::Cast(a, _) if float(arg(*a)) && arg(*a) == d => (Opcode::Cast, DType::F32),
        Op::Cast(a, _) if float(arg(*a)) && float(d) => (Opcode::Cast, d),
        _ => return None,
    };
    let bool_valued = match opcode {
        Opcode::Unary(u) => matches!(u, UnaryOp::IsNan | UnaryOp::IsInf | UnaryOp::IsFinite),
        Opcode::Binary(b) => is_comparison(b),
        Opcode::Fma | Opcode::Where | Opcode::Cast => false,
    };
    let want = match opcode {
        _ if bool_valued => DType::Bool,
        // A cast's result is its own dtype (no rounding where it is the operand's).
        Opcode::Cast => d,
        _ => precision,
    };
    (d == want).then_some((opcode, precision))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparisons_feed_where_as_zero_or_one() {
        let src = source().unwrap();
        assert!(src.contains("v = ((a < b)) ? 1.0f : 0.0f;"), "{src}");
        assert!(src.contains("v = ((a != 0.0f) ? b : c);"));
    }

    /// The interpreter computes an f16 or bf16 op as the f32 op followed by the rounding its
    /// instruction carries: for every op that must be the compiled kernel's expression.
    #[test]
    fn half_precision_ops_are_the_f32_op_then_the_compiled_kernels_rounding() {
        for &op in OPS {
            let (f32_value, _) = f32_value(op).unwrap();
            for (p, round) in [(DType::F16, "round_f16"), (DType::BF16, "round_bf16")] {
                let compiled = match op {
                    Opcode::Unary(u) => expr::unary(u, p, "a").unwrap(),
                    Opcode::Binary(b) => expr::binary(b, p, "a", "b").unwrap(),
                    Opcode::Fma => expr::fma(p, "a", "b", "c").unwrap(),
                    Opcode::Where => "((a != 0.0f) ? b : c)".to_string(),
                    Opcode::Cast => super::super::cast("a", DType::F32, p, false),
                };
                let interpreted = if rounds(op, p) {
                    format!("{round}({f32_value})")
                } else {
                    f32_value.clone()
                };
                assert_eq!(interpreted, compiled, "{op:?} in {p:?}");
                let bits = instruction_op(op, p).unwrap();
                assert_eq!(
                    bits >> 40,
                    rounds(op, p) as u64 * (1 + (p == DType::BF16) as u64)
                );
            }
        }
        let src = source().unwrap();
        assert!(
            src.contains("if (rounding == 1) v = round_f16(v);"),
            "{src}"
        );
    }
}
