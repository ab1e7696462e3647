//! A map's trees linearized once: the one walk of an expression tree that every consumer
//! shares. [`Program::build`] visits the trees of a (multi-output) map in post-order, without
//! recursion, and gives each distinct value one instruction (hash-consing: a subtree two
//! outputs share, or a value two vector lanes compute alike, is computed once). Each renderer
//! prints one statement per instruction with its own per-op strings, the CUDA interpreter
//! encodes the instructions, the CPU evaluates them a block at a time, and `explain` lists
//! them.
//!
//! For vectorized maps a program can hold several lanes ([`Lanes`]): each lane's leaves read
//! that lane's element, random draws whose counters the lanes share come from calls made once
//! per counter ([`Program::draws`]), and where every lane's position modulo the lane count is
//! known, each lane's Philox word is known and a test of the position's low bits (a Box–Muller
//! pair's parity) folds to a constant, so two lanes that read the same words share their work.
//!
//! ```
//! use strata_core::lower::program::{Lanes, Op, Program};
//! use strata_core::{ir::{BinaryOp, Expr, UnaryOp}, DType};
//! let x = Expr::input(0, DType::F32);
//! let e = Expr::binary(BinaryOp::Mul, Expr::unary(UnaryOp::Exp, x.clone()), Expr::unary(UnaryOp::Exp, x));
//! let p = Program::build(&[e], Lanes::one());
//! // in0, exp(in0) once, and the product.
//! assert_eq!(p.instrs.len(), 3);
//! assert!(matches!(p.instrs[2].op, Op::Binary(BinaryOp::Mul, 1, 1)));
//! assert_eq!(p.outputs, vec![vec![2]]);
//! ```

use crate::dtype::DType;
use crate::ir::{BinaryOp, Expr, Node, PhiloxWord, UnaryOp};
use rustc_hash::FxHashMap;
use smallvec::{smallvec, SmallVec};

/// An instruction's result: its index in [`Program::instrs`].
pub type ValueId = usize;

/// One value of a program: its dtype and how it is computed from earlier ones.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Instr {
    /// The value's dtype (every value is rounded to it, as its node was).
    pub dtype: DType,
    /// What computes it.
    pub op: Op,
}

/// How an instruction computes its value. Leaves read the element (of a lane); the others
/// take earlier values.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Op {
    /// Input `input` of lane `lane`'s element.
    Input {
        /// The input's number.
        input: usize,
        /// The lane.
        lane: usize,
    },
    /// Launch scalar `k`.
    Scalar(usize),
    /// A constant of the instruction's dtype, as the bits of its value.
    Literal(u64),
    /// The row-major position of lane `lane`'s element (`i64`).
    Position {
        /// The lane.
        lane: usize,
    },
    /// A Philox word drawn for the element itself (see [`PhiloxWord`]).
    Philox(PhiloxWord),
    /// Lane `lane`'s word of the hoisted draw `draw` ([`Program::draws`]), which it finds
    /// from its position at run time.
    Word {
        /// The draw.
        draw: usize,
        /// The lane.
        lane: usize,
    },
    /// Word `word` (0–3) of the call the hoisted draw `draw` makes for the vector's counter
    /// `group` (lanes whose position modulo the lane count is known: two lanes reading the
    /// same word read the same value).
    KnownWord {
        /// The draw.
        draw: usize,
        /// The vector's counter, from its first.
        group: usize,
        /// The word of that counter's four.
        word: usize,
    },
    /// Converts the value (strata's cast rules; integers clamp when `saturate`).
    Cast(ValueId, bool),
    /// The value's bits read as the instruction's dtype (of the same size).
    Bitcast(ValueId),
    /// A unary op.
    Unary(UnaryOp, ValueId),
    /// A binary op.
    Binary(BinaryOp, ValueId, ValueId),
    /// `a · b + c` with one rounding.
    Fma(ValueId, ValueId, ValueId),
    /// `cond ? a : b`.
    Where(ValueId, ValueId, ValueId),
}

impl Op {
    /// The values it reads, in order.
    ///
    /// ```
    /// use strata_core::{ir::BinaryOp, lower::program::Op};
    /// assert_eq!(Op::Binary(BinaryOp::Add, 3, 4).args(), vec![3, 4]);
    /// assert!(Op::Scalar(0).args().is_empty());
    /// ```
    pub fn args(&self) -> Vec<ValueId> {
        match *self {
            Op::Cast(a, _) | Op::Bitcast(a) | Op::Unary(_, a) => vec![a],
            Op::Binary(_, a, b) => vec![a, b],
            Op::Fma(a, b, c) | Op::Where(a, b, c) => vec![a, b, c],
            _ => Vec::new(),
        }
    }
}

/// Which lanes a program computes, and what it knows of their positions.
///
/// ```
/// use strata_core::lower::program::Lanes;
/// assert_eq!(Lanes::one().count, 1);
/// assert!(Lanes::aligned(4).aligned);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lanes {
    /// Lanes written out (1: one element, or one lane a renderer repeats in a loop).
    pub count: usize,
    /// Elements of a vector: Philox draws whose counters its elements share are hoisted
    /// into calls made once per counter ([`Program::draws`]); 1: every element draws its own.
    pub vector: usize,
    /// Lane `l`'s position is `l` modulo `count` (a vector starts on a multiple of it): its
    /// Philox words are known, and the position's low bits fold to constants.
    pub aligned: bool,
    /// Inputs (bit `k`: input `k`, below 64) every lane reads the same value of (a splat:
    /// constant along the rows the vector lies in): their leaves are lane 0's, so what the
    /// lanes compute from them alone (a batch norm's `s / n`) is computed once.
    pub shared: u64,
}

impl Lanes {
    /// One element, drawing its own random words.
    pub fn one() -> Lanes {
        Lanes {
            count: 1,
            vector: 1,
            aligned: false,
            shared: 0,
        }
    }

    /// `count` lanes of a vector starting on a multiple of `count`.
    pub fn aligned(count: usize) -> Lanes {
        Lanes {
            count,
            vector: count,
            aligned: true,
            shared: 0,
        }
    }

    /// `count` lanes of a vector of `vector` elements whose start is known only at run time
    /// (`count` 1: one lane that a renderer repeats for each element of the vector).
    pub fn unaligned(count: usize, vector: usize) -> Lanes {
        Lanes {
            count,
            vector,
            aligned: false,
            shared: 0,
        }
    }

    /// These lanes, reading the inputs of `shared` (a bit each) as one value for all lanes.
    ///
    /// ```
    /// use strata_core::lower::program::{Lanes, Program};
    /// use strata_core::{ir::{BinaryOp, Expr}, DType};
    /// // x0 · (x1 / s0) over four lanes, x1 a splat: one division, four products.
    /// let x = |k| Expr::input(k, DType::F32);
    /// let e = Expr::binary(BinaryOp::Mul, x(0), Expr::binary(BinaryOp::Div, x(1), Expr::scalar(0, DType::F32)));
    /// let p = Program::build(&[e], Lanes::aligned(4).sharing(0b10));
    /// assert_eq!(p.instrs.len(), 3 + 4 * 2); // x1, s0, x1 / s0; each lane's x0 and product
    /// ```
    pub fn sharing(self, shared: u64) -> Lanes {
        Lanes { shared, ..self }
    }
}

/// A map's trees as one list of instructions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    /// Every distinct value, each after the values it reads.
    pub instrs: Vec<Instr>,
    /// Per lane, the value of each tree (output 0's first).
    pub outputs: Vec<Vec<ValueId>>,
    /// The hoisted Philox draws (distinct words), which the lanes' [`Op::Word`] and
    /// [`Op::KnownWord`] read: a renderer makes one call per counter of each.
    pub draws: Vec<PhiloxWord>,
}

impl Program {
    /// The program computing `trees` (a map's output 0 first, then its further outputs) for
    /// each of `lanes`.
    pub fn build<'e, T>(trees: T, lanes: Lanes) -> Program
    where
        T: IntoIterator<Item = &'e Expr> + Clone,
    {
        let mut b = Builder {
            lanes,
            program: Program {
                instrs: Vec::new(),
                outputs: Vec::new(),
                draws: Vec::new(),
            },
            seen: FxHashMap::default(),
        };
        for lane in 0..lanes.count.max(1) {
            let values = trees.clone().into_iter().map(|t| b.tree(t, lane)).collect();
            b.program.outputs.push(values);
        }
        b.program
    }

    /// Whether a lane's draws read hoisted words: `w`'s counters are shared by the elements
    /// of a vector of `vector` (the counter covers a whole number of lanes, or the vector a
    /// whole number of counters).
    ///
    /// ```
    /// use strata_core::{ir::PhiloxWord, lower::program::Program};
    /// let w = PhiloxWord { key: 0, counter: 1, word: 0, per_counter: 4, shared: 1 };
    /// assert!(Program::hoists(&w, 4) && Program::hoists(&w, 2) && !Program::hoists(&w, 1));
    /// ```
    pub fn hoists(w: &PhiloxWord, vector: usize) -> bool {
        let per = w.per_counter as usize;
        per > 1 && vector > 1 && (vector.is_multiple_of(per) || per.is_multiple_of(vector))
    }

    /// For each instruction, the index of the last instruction that reads it (the outputs
    /// count as read at the end: `instrs.len()`): when a block of it may be dropped.
    ///
    /// ```
    /// use strata_core::lower::program::{Lanes, Program};
    /// use strata_core::{ir::{Expr, UnaryOp}, DType};
    /// let e = Expr::unary(UnaryOp::Exp, Expr::input(0, DType::F32));
    /// let p = Program::build(&[e], Lanes::one());
    /// assert_eq!(p.last_uses(), vec![1, 2]);
    /// ```
    pub fn last_uses(&self) -> Vec<usize> {
        let mut last = vec![0; self.instrs.len()];
        for (i, instr) in self.instrs.iter().enumerate() {
            for a in instr.op.args() {
                last[a] = i;
            }
        }
        for v in self.outputs.iter().flatten() {
            last[*v] = self.instrs.len();
        }
        last
    }
}

/// One line per instruction (`t3 = exp(t2) : f32`), then where each output's value is:
/// the program a backend evaluates, as `explain` shows it.
///
/// ```
/// use strata_core::lower::program::{Lanes, Program};
/// use strata_core::{ir::{BinaryOp, Expr}, DType};
/// let e = Expr::binary(BinaryOp::Mul, Expr::input(0, DType::F32), Expr::scalar(0, DType::F32));
/// let text = Program::build(&[e], Lanes::one()).to_string();
/// assert!(text.contains("t2 = t0 * t1") && text.ends_with("out = t2"));
/// ```
impl std::fmt::Display for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lane = |l: usize| {
            if self.outputs.len() > 1 {
                format!(" (lane {l})")
            } else {
                String::new()
            }
        };
        for (i, instr) in self.instrs.iter().enumerate() {
            let text = match &instr.op {
                Op::Input { input, lane: l } => format!("in{input}{}", lane(*l)),
                Op::Scalar(k) => format!("s{k}"),
                Op::Literal(bits) => {
                    crate::dtype::Scalar::from_bits(instr.dtype, *bits).to_string()
                }
                Op::Position { lane: l } => format!("index{}", lane(*l)),
                Op::Philox(w) => format!("philox{}(index)", w.word),
                Op::Word { draw, lane: l } => format!("draw{draw}{}", lane(*l)),
                Op::KnownWord { draw, group, word } => format!("draw{draw}[{group}].{word}"),
                Op::Cast(a, saturate) => format!(
                    "{}{}(t{a})",
                    instr.dtype,
                    if *saturate { "_sat" } else { "" }
                ),
                Op::Bitcast(a) => format!("bits_as_{}(t{a})", instr.dtype),
                Op::Unary(op, a) => format!("{}(t{a})", op.name()),
                Op::Binary(op, a, b) => match op.infix() {
                    Some((symbol, _)) => format!("t{a} {symbol} t{b}"),
                    None => format!("{}(t{a}, t{b})", op.name()),
                },
                Op::Fma(a, b, c) => format!("fma(t{a}, t{b}, t{c})"),
                Op::Where(c, a, b) => format!("where(t{c}, t{a}, t{b})"),
            };
            writeln!(f, "t{i} = {text:<28} : {}", instr.dtype)?;
        }
        for (l, values) in self.outputs.iter().enumerate() {
            for (k, v) in values.iter().enumerate() {
                let out = if k == 0 {
                    "out".to_string()
                } else {
                    format!("out{k}")
                };
                if l + k > 0 {
                    writeln!(f)?;
                }
                write!(f, "{out}{} = t{v}", lane(l))?;
            }
        }
        Ok(())
    }
}

/// Programs up to this many instructions find an equal value by searching them.
const SEARCHED: usize = 32;

/// Builds a program: each node once per distinct value.
struct Builder {
    lanes: Lanes,
    program: Program,
    /// Instructions by value, once there are [`SEARCHED`] of them.
    seen: FxHashMap<Instr, ValueId>,
}

impl Builder {
    /// The value of `instr`, added unless an equal one exists. A short program is searched
    /// in place (hashing cost more than the CPU's whole launch of a small map); past
    /// [`SEARCHED`] instructions they are indexed by value.
    fn value(&mut self, instr: Instr) -> ValueId {
        let instrs = &mut self.program.instrs;
        if instrs.len() < SEARCHED {
            if let Some(v) = instrs.iter().position(|i| *i == instr) {
                return v;
            }
        } else {
            if self.seen.is_empty() {
                self.seen = instrs.iter().cloned().zip(0..).collect();
            }
            if let Some(&v) = self.seen.get(&instr) {
                return v;
            }
            self.seen.insert(instr.clone(), instrs.len());
        }
        instrs.push(instr);
        instrs.len() - 1
    }

    /// The value of `tree` in `lane`, walked in post-order with an explicit stack.
    fn tree(&mut self, tree: &Expr, lane: usize) -> ValueId {
        // (node, children done); results of finished nodes on `values`.
        let mut stack: SmallVec<[(&Expr, bool); 16]> = smallvec![(tree, false)];
        let mut values: SmallVec<[ValueId; 16]> = SmallVec::new();
        while let Some((e, done)) = stack.pop() {
            if let Some(v) = self.folded(e, lane) {
                values.push(v);
                continue;
            }
            let children = e.children().count();
            if !done && children > 0 {
                stack.push((e, true));
                stack.extend(e.children().rev().map(|c| (c, false)));
                continue;
            }
            let mut args = [0; 3];
            let first = values.len() - children;
            args[..children].copy_from_slice(&values[first..]);
            values.truncate(first);
            let op = match &e.node {
                Node::Input(k) => {
                    let shared = *k < 64 && self.lanes.shared & (1 << k) != 0;
                    Op::Input {
                        input: *k,
                        lane: if shared { 0 } else { lane },
                    }
                }
                Node::Scalar(k) => Op::Scalar(*k),
                Node::Literal(bits) => Op::Literal(*bits),
                Node::LinearIndex => Op::Position { lane },
                Node::Philox(w) => self.draw(w, lane),
                Node::Cast { saturate, .. } => Op::Cast(args[0], *saturate),
                Node::Bitcast(_) => Op::Bitcast(args[0]),
                Node::Unary(op, _) => Op::Unary(*op, args[0]),
                Node::Binary(op, _, _) => Op::Binary(*op, args[0], args[1]),
                Node::Fma(..) => Op::Fma(args[0], args[1], args[2]),
                Node::Where(..) => Op::Where(args[0], args[1], args[2]),
            };
            let v = self.value(Instr { dtype: e.dtype, op });
            values.push(v);
        }
        values[0]
    }

    /// A test of the position's low bits (`position & m`, `m + 1` a power of two dividing the
    /// lane count) in a lane whose position modulo the lane count is known: that constant.
    fn folded(&mut self, e: &Expr, lane: usize) -> Option<ValueId> {
        let Node::Binary(BinaryOp::BitAnd, a, m) = &e.node else {
            return None;
        };
        let (Node::LinearIndex, Node::Literal(mask)) = (&a.node, &m.node) else {
            return None;
        };
        let modulus = mask.checked_add(1)?;
        let count = self.lanes.count as u64;
        let fits = self.lanes.aligned && modulus.is_power_of_two() && count.is_multiple_of(modulus);
        fits.then(|| {
            self.value(Instr {
                dtype: e.dtype,
                op: Op::Literal((lane as u64) & mask),
            })
        })
    }

    /// The leaf of the Philox word `w` in `lane`: drawn in place, or read from a hoisted call.
    fn draw(&mut self, w: &PhiloxWord, lane: usize) -> Op {
        if !Program::hoists(w, self.lanes.vector) {
            return Op::Philox(*w);
        }
        let draw = match self.program.draws.iter().position(|d| d == w) {
            Some(d) => d,
            None => {
                self.program.draws.push(*w);
                self.program.draws.len() - 1
            }
        };
        let per = w.per_counter as usize;
        if self.lanes.aligned && self.lanes.count == self.lanes.vector && self.lanes.vector >= per {
            Op::KnownWord {
                draw,
                group: lane / per,
                word: w.word_of(lane as u64),
            }
        } else {
            Op::Word { draw, lane }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::UnaryOp;

    #[test]
    fn further_outputs_are_values_of_output_zero() {
        let x = Expr::input(0, DType::F32);
        let e = Expr::unary(UnaryOp::Exp, x.clone());
        let top = Expr::binary(BinaryOp::Add, e.clone(), x.clone());
        let p = Program::build(&[top, e, x], Lanes::one());
        assert_eq!(p.instrs.len(), 3);
        assert_eq!(p.outputs, vec![vec![2, 1, 0]]);
    }

    #[test]
    fn box_muller_lanes_share_their_log_and_root_and_fold_their_parity() {
        let randn = crate::random::randn_f32_expr();
        let one = Program::build(std::slice::from_ref(&randn), Lanes::one());
        let four = Program::build(std::slice::from_ref(&randn), Lanes::aligned(4));
        let count = |p: &Program, op: UnaryOp| {
            p.instrs
                .iter()
                .filter(|i| matches!(i.op, Op::Unary(o, _) if o == op))
                .count()
        };
        // Four lanes, two pairs: two logs and two roots, not four.
        assert_eq!(
            (count(&one, UnaryOp::Log), count(&one, UnaryOp::Sqrt)),
            (1, 1)
        );
        assert_eq!(
            (count(&four, UnaryOp::Log), count(&four, UnaryOp::Sqrt)),
            (2, 2)
        );
        // The parity folds: no lane reads its position, and the words are known.
        assert!(four
            .instrs
            .iter()
            .all(|i| !matches!(i.op, Op::Position { .. } | Op::Word { .. } | Op::Philox(_))));
        assert!(!four.draws.is_empty());
        // Unaligned lanes find their words and parity at run time.
        let loose = Program::build(&[randn], Lanes::unaligned(4, 4));
        assert!(loose.instrs.iter().any(|i| matches!(i.op, Op::Word { .. })));
        assert_eq!(count(&loose, UnaryOp::Log), 4);
    }

    #[test]
    fn aligned_lanes_know_the_low_bits_of_their_position() {
        let parity = |m: i64| {
            Expr::binary(
                BinaryOp::BitAnd,
                Expr::linear_index(),
                Expr::literal(crate::dtype::Scalar::I64(m)),
            )
        };
        let lane_value = |p: &Program, lane: usize| p.instrs[p.outputs[lane][0]].op.clone();
        let four = Program::build(&[parity(1), parity(3), parity(7)], Lanes::aligned(4));
        for lane in 0..4 {
            let of = |k: usize| four.instrs[four.outputs[lane][k]].op.clone();
            assert_eq!(of(0), Op::Literal(lane as u64 & 1));
            assert_eq!(of(1), Op::Literal(lane as u64));
            // A mask past the lane count depends on more than the position modulo 4.
            assert!(matches!(of(2), Op::Binary(BinaryOp::BitAnd, _, _)));
        }
        let loose = Program::build(&[parity(1)], Lanes::unaligned(4, 4));
        assert!(matches!(lane_value(&loose, 1), Op::Binary(..)));
    }

    #[test]
    fn deep_trees_build_without_recursion() {
        let mut e = Expr::input(0, DType::F32);
        for _ in 0..100_000 {
            e = Expr::unary(UnaryOp::Neg, e);
        }
        let p = Program::build(std::slice::from_ref(&e), Lanes::one());
        assert_eq!(p.instrs.len(), 100_001);
        std::mem::forget(e); // (dropping it would recurse; fusion never builds such a tree)
    }
}
