//! The map interpreter: one kernel, compiled once per device, that evaluates a map's tree from
//! a list of instructions in its arguments. A map's first launch runs here instead of waiting
//! for NVRTC (35–75 ms for a new kernel on the GPU hosts, see BENCHMARKS.md); its own kernel is
//! compiled at its second launch. Each instruction's operation is the C that `expr.rs` emits
//! for that op in f32, so an interpreted launch computes the same bits as the compiled kernel.
//!
//! Interpreted: single-output maps whose operands are all f32 and contiguous, whose nodes are
//! inputs, f32 launch scalars and literals, and the ops of [`OPS`] (comparisons and the float
//! predicates hold their bool as 0 or 1 in a float register). Anything else compiles at once.

use super::expr;
use super::map::MapSig;
use crate::compile::Optimization;
use crate::launch::{Args, Launch, Program};
use strata_core::ir::{BinaryOp, Expr, Node, UnaryOp};
use strata_core::lower::cache::Owned;
use strata_core::lower::map_plan::Path;
use strata_core::{DType, Result};

/// Registers of one evaluation: inputs, then constants (launch scalars and literals), then
/// one per operation.
const REGISTERS: usize = 32;
/// The interpreter's argument words (`Args<WORDS>`): a program must fit them.
const WORDS: usize = 256;

/// An interpreted operation: its index in [`OPS`] is its opcode.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Unary(UnaryOp),
    Binary(BinaryOp),
    Fma,
    Where,
}

/// Every operation the interpreter knows, in opcode order.
const OPS: &[Op] = {
    use BinaryOp::*;
    use UnaryOp::*;
    &[
        Op::Unary(Neg),
        Op::Unary(NegSat),
        Op::Unary(Abs),
        Op::Unary(Sign),
        Op::Unary(Square),
        Op::Unary(Sqrt),
        Op::Unary(Rsqrt),
        Op::Unary(Reciprocal),
        Op::Unary(Exp),
        Op::Unary(Exp2),
        Op::Unary(Expm1),
        Op::Unary(Log),
        Op::Unary(Log2),
        Op::Unary(Log10),
        Op::Unary(Log1p),
        Op::Unary(Sin),
        Op::Unary(Cos),
        Op::Unary(Tan),
        Op::Unary(Tanh),
        Op::Unary(Sigmoid),
        Op::Unary(Relu),
        Op::Unary(Gelu),
        Op::Unary(Erf),
        Op::Unary(Floor),
        Op::Unary(Ceil),
        Op::Unary(Round),
        Op::Unary(Trunc),
        Op::Unary(IsNan),
        Op::Unary(IsInf),
        Op::Unary(IsFinite),
        Op::Binary(Add),
        Op::Binary(Sub),
        Op::Binary(Mul),
        Op::Binary(Div),
        Op::Binary(AddSat),
        Op::Binary(SubSat),
        Op::Binary(MulSat),
        Op::Binary(DivSat),
        Op::Binary(Pow),
        Op::Binary(Max),
        Op::Binary(Min),
        Op::Binary(Eq),
        Op::Binary(Ne),
        Op::Binary(Lt),
        Op::Binary(Le),
        Op::Binary(Gt),
        Op::Binary(Ge),
        Op::Fma,
        Op::Where,
    ]
};

/// The interpreter kernel's signature: there is one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct InterpretSig;

impl Owned for InterpretSig {}

impl Program for InterpretSig {
    const NAME: &'static str = "strata_interpret";
    fn source(&self) -> Result<String> {
        source()
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
    for (code, op) in OPS.iter().enumerate() {
        let (value, bool_valued) = match *op {
            Op::Unary(u) => (
                expr::unary(u, DType::F32, "a")?,
                matches!(u, UnaryOp::IsNan | UnaryOp::IsInf | UnaryOp::IsFinite),
            ),
            Op::Binary(b) => (expr::binary(b, DType::F32, "a", "b")?, is_comparison(b)),
            Op::Fma => (expr::fma(DType::F32, "a", "b", "c")?, false),
            Op::Where => ("((a != 0.0f) ? b : c)".to_string(), false),
        };
        let value = if bool_valued {
            format!("({value}) ? 1.0f : 0.0f")
        } else {
            value
        };
        cases.push_str(&format!("        case {code}: v = {value}; break;\n"));
    }
    Ok(format!(
        "extern \"C\" __global__ void strata_interpret(const Args<{WORDS}> p) {{
  const i64 n = (i64)p.w[0];
  float* out = (float*)p.w[1];
  const int inputs = (int)p.w[2];
  const int constants = (int)p.w[3 + inputs];
  const int first_constant = 4 + inputs;
  const int count = (int)p.w[first_constant + constants];
  const int first = first_constant + constants + 1;
  const int result = (int)p.w[first + count];
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {{
    float r[{REGISTERS}];
    for (int k = 0; k < inputs; k++) r[k] = ((const float*)p.w[3 + k])[i];
    for (int k = 0; k < constants; k++) r[inputs + k] = __uint_as_float((u32)p.w[first_constant + k]);
    for (int t = 0; t < count; t++) {{
      const u64 w = p.w[first + t];
      const float a = r[(w >> 16) & {mask}], b = r[(w >> 24) & {mask}], c = r[(w >> 32) & {mask}];
      float v = 0.0f;
      switch ((int)(w & 255)) {{
{cases}      }}
      r[(w >> 8) & {mask}] = v;
    }}
    out[i] = r[result];
  }}
}}
",
        mask = REGISTERS - 1
    ))
}

fn is_comparison(op: BinaryOp) -> bool {
    use BinaryOp::*;
    matches!(op, Eq | Ne | Lt | Le | Gt | Ge)
}

/// The interpreter's launch for the map `sig` planned as `plan` (whose argument words hold the
/// element count, the shape, the operands' addresses and the launch scalars' bits), or `None`
/// when the map is not one the interpreter runs.
pub(crate) fn launch(sig: &MapSig, plan: &Launch) -> Option<Launch> {
    if !sig.also.is_empty()
        || sig.dtypes.iter().any(|&d| d != DType::F32)
        || sig.paths.iter().any(|&p| p != Path::Contiguous)
        || sig.scalars.iter().any(|&d| d != DType::F32)
        || sig.expr.dtype != DType::F32
    {
        return None;
    }
    let words = &plan.args.0;
    let operands = sig.dtypes.len();
    let inputs = operands - 1;
    let first_operand = 1 + sig.rank;
    let addresses = words.get(first_operand..first_operand + operands)?;
    let scalar_bits = words.get(first_operand + operands..)?;
    let mut program = Encoder {
        inputs,
        constants: scalar_bits.iter().map(|&b| b as u32).collect(),
        code: Vec::new(),
    };
    let result = program.encode(&sig.expr)?;
    let registers = inputs + program.constants.len() + program.code.len();
    if registers > REGISTERS {
        return None;
    }
    let mut args = Args::new();
    args.push(words[0]);
    args.push(addresses[0]);
    args.push(inputs as u64);
    args.0.extend_from_slice(&addresses[1..]);
    args.push(program.constants.len() as u64);
    args.0.extend(program.constants.iter().map(|&c| c as u64));
    args.push(program.code.len() as u64);
    args.0.extend_from_slice(&program.code);
    args.push(result as u64);
    if args.0.len() > WORDS {
        return None;
    }
    args.0.resize(WORDS, 0);
    Some(Launch::linear(args, words[0] as usize))
}

/// Builds a program: registers `0..inputs` hold the inputs, then the constants, then one
/// register per instruction, in the order the instructions run.
struct Encoder {
    inputs: usize,
    /// f32 bits of the constant registers: the launch scalars first, then literals.
    constants: Vec<u32>,
    code: Vec<u64>,
}

impl Encoder {
    /// The register holding `e`'s value, after the instructions computing it; `None` for a
    /// node the interpreter does not run. Walks the tree with its own stack (fused trees can
    /// be deep).
    fn encode(&mut self, root: &Expr) -> Option<usize> {
        // (node, children visited); results of finished nodes on `values`.
        let mut stack: Vec<(&Expr, bool)> = vec![(root, false)];
        let mut values: Vec<usize> = Vec::new();
        let scalars = self.constants.len();
        while let Some((e, visited)) = stack.pop() {
            let children: Vec<&Expr> = match &e.node {
                Node::Unary(_, a) => vec![a],
                Node::Binary(_, a, b) => vec![a, b],
                Node::Fma(a, b, c) | Node::Where(a, b, c) => vec![a, b, c],
                _ => Vec::new(),
            };
            if !visited && !children.is_empty() {
                stack.push((e, true));
                stack.extend(children.iter().rev().map(|c| (*c, false)));
                continue;
            }
            let register = match &e.node {
                Node::Input(k) if *k < self.inputs && e.dtype == DType::F32 => *k,
                Node::Scalar(k) if *k < scalars && e.dtype == DType::F32 => self.inputs + k,
                Node::Literal(bits) if e.dtype == DType::F32 => {
                    self.constants.push(*bits as u32);
                    // Literals go after every launch scalar: make room by moving none (the
                    // launch scalars were pushed first), so the index is its position.
                    self.inputs + self.constants.len() - 1
                }
                node => {
                    let op = interpreted_op(node, e.dtype)?;
                    let args = values.split_off(values.len() - children.len());
                    let operand = |k: usize| args.get(k).copied().unwrap_or(0) as u64;
                    let code = OPS.iter().position(|o| *o == op)? as u64;
                    // Instructions' registers follow the constants, which are all known
                    // only at the end: number them after a fixed base, fixed up below.
                    let dst = TEMP_BASE + self.code.len();
                    self.code.push(
                        code | (dst as u64) << 8
                            | operand(0) << 16
                            | operand(1) << 24
                            | operand(2) << 32,
                    );
                    dst
                }
            };
            values.push(register);
        }
        let result = values.pop()?;
        // Temporaries were numbered from TEMP_BASE; place them after the constants.
        let base = self.inputs + self.constants.len();
        let fix = |r: u64| {
            if r >= TEMP_BASE as u64 {
                r - TEMP_BASE as u64 + base as u64
            } else {
                r
            }
        };
        if base + self.code.len() > REGISTERS {
            return None;
        }
        for w in &mut self.code {
            let op = *w & 255;
            let regs = [
                (*w >> 8) & 255,
                (*w >> 16) & 255,
                (*w >> 24) & 255,
                (*w >> 32) & 255,
            ];
            *w = op
                | fix(regs[0]) << 8
                | fix(regs[1]) << 16
                | fix(regs[2]) << 24
                | fix(regs[3]) << 32;
        }
        Some(fix(result as u64) as usize)
    }
}

/// Temporaries are numbered from here while a program is built (above any input or
/// constant register), then renumbered after the constants.
const TEMP_BASE: usize = 128;

/// The interpreted op of `node`, whose result has dtype `d`: f32 operands, an f32 result (or
/// a bool one for comparisons and float predicates, kept as 0 or 1).
fn interpreted_op(node: &Node, d: DType) -> Option<Op> {
    let f32 = |e: &Expr| e.dtype == DType::F32;
    let op = match node {
        Node::Unary(u, a) if f32(a) => Op::Unary(*u),
        Node::Binary(b, x, y) if f32(x) && f32(y) => Op::Binary(*b),
        Node::Fma(a, b, c) if f32(a) && f32(b) && f32(c) && d == DType::F32 => Op::Fma,
        Node::Where(c, a, b) if c.dtype == DType::Bool && f32(a) && f32(b) => Op::Where,
        _ => return None,
    };
    let bool_valued = match op {
        Op::Unary(u) => matches!(u, UnaryOp::IsNan | UnaryOp::IsInf | UnaryOp::IsFinite),
        Op::Binary(b) => is_comparison(b),
        Op::Fma | Op::Where => false,
    };
    let want = if bool_valued { DType::Bool } else { DType::F32 };
    (d == want).then_some(op)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(expr: Expr, inputs: usize, scalars: usize) -> MapSig<'static> {
        MapSig {
            expr: std::borrow::Cow::Owned(expr),
            also: std::borrow::Cow::Owned(Vec::new()),
            dtypes: vec![DType::F32; inputs + 1],
            paths: vec![Path::Contiguous; inputs + 1],
            scalars: vec![DType::F32; scalars],
            rank: 1,
            vector: 4,
            wide: false,
        }
    }

    fn planned(n: u64, operands: usize, scalars: &[f32]) -> Launch {
        let mut args = Args::new();
        args.push(n);
        args.push(n);
        for k in 0..operands {
            args.push(0x1000 * (k as u64 + 1));
        }
        for s in scalars {
            args.push(s.to_bits() as u64);
        }
        Launch::linear(args, n as usize)
    }

    /// Decodes instruction `t` of a launch: (opcode, dst, a, b, c).
    fn instruction(words: &[u64], t: usize) -> (usize, u64, u64, u64, u64) {
        let inputs = words[2] as usize;
        let constants = words[3 + inputs] as usize;
        let first = 4 + inputs + constants + 1;
        let w = words[first + t];
        (
            (w & 255) as usize,
            (w >> 8) & 255,
            (w >> 16) & 255,
            (w >> 24) & 255,
            (w >> 32) & 255,
        )
    }

    #[test]
    fn a_chain_becomes_instructions_after_inputs_and_constants() {
        // sqrt(exp(a*a + a) - a) * s0, then * 2 (a literal).
        let a = Expr::input(0, DType::F32);
        let e = Expr::binary(
            BinaryOp::Mul,
            Expr::binary(
                BinaryOp::Mul,
                Expr::unary(
                    UnaryOp::Sqrt,
                    Expr::binary(
                        BinaryOp::Sub,
                        Expr::unary(
                            UnaryOp::Exp,
                            Expr::binary(
                                BinaryOp::Add,
                                Expr::binary(BinaryOp::Mul, a.clone(), a.clone()),
                                a.clone(),
                            ),
                        ),
                        a,
                    ),
                ),
                Expr::scalar(0, DType::F32),
            ),
            Expr::literal(strata_core::Scalar::F32(2.0)),
        );
        let l = launch(&sig(e, 1, 1), &planned(1000, 2, &[0.5])).unwrap();
        let w = &l.args.0;
        assert_eq!(w.len(), WORDS);
        assert_eq!((w[0], w[1], w[2], w[3]), (1000, 0x1000, 1, 0x2000));
        // Constants: the scalar 0.5, then the literal 2.
        assert_eq!(
            (w[4], w[5], w[6]),
            (2, 0.5f32.to_bits() as u64, 2f32.to_bits() as u64)
        );
        assert_eq!(w[7], 7, "seven instructions");
        let code = |op: Op| OPS.iter().position(|o| *o == op).unwrap();
        // Registers: a = 0, 0.5 = 1, 2 = 2, temporaries from 3.
        assert_eq!(
            instruction(w, 0),
            (code(Op::Binary(BinaryOp::Mul)), 3, 0, 0, 0)
        );
        assert_eq!(
            instruction(w, 1),
            (code(Op::Binary(BinaryOp::Add)), 4, 3, 0, 0)
        );
        assert_eq!(instruction(w, 2).0, code(Op::Unary(UnaryOp::Exp)));
        assert_eq!(
            instruction(w, 5),
            (code(Op::Binary(BinaryOp::Mul)), 8, 7, 1, 0)
        );
        assert_eq!(
            instruction(w, 6),
            (code(Op::Binary(BinaryOp::Mul)), 9, 8, 2, 0)
        );
        assert_eq!(w[8 + 7], 9, "the result register");
    }

    #[test]
    fn maps_it_cannot_run_compile_instead() {
        let a = Expr::input(0, DType::F32);
        let plan = planned(10, 2, &[]);
        // A cast, an f16 operand, a strided operand, a position read, two outputs.
        let cast = Expr::input(0, DType::I32).cast(DType::F32, false);
        assert!(launch(&sig(cast, 1, 0), &plan).is_none());
        let mut half = sig(a.clone(), 1, 0);
        half.dtypes[1] = DType::F16;
        assert!(launch(&half, &plan).is_none());
        let mut strided = sig(a.clone(), 1, 0);
        strided.paths[1] = Path::Strided;
        assert!(launch(&strided, &plan).is_none());
        let position = Expr::linear_index().cast(DType::F32, false);
        assert!(launch(&sig(position, 0, 0), &planned(10, 1, &[])).is_none());
        let mut two = sig(Expr::unary(UnaryOp::Exp, a.clone()), 1, 0);
        two.also = std::borrow::Cow::Owned(vec![Expr::unary(UnaryOp::Exp, a)]);
        assert!(launch(&two, &plan).is_none());
    }

    #[test]
    fn more_values_than_registers_compile_instead() {
        let mut e = Expr::input(0, DType::F32);
        for _ in 0..REGISTERS {
            e = Expr::unary(UnaryOp::Exp, e);
        }
        assert!(launch(&sig(e, 1, 0), &planned(10, 2, &[])).is_none());
    }

    #[test]
    fn comparisons_feed_where_as_zero_or_one() {
        let a = Expr::input(0, DType::F32);
        let b = Expr::input(1, DType::F32);
        let e = Expr::select(Expr::binary(BinaryOp::Lt, a.clone(), b.clone()), a, b);
        assert!(launch(&sig(e, 2, 0), &planned(10, 3, &[])).is_some());
        let src = source().unwrap();
        assert!(src.contains("v = ((a < b)) ? 1.0f : 0.0f;"), "{src}");
        assert!(src.contains("v = ((a != 0.0f) ? b : c);"));
    }
}
