//! The map interpreter: one kernel, compiled once per device, that evaluates a map's tree from
//! a list of instructions in its arguments. A map's first launch runs here instead of waiting
//! for NVRTC (35–75 ms for a new kernel on the GPU hosts, see BENCHMARKS.md); its own kernel is
//! compiled at its second launch. Each instruction's operation is the C that `expr.rs` emits
//! for that op in f32, so an interpreted launch computes the same bits as the compiled kernel.
//!
//! Interpreted: maps whose operands are all f32, contiguous or strided (broadcast inputs,
//! strided outputs; one offset decoded per strided operand and element), with one output or
//! several (a kept intermediate is a further output), whose nodes are inputs, f32 launch
//! scalars and literals, and the ops of [`OPS`] (comparisons and the float predicates hold
//! their bool as 0 or 1 in a float register). Anything else compiles at once.

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
    // Arguments: n, rank, shape; outputs, inputs; each operand's pointer, whether it is
    // contiguous, and its strides (`rank` words); each output's register; the constants;
    // the instructions.
    Ok(format!(
        "__device__ __forceinline__ i64 interpret_offset(const Args<{WORDS}>& p, int o, int rank, i64 i) {{
  if (p.w[o + 1]) return i;
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
      r[k] = ((const float*)p.w[o])[interpret_offset(p, o, rank, i)];
    }}
    for (int k = 0; k < constants; k++) r[inputs + k] = __uint_as_float((u32)p.w[first_constant + k]);
    for (int t = 0; t < count; t++) {{
      const u64 w = p.w[first + t];
      const float a = r[(w >> 16) & {mask}], b = r[(w >> 24) & {mask}], c = r[(w >> 32) & {mask}];
      float v = 0.0f;
      switch ((int)(w & 255)) {{
{cases}      }}
      r[(w >> 8) & {mask}] = v;
    }}
    for (int k = 0; k < outputs; k++) {{
      const int o = first_operand + k * per_operand;
      ((float*)p.w[o])[interpret_offset(p, o, rank, i)] = r[p.w[results + k] & {mask}];
    }}
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
/// element count, the shape, each operand's address and, if strided, its strides, then the
/// launch scalars' bits), or `None` when the map is not one the interpreter runs.
pub(crate) fn launch(sig: &MapSig, plan: &Launch) -> Option<Launch> {
    if sig.dtypes.iter().any(|&d| d != DType::F32)
        || sig
            .paths
            .iter()
            .any(|&p| p != Path::Contiguous && p != Path::Strided)
        || sig.scalars.iter().any(|&d| d != DType::F32)
    {
        return None;
    }
    let words = &plan.args.0;
    let rank = sig.rank;
    let outputs = 1 + sig.also.len();
    let inputs = sig.dtypes.len().checked_sub(outputs)?;
    let shape = words.get(1..1 + rank)?;
    // Each operand's words in the interpreter's form: pointer, contiguous, strides.
    let mut operands = Vec::new();
    let mut at = 1 + rank;
    for &path in sig.paths.iter() {
        operands.push(*words.get(at)?);
        at += 1;
        if path == Path::Contiguous {
            operands.push(1);
            operands.extend(std::iter::repeat_n(0, rank));
        } else {
            operands.push(0);
            operands.extend_from_slice(words.get(at..at + rank)?);
            at += rank;
        }
    }
    let mut program = Encoder {
        inputs,
        constants: words.get(at..)?.iter().map(|&b| b as u32).collect(),
        code: Vec::new(),
    };
    let trees: Vec<&Expr> = std::iter::once(sig.expr.as_ref())
        .chain(sig.also.iter())
        .collect();
    let results = program.encode(&trees)?;
    let mut args = Args::new();
    args.push(words[0]);
    args.push(rank as u64);
    args.0.extend_from_slice(shape);
    args.push(outputs as u64);
    args.push(inputs as u64);
    args.0.extend_from_slice(&operands);
    args.0.extend(results.iter().map(|&r| r as u64));
    args.push(program.constants.len() as u64);
    args.0.extend(program.constants.iter().map(|&c| c as u64));
    args.push(program.code.len() as u64);
    args.0.extend_from_slice(&program.code);
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
    /// The registers holding the values of `trees` (output 0's tree, then further outputs,
    /// which are subtrees of it), after the instructions computing them; `None` for a node
    /// the interpreter does not run or too many values. Walks the tree with its own stack
    /// (fused trees can be deep).
    fn encode(&mut self, trees: &[&Expr]) -> Option<Vec<usize>> {
        let root = *trees.first()?;
        // (node, children visited); results of finished nodes on `values`.
        let mut stack: Vec<(&Expr, bool)> = vec![(root, false)];
        let mut values: Vec<usize> = Vec::new();
        // Every computed node and its register, to find the further outputs.
        let mut computed: Vec<(&Expr, usize)> = Vec::new();
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
                    // After the launch scalars, which were the first constants.
                    self.constants.push(*bits as u32);
                    self.inputs + self.constants.len() - 1
                }
                node => {
                    let op = interpreted_op(node, e.dtype)?;
                    let args = values.split_off(values.len().checked_sub(children.len())?);
                    let operand = |k: usize| args.get(k).copied().unwrap_or(0) as u64;
                    let code = OPS.iter().position(|o| *o == op)? as u64;
                    // The constants are all known only at the end: number temporaries from a
                    // fixed base and move them after the constants below.
                    let dst = TEMP_BASE + self.code.len();
                    self.code.push(
                        code | (dst as u64) << 8
                            | operand(0) << 16
                            | operand(1) << 24
                            | operand(2) << 32,
                    );
                    computed.push((e, dst));
                    dst
                }
            };
            values.push(register);
        }
        let base = self.inputs + self.constants.len();
        if base + self.code.len() > REGISTERS {
            return None;
        }
        let fix = |r: u64| {
            if r >= TEMP_BASE as u64 {
                r - TEMP_BASE as u64 + base as u64
            } else {
                r
            }
        };
        for w in &mut self.code {
            let op = *w & 255;
            let regs = [8, 16, 24, 32].map(|shift| fix((*w >> shift) & 255));
            *w = op | regs[0] << 8 | regs[1] << 16 | regs[2] << 24 | regs[3] << 32;
        }
        let mut results = vec![fix(*values.last()? as u64) as usize];
        for tree in &trees[1..] {
            let register = match tree.node {
                Node::Input(k) if k < self.inputs => k,
                _ => computed.iter().find(|(e, _)| *e == *tree)?.1,
            };
            results.push(fix(register as u64) as usize);
        }
        Some(results)
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
            rank: 2,
            vector: 4,
            wide: false,
        }
    }

    /// A map plan's words for `sig`: n = 10 × 100, shape [10, 100], operand k at 0x1000·(k+1)
    /// (strided ones with strides [0, 1]), then the scalars.
    fn planned(sig: &MapSig, scalars: &[f32]) -> Launch {
        let mut args = Args::new();
        args.0.extend([1000, 10, 100]);
        for (k, path) in sig.paths.iter().enumerate() {
            args.push(0x1000 * (k as u64 + 1));
            if *path != Path::Contiguous {
                args.0.extend([0, 1]);
            }
        }
        for s in scalars {
            args.push(s.to_bits() as u64);
        }
        Launch::linear(args, 1000)
    }

    /// A decoded instruction: (opcode, dst, a, b, c).
    type Instruction = (usize, u64, u64, u64, u64);

    /// The interpreter's words after the operands: (results, constants, instructions).
    fn program(w: &[u64]) -> (Vec<u64>, Vec<u64>, Vec<Instruction>) {
        let rank = w[1] as usize;
        let (outputs, inputs) = (w[2 + rank] as usize, w[3 + rank] as usize);
        let results = 4 + rank + (outputs + inputs) * (2 + rank);
        let constants = w[results + outputs] as usize;
        let first_constant = results + outputs + 1;
        let count = w[first_constant + constants] as usize;
        let first = first_constant + constants + 1;
        let decode = |w: u64| {
            let r = |shift: u32| (w >> shift) & 255;
            ((w & 255) as usize, r(8), r(16), r(24), r(32))
        };
        (
            w[results..results + outputs].to_vec(),
            w[first_constant..first_constant + constants].to_vec(),
            w[first..first + count].iter().map(|&x| decode(x)).collect(),
        )
    }

    fn code(op: Op) -> usize {
        OPS.iter().position(|o| *o == op).unwrap()
    }

    #[test]
    fn a_chain_becomes_instructions_after_inputs_and_constants() {
        // sqrt(exp(a*a + a) - a) * s0, then * 2 (a literal).
        let a = Expr::input(0, DType::F32);
        let bin = |op, x, y| Expr::binary(op, x, y);
        let inner = bin(
            BinaryOp::Add,
            bin(BinaryOp::Mul, a.clone(), a.clone()),
            a.clone(),
        );
        let root = Expr::unary(
            UnaryOp::Sqrt,
            bin(BinaryOp::Sub, Expr::unary(UnaryOp::Exp, inner), a),
        );
        let e = bin(
            BinaryOp::Mul,
            bin(BinaryOp::Mul, root, Expr::scalar(0, DType::F32)),
            Expr::literal(strata_core::Scalar::F32(2.0)),
        );
        let s = sig(e, 1, 1);
        let l = launch(&s, &planned(&s, &[0.5])).unwrap();
        let w = &l.args.0;
        assert_eq!(w.len(), WORDS);
        // n, rank, shape, one output, one input; each operand contiguous.
        assert_eq!(w[..6], [1000, 2, 10, 100, 1, 1]);
        assert_eq!(w[6..10], [0x1000, 1, 0, 0]);
        assert_eq!(w[10..14], [0x2000, 1, 0, 0]);
        let (results, constants, code_) = program(w);
        // Registers: a = 0, 0.5 = 1, 2 = 2, temporaries from 3.
        assert_eq!(constants, [0.5f32.to_bits() as u64, 2f32.to_bits() as u64]);
        assert_eq!(code_.len(), 7);
        assert_eq!(code_[0], (code(Op::Binary(BinaryOp::Mul)), 3, 0, 0, 0));
        assert_eq!(code_[1], (code(Op::Binary(BinaryOp::Add)), 4, 3, 0, 0));
        assert_eq!(code_[2].0, code(Op::Unary(UnaryOp::Exp)));
        assert_eq!(code_[5], (code(Op::Binary(BinaryOp::Mul)), 8, 7, 1, 0));
        assert_eq!(code_[6], (code(Op::Binary(BinaryOp::Mul)), 9, 8, 2, 0));
        assert_eq!(results, [9]);
    }

    #[test]
    fn kept_intermediates_and_broadcast_inputs_are_interpreted() {
        // out0 = exp(a * b), out1 = a * b (kept); b broadcast along axis 0.
        let ab = Expr::binary(
            BinaryOp::Mul,
            Expr::input(0, DType::F32),
            Expr::input(1, DType::F32),
        );
        let mut s = sig(Expr::unary(UnaryOp::Exp, ab.clone()), 2, 0);
        s.also = std::borrow::Cow::Owned(vec![ab]);
        s.dtypes.push(DType::F32);
        s.paths = vec![
            Path::Contiguous,
            Path::Contiguous,
            Path::Contiguous,
            Path::Strided,
        ];
        let l = launch(&s, &planned(&s, &[])).unwrap();
        let w = &l.args.0;
        assert_eq!(w[4..6], [2, 2], "two outputs, two inputs");
        // Operand 3 (input b): strided, strides [0, 1].
        assert_eq!(w[6 + 3 * 4..6 + 4 * 4], [0x4000, 0, 0, 1]);
        let (results, _, code_) = program(w);
        // a * b in register 2, exp in 3: output 0 is 3, output 1 is 2.
        assert_eq!(code_[0], (code(Op::Binary(BinaryOp::Mul)), 2, 0, 1, 0));
        assert_eq!(results, [3, 2]);
    }

    #[test]
    fn maps_it_cannot_run_compile_instead() {
        let a = Expr::input(0, DType::F32);
        let check = |s: &MapSig| launch(s, &planned(s, &[])).is_none();
        // A cast, an f16 operand, a tiled operand, a position read.
        let cast = Expr::input(0, DType::I32).cast(DType::F32, false);
        assert!(check(&sig(cast, 1, 0)));
        let mut half = sig(a.clone(), 1, 0);
        half.dtypes[1] = DType::F16;
        assert!(check(&half));
        let mut tiled = sig(a, 1, 0);
        tiled.paths[1] = Path::Tiled;
        assert!(check(&tiled));
        let position = Expr::linear_index().cast(DType::F32, false);
        assert!(check(&sig(position, 0, 0)));
    }

    #[test]
    fn more_values_than_registers_compile_instead() {
        let mut e = Expr::input(0, DType::F32);
        for _ in 0..REGISTERS {
            e = Expr::unary(UnaryOp::Exp, e);
        }
        let s = sig(e, 1, 0);
        assert!(launch(&s, &planned(&s, &[])).is_none());
    }

    #[test]
    fn comparisons_feed_where_as_zero_or_one() {
        let a = Expr::input(0, DType::F32);
        let b = Expr::input(1, DType::F32);
        let e = Expr::select(Expr::binary(BinaryOp::Lt, a.clone(), b.clone()), a, b);
        let s = sig(e, 2, 0);
        assert!(launch(&s, &planned(&s, &[])).is_some());
        let src = source().unwrap();
        assert!(src.contains("v = ((a < b)) ? 1.0f : 0.0f;"), "{src}");
        assert!(src.contains("v = ((a != 0.0f) ? b : c);"));
    }
}
