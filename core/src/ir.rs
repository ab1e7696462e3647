//! The kernel IR: what core asks a backend to run. Core builds it with every dtype decided
//! and every operand broadcast to the output's shape, so a backend only compiles and runs it.
//!
//! A kernel's *structure* (this module's types) is what a backend compiles and caches; sizes,
//! strides, offsets and scalar values arrive at launch time in [`KernelArgs`](crate::backend::KernelArgs).

use crate::dtype::{DType, Scalar};

/// A typed expression tree evaluated once per output element of a [`Kernel::Map`].
///
/// Every node's value is rounded to its own `dtype` (so `f16` trees round after each node).
/// Operand dtypes follow the rules given on [`BinaryOp`]; core inserts the casts.
///
/// ```
/// use strata_core::{DType, ir::{BinaryOp, Expr}};
/// // out = in0 + scalar0, in f32
/// let e = Expr::binary(BinaryOp::Add, Expr::input(0, DType::F32), Expr::scalar(0, DType::F32));
/// assert_eq!(e.dtype, DType::F32);
/// assert_eq!(e.max_input(), Some(0));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Expr {
    /// The dtype of this node's value.
    pub dtype: DType,
    /// What the node computes.
    pub node: Node,
}

/// The kinds of [`Expr`] node.
///
/// ```
/// use strata_core::{DType, ir::{Expr, Node}};
/// assert_eq!(Expr::linear_index().node, Node::LinearIndex);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Node {
    /// Input tensor `k`, read at the output element's index (inputs have the output's shape,
    /// broadcast through stride-0 axes).
    Input(usize),
    /// Launch scalar `k` (its value is an argument, not part of the compiled kernel).
    Scalar(usize),
    /// A constant of the node's dtype, as the little-endian bits of its value
    /// ([`Scalar::bits`]): canonical forms need a few (integer `relu` is `max(x, 0)`); user
    /// values stay launch scalars, so they never change a kernel's structure.
    Literal(u64),
    /// The row-major position of the output element, as `i64`.
    LinearIndex,
    /// One word of Philox4x32-10 per element, `u32` (see [`PhiloxWord`]).
    Philox(PhiloxWord),
    /// Converts the operand to this node's dtype with strata's cast rules
    /// ([`Scalar::cast`](crate::Scalar::cast)): integers wrap, or clamp when `saturate`.
    Cast {
        /// The value to convert.
        arg: Box<Expr>,
        /// Clamp integer results to the target range instead of wrapping.
        saturate: bool,
    },
    /// The operand's bits read as this node's dtype, which has the operand's size (`f32` ↔
    /// `u32`/`i32`, `f16`/`bf16` ↔ `u16`/`i16`, `f64` ↔ `u64`/`i64`, or two integers of one
    /// width); never `bool`. Stochastic rounding and exponent histograms read floats' bits.
    Bitcast(Box<Expr>),
    /// A unary operation.
    Unary(UnaryOp, Box<Expr>),
    /// A binary operation.
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    /// `a · b + c` with one rounding for floats (integers wrap); all of this node's dtype.
    Fma(Box<Expr>, Box<Expr>, Box<Expr>),
    /// `cond ? a : b`; `cond` is `bool`, `a` and `b` have this node's dtype.
    Where(Box<Expr>, Box<Expr>, Box<Expr>),
}

/// A [`Node::Philox`]: one word of Philox4x32-10
/// ([`philox4x32_10`]) for each element. Neighbouring elements
/// share a counter, so one Philox call serves `per_counter` of them: element `i` (its row-major
/// position) reads counter `c = scalar counter + i / per_counter` (wrapping), as
/// `[c as u32, (c >> 32) as u32, 0, 0]` keyed by `[k as u32, (k >> 32) as u32]` with
/// `k = scalar key`, and there the word [`word_of`](PhiloxWord::word_of)`(i)`: the
/// `per_counter / shared` groups of `shared` neighbours split the four words evenly, and
/// `word` picks one of its group's.
///
/// ```
/// use strata_core::ir::PhiloxWord;
/// // Four elements per counter, one word each.
/// let one = PhiloxWord { key: 0, counter: 1, word: 0, per_counter: 4, shared: 1 };
/// assert_eq!((0..4).map(|i| one.word_of(i)).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
/// assert_eq!(one.counter_of(9), 2);
/// // Pairs of elements sharing two words (f32 Box–Muller): the second word of each pair.
/// let pairs = PhiloxWord { word: 1, shared: 2, ..one };
/// assert_eq!((0..4).map(|i| pairs.word_of(i)).collect::<Vec<_>>(), vec![1, 1, 3, 3]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PhiloxWord {
    /// Index of the `u64` launch scalar holding the key (the seed).
    pub key: usize,
    /// Index of the `u64` launch scalar holding the first element's counter.
    pub counter: usize,
    /// Which word of the element's group (below `4 · shared / per_counter`).
    pub word: u8,
    /// Elements per counter: 1, 2 or 4.
    pub per_counter: u8,
    /// Neighbouring elements that read the same words (a Box–Muller pair: 2), dividing
    /// `per_counter`.
    pub shared: u8,
}

impl PhiloxWord {
    /// Words each group of `shared` neighbours owns: `4 · shared / per_counter`.
    ///
    /// ```
    /// let w = strata_core::ir::PhiloxWord { key: 0, counter: 1, word: 0, per_counter: 2, shared: 1 };
    /// assert_eq!(w.group_width(), 2);
    /// ```
    pub fn group_width(&self) -> usize {
        4 * self.shared.max(1) as usize / self.per_counter.max(1) as usize
    }

    /// Which of the four words element `i` reads.
    ///
    /// ```
    /// let w = strata_core::ir::PhiloxWord { key: 0, counter: 1, word: 1, per_counter: 2, shared: 1 };
    /// assert_eq!((w.word_of(0), w.word_of(1)), (1, 3));
    /// ```
    pub fn word_of(&self, i: u64) -> usize {
        let (per, shared) = (self.per_counter.max(1) as u64, self.shared.max(1) as u64);
        ((i % per) / shared) as usize * self.group_width() + self.word as usize
    }

    /// The counter of element `i`, counted from the scalar counter.
    ///
    /// ```
    /// let w = strata_core::ir::PhiloxWord { key: 0, counter: 1, word: 0, per_counter: 4, shared: 1 };
    /// assert_eq!(w.counter_of(7), 1);
    /// ```
    pub fn counter_of(&self, i: u64) -> u64 {
        i / self.per_counter.max(1) as u64
    }
}

/// Philox4x32-10 (Salmon et al., 2011): 10 rounds over a 128-bit counter with a 64-bit key.
///
/// ```
/// // A known-answer vector of the Random123 reference.
/// let out = strata_core::ir::philox4x32_10([0; 4], [0; 2]);
/// assert_eq!(out, [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
/// ```
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    const M0: u64 = 0xD251_1F53;
    const M1: u64 = 0xCD9E_8D57;
    const W0: u32 = 0x9E37_79B9;
    const W1: u32 = 0xBB67_AE85;
    let (mut c, mut k) = (counter, key);
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let p0 = M0 * c[0] as u64;
        let p1 = M1 * c[2] as u64;
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// Binary operations of the IR. Both operands have the same dtype; comparisons and logical
/// ops return `bool`, everything else returns the operand dtype. Integer edge cases have one
/// result on every backend (listed per op).
///
/// ```
/// use strata_core::ir::BinaryOp;
/// assert!(BinaryOp::Lt.returns_bool());
/// assert!(!BinaryOp::Add.returns_bool());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`; integers wrap.
    Add,
    /// `a - b`; integers wrap.
    Sub,
    /// `a * b`; integers wrap.
    Mul,
    /// `a / b` (floats only: core converts integers first).
    Div,
    /// Floor of `a / b`; integers: division by 0 gives 0, `MIN / -1` wraps to `MIN`.
    FloorDiv,
    /// Python's modulo (the sign of the divisor); integers: `a % 0` is 0; floats: NaN.
    Rem,
    /// `a` to the power `b`; integers wrap, and a negative exponent gives `1 / a` truncated
    /// (0 unless `a` is 1 or -1).
    Pow,
    /// The larger operand; NaN if either is NaN.
    Max,
    /// The smaller operand; NaN if either is NaN.
    Min,
    /// `atan2(a, b)` (floats only).
    Atan2,
    /// Bitwise and (integers, bool).
    BitAnd,
    /// Bitwise or (integers, bool).
    BitOr,
    /// Bitwise xor (integers, bool).
    BitXor,
    /// `a << b`; a shift below 0 or of the bit width or more gives 0.
    Shl,
    /// `a >> b`, arithmetic for signed types; a shift below 0 or of the bit width or more gives
    /// 0, or -1 for negative signed `a`.
    Shr,
    /// `a + b` clamped to the dtype's range (floats: plain `+`).
    AddSat,
    /// `a - b` clamped to the dtype's range (floats: plain `-`).
    SubSat,
    /// `a * b` clamped to the dtype's range (floats: plain `*`).
    MulSat,
    /// `a / b` truncated and clamped (`MIN / -1` is `MAX`, `/ 0` is 0; floats: plain `/`).
    DivSat,
    /// Both non-zero → `bool`.
    LogicalAnd,
    /// Either non-zero → `bool`.
    LogicalOr,
    /// Exactly one non-zero → `bool`.
    LogicalXor,
    /// `a == b` → `bool` (false with NaN).
    Eq,
    /// `a != b` → `bool` (true with NaN).
    Ne,
    /// `a < b` → `bool` (false with NaN).
    Lt,
    /// `a <= b` → `bool` (false with NaN).
    Le,
    /// `a > b` → `bool` (false with NaN).
    Gt,
    /// `a >= b` → `bool` (false with NaN).
    Ge,
}

/// Lower-case name of an enum variant (`Atan2` → `atan2`, `AddSat` → `add_sat`).
fn snake(debug: String) -> String {
    let mut out = String::new();
    for (k, c) in debug.chars().enumerate() {
        if c.is_ascii_uppercase() && k > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

impl BinaryOp {
    /// The op's name as written in a call (`atan2`, `add_sat`).
    ///
    /// ```
    /// assert_eq!(strata_core::ir::BinaryOp::FloorDiv.name(), "floor_div");
    /// ```
    pub fn name(self) -> String {
        snake(format!("{self:?}"))
    }

    /// The infix symbol of an op written between its operands (`+`, `<<`, `==`), with its
    /// binding strength (higher binds tighter); `None` for ops written as calls.
    ///
    /// ```
    /// use strata_core::ir::BinaryOp;
    /// assert_eq!(BinaryOp::Mul.infix(), Some(("*", 5)));
    /// assert_eq!(BinaryOp::Max.infix(), None);
    /// ```
    pub fn infix(self) -> Option<(&'static str, u8)> {
        use BinaryOp::*;
        Some(match self {
            Mul => ("*", 5),
            Div => ("/", 5),
            Rem => ("%", 5),
            FloorDiv => ("//", 5),
            Add => ("+", 4),
            Sub => ("-", 4),
            Shl => ("<<", 3),
            Shr => (">>", 3),
            Eq => ("==", 2),
            Ne => ("!=", 2),
            Lt => ("<", 2),
            Le => ("<=", 2),
            Gt => (">", 2),
            Ge => (">=", 2),
            BitAnd => ("&", 1),
            BitOr => ("|", 1),
            BitXor => ("^", 1),
            _ => return None,
        })
    }

    /// True when the result is `bool` whatever the operand dtype.
    ///
    /// ```
    /// assert!(strata_core::ir::BinaryOp::LogicalXor.returns_bool());
    /// ```
    pub fn returns_bool(self) -> bool {
        use BinaryOp::*;
        matches!(
            self,
            LogicalAnd | LogicalOr | LogicalXor | Eq | Ne | Lt | Le | Gt | Ge
        )
    }
}

/// Unary operations of the IR. The operand has the node's dtype, except for the predicates
/// (`IsNan`, `IsInf`, `IsFinite`, `LogicalNot`), which return `bool`. Float functions are
/// computed in at least the operand's precision and rounded to it.
///
/// ```
/// use strata_core::ir::UnaryOp;
/// assert!(UnaryOp::IsNan.returns_bool());
/// assert!(UnaryOp::Sqrt.float_only());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `-x`; integers wrap (`-MIN` is `MIN`).
    Neg,
    /// `-x` clamped (`-MIN` is `MAX`; unsigned: 0).
    NegSat,
    /// `|x|`; integers wrap (`|MIN|` is `MIN`).
    Abs,
    /// -1, 0 or 1 (NaN stays NaN; both zeros give +0, as PyTorch's `(0 < x) - (x < 0)`).
    Sign,
    /// `x * x`; integers wrap.
    Square,
    /// `√x`.
    Sqrt,
    /// `1 / √x`.
    Rsqrt,
    /// `1 / x`.
    Reciprocal,
    /// `eˣ`.
    Exp,
    /// `2ˣ`.
    Exp2,
    /// `eˣ − 1`, accurate near 0.
    Expm1,
    /// Natural logarithm.
    Log,
    /// Base-2 logarithm.
    Log2,
    /// Base-10 logarithm.
    Log10,
    /// `ln(1 + x)`, accurate near 0.
    Log1p,
    /// Sine.
    Sin,
    /// Cosine.
    Cos,
    /// Tangent.
    Tan,
    /// Hyperbolic tangent.
    Tanh,
    /// `1 / (1 + e⁻ˣ)`.
    Sigmoid,
    /// `max(x, 0)` (NaN stays NaN).
    Relu,
    /// `x · Φ(x)` with the exact error function.
    Gelu,
    /// The error function.
    Erf,
    /// Round down (integers: unchanged).
    Floor,
    /// Round up (integers: unchanged).
    Ceil,
    /// Round half to even (integers: unchanged).
    Round,
    /// Round toward zero (integers: unchanged).
    Trunc,
    /// NaN test → `bool`.
    IsNan,
    /// ±infinity test → `bool`.
    IsInf,
    /// Neither NaN nor infinite → `bool`.
    IsFinite,
    /// `x == 0` → `bool`.
    LogicalNot,
    /// Bitwise not (bool: logical not).
    BitNot,
}

impl UnaryOp {
    /// The op's name as written in a call (`sqrt`, `is_nan`).
    ///
    /// ```
    /// assert_eq!(strata_core::ir::UnaryOp::IsNan.name(), "is_nan");
    /// ```
    pub fn name(self) -> String {
        snake(format!("{self:?}"))
    }

    /// True for predicates, whose result is `bool`.
    ///
    /// ```
    /// assert!(!strata_core::ir::UnaryOp::Abs.returns_bool());
    /// ```
    pub fn returns_bool(self) -> bool {
        use UnaryOp::*;
        matches!(self, IsNan | IsInf | IsFinite | LogicalNot)
    }

    /// True for functions defined on floats only (core converts integers to the default float
    /// dtype first).
    ///
    /// ```
    /// assert!(!strata_core::ir::UnaryOp::Floor.float_only());
    /// ```
    pub fn float_only(self) -> bool {
        use UnaryOp::*;
        matches!(
            self,
            Sqrt | Rsqrt
                | Reciprocal
                | Exp
                | Exp2
                | Expm1
                | Log
                | Log2
                | Log10
                | Log1p
                | Sin
                | Cos
                | Tan
                | Tanh
                | Sigmoid
                | Gelu
                | Erf
        )
    }
}

impl Expr {
    /// Input tensor `k` of dtype `dtype`.
    ///
    /// ```
    /// let e = strata_core::ir::Expr::input(1, strata_core::DType::U8);
    /// assert_eq!(e.max_input(), Some(1));
    /// ```
    pub fn input(k: usize, dtype: DType) -> Expr {
        Expr {
            dtype,
            node: Node::Input(k),
        }
    }

    /// Launch scalar `k` of dtype `dtype`.
    ///
    /// ```
    /// let e = strata_core::ir::Expr::scalar(0, strata_core::DType::F64);
    /// assert_eq!(e.dtype, strata_core::DType::F64);
    /// ```
    pub fn scalar(k: usize, dtype: DType) -> Expr {
        Expr {
            dtype,
            node: Node::Scalar(k),
        }
    }

    /// The output element's row-major position, `i64`.
    ///
    /// ```
    /// assert_eq!(strata_core::ir::Expr::linear_index().dtype, strata_core::DType::I64);
    /// ```
    pub fn linear_index() -> Expr {
        Expr {
            dtype: DType::I64,
            node: Node::LinearIndex,
        }
    }

    /// `self` converted to `dtype` (no node when it already has it).
    ///
    /// ```
    /// use strata_core::{DType, ir::Expr};
    /// assert_eq!(Expr::linear_index().cast(DType::F32, false).dtype, DType::F32);
    /// ```
    pub fn cast(self, dtype: DType, saturate: bool) -> Expr {
        if self.dtype == dtype {
            return self;
        }
        Expr {
            dtype,
            node: Node::Cast {
                arg: Box::new(self),
                saturate,
            },
        }
    }

    /// `self`'s bits read as `dtype`, of the same size (no node when it already has it).
    ///
    /// ```
    /// use strata_core::{DType, ir::Expr};
    /// assert_eq!(Expr::input(0, DType::F32).bitcast(DType::U32).dtype, DType::U32);
    /// ```
    pub fn bitcast(self, dtype: DType) -> Expr {
        debug_assert_eq!(self.dtype.itemsize(), dtype.itemsize());
        if self.dtype == dtype {
            return self;
        }
        Expr {
            dtype,
            node: Node::Bitcast(Box::new(self)),
        }
    }

    /// The constant `value`, of its dtype.
    ///
    /// ```
    /// use strata_core::{DType, Scalar, ir::{Expr, Node}};
    /// let e = Expr::literal(Scalar::F32(1.0));
    /// assert_eq!((e.dtype, e.node), (DType::F32, Node::Literal(0x3f80_0000)));
    /// ```
    pub fn literal(value: Scalar) -> Expr {
        Expr {
            dtype: value.dtype(),
            node: Node::Literal(value.bits()),
        }
    }

    /// `op(lhs, rhs)` exactly as given (no rewriting).
    pub(crate) fn raw_binary(op: BinaryOp, lhs: Expr, rhs: Expr) -> Expr {
        debug_assert_eq!(lhs.dtype, rhs.dtype, "core casts operands to one dtype");
        let dtype = if op.returns_bool() {
            DType::Bool
        } else {
            lhs.dtype
        };
        Expr {
            dtype,
            node: Node::Binary(op, Box::new(lhs), Box::new(rhs)),
        }
    }

    /// `op(arg)` exactly as given (no rewriting).
    pub(crate) fn raw_unary(op: UnaryOp, arg: Expr) -> Expr {
        let dtype = if op.returns_bool() {
            DType::Bool
        } else {
            arg.dtype
        };
        Expr {
            dtype,
            node: Node::Unary(op, Box::new(arg)),
        }
    }

    /// `a · b + c`; all three share a dtype.
    ///
    /// ```
    /// use strata_core::{DType, ir::Expr};
    /// let x = || Expr::input(0, DType::F32);
    /// assert_eq!(Expr::fma(x(), x(), x()).dtype, DType::F32);
    /// ```
    pub fn fma(a: Expr, b: Expr, c: Expr) -> Expr {
        Expr {
            dtype: a.dtype,
            node: Node::Fma(Box::new(a), Box::new(b), Box::new(c)),
        }
    }

    /// `cond ? a : b`.
    ///
    /// ```
    /// use strata_core::{DType, ir::Expr};
    /// let e = Expr::select(Expr::input(0, DType::Bool), Expr::scalar(0, DType::F32), Expr::scalar(1, DType::F32));
    /// assert_eq!(e.dtype, DType::F32);
    /// ```
    pub fn select(cond: Expr, a: Expr, b: Expr) -> Expr {
        Expr {
            dtype: a.dtype,
            node: Node::Where(Box::new(cond), Box::new(a), Box::new(b)),
        }
    }

    /// The node's operands, in order (none for a leaf): the one structural walk every
    /// consumer of a tree shares.
    ///
    /// ```
    /// use strata_core::{DType, ir::{BinaryOp, Expr}};
    /// let x = Expr::input(0, DType::F32);
    /// let e = Expr::binary(BinaryOp::Add, x.clone(), Expr::scalar(0, DType::F32));
    /// assert_eq!(e.children().count(), 2);
    /// assert_eq!(x.children().count(), 0);
    /// ```
    pub fn children(&self) -> impl DoubleEndedIterator<Item = &Expr> + '_ {
        let (a, b, c): (Option<&Expr>, Option<&Expr>, Option<&Expr>) = match &self.node {
            Node::Input(_)
            | Node::Scalar(_)
            | Node::Literal(_)
            | Node::LinearIndex
            | Node::Philox(_) => (None, None, None),
            Node::Cast { arg, .. } | Node::Bitcast(arg) | Node::Unary(_, arg) => {
                (Some(arg), None, None)
            }
            Node::Binary(_, a, b) => (Some(a), Some(b), None),
            Node::Fma(a, b, c) | Node::Where(a, b, c) => (Some(a), Some(b), Some(c)),
        };
        [a, b, c].into_iter().flatten()
    }

    /// This node with each operand replaced by `f` of it, in order (a leaf is copied).
    ///
    /// ```
    /// use strata_core::{DType, ir::{Expr, UnaryOp}};
    /// let e = Expr::unary(UnaryOp::Neg, Expr::input(0, DType::F32));
    /// let f = e.map_children(|_| Expr::input(1, DType::F32));
    /// assert_eq!(f.max_input(), Some(1));
    /// ```
    pub fn map_children(&self, mut f: impl FnMut(&Expr) -> Expr) -> Expr {
        let mut g = |e: &Expr| Box::new(f(e));
        let node = match &self.node {
            Node::Input(_)
            | Node::Scalar(_)
            | Node::Literal(_)
            | Node::LinearIndex
            | Node::Philox(_) => self.node.clone(),
            Node::Cast { arg, saturate } => Node::Cast {
                arg: g(arg),
                saturate: *saturate,
            },
            Node::Bitcast(a) => Node::Bitcast(g(a)),
            Node::Unary(op, a) => Node::Unary(*op, g(a)),
            Node::Binary(op, a, b) => {
                let a = g(a);
                Node::Binary(*op, a, g(b))
            }
            Node::Fma(a, b, c) => {
                let (a, b) = (g(a), g(b));
                Node::Fma(a, b, g(c))
            }
            Node::Where(c, a, b) => {
                let (c, a) = (g(c), g(a));
                Node::Where(c, a, g(b))
            }
        };
        Expr {
            dtype: self.dtype,
            node,
        }
    }

    /// True when the tree reads the element's position (`LinearIndex` or `Philox`), so the
    /// order of the output's axes matters.
    ///
    /// ```
    /// use strata_core::{DType, ir::Expr};
    /// assert!(Expr::linear_index().reads_linear_index());
    /// assert!(!Expr::input(0, DType::F32).reads_linear_index());
    /// ```
    pub fn reads_linear_index(&self) -> bool {
        self.any_node(|n| matches!(n, Node::LinearIndex | Node::Philox(_)))
    }

    /// True when some node of the tree applies `op`.
    ///
    /// ```
    /// use strata_core::{DType, ir::{Expr, UnaryOp}};
    /// let x = Expr::input(0, DType::F32);
    /// assert!(Expr::unary(UnaryOp::Erf, x.clone()).applies(UnaryOp::Erf));
    /// assert!(!Expr::unary(UnaryOp::Exp, x).applies(UnaryOp::Erf));
    /// ```
    pub fn applies(&self, op: UnaryOp) -> bool {
        self.any_node(|n| matches!(n, Node::Unary(o, _) if *o == op))
    }

    /// The most elements one Philox call serves among the tree's draws (`per_counter`); 1
    /// when it draws none.
    ///
    /// ```
    /// use strata_core::{random::randn_f32_expr, DType, ir::Expr};
    /// assert_eq!(randn_f32_expr().draw_lanes(), 4);
    /// assert_eq!(Expr::input(0, DType::F32).draw_lanes(), 1);
    /// ```
    pub fn draw_lanes(&self) -> usize {
        // Runs at every map launch: no allocation for a tree of ordinary depth.
        let mut most = 1;
        let mut stack: smallvec::SmallVec<[&Expr; 16]> = smallvec::smallvec![self];
        while let Some(e) = stack.pop() {
            if let Node::Philox(w) = &e.node {
                most = most.max(w.per_counter as usize);
            }
            stack.extend(e.children());
        }
        most
    }

    /// True when the tree draws random numbers (reads `Philox` words).
    ///
    /// ```
    /// use strata_core::{DType, ir::Expr};
    /// assert!(strata_core::random::randn_f32_expr().draws_random());
    /// assert!(!Expr::linear_index().draws_random());
    /// ```
    pub fn draws_random(&self) -> bool {
        self.any_node(|n| matches!(n, Node::Philox(_)))
    }

    /// True when the tree reads input `k`.
    ///
    /// ```
    /// use strata_core::{DType, ir::{BinaryOp, Expr}};
    /// let e = Expr::binary(BinaryOp::Add, Expr::input(0, DType::F32), Expr::input(2, DType::F32));
    /// assert!(e.reads_input(2) && !e.reads_input(1));
    /// ```
    pub fn reads_input(&self, k: usize) -> bool {
        self.any_node(|n| matches!(n, Node::Input(i) if *i == k))
    }

    /// The highest input index the tree reads, if any.
    ///
    /// ```
    /// assert_eq!(strata_core::ir::Expr::linear_index().max_input(), None);
    /// ```
    pub fn max_input(&self) -> Option<usize> {
        let own = match self.node {
            Node::Input(k) => Some(k),
            _ => None,
        };
        self.children().fold(own, |m, c| m.max(c.max_input()))
    }

    /// True when some node of the tree satisfies `f` (walked with an explicit stack, inline
    /// for small trees: this runs on every launch).
    fn any_node(&self, f: impl Fn(&Node) -> bool) -> bool {
        let mut todo: smallvec::SmallVec<[&Expr; 16]> = smallvec::smallvec![self];
        while let Some(e) = todo.pop() {
            if f(&e.node) {
                return true;
            }
            todo.extend(e.children());
        }
        false
    }
}

/// A map's trees as a kernel signature holds them: output 0's tree, then the further outputs'
/// (`Kernel::Map { expr, also }`), borrowed from the launch for a cache lookup and owned once
/// the signature is stored.
///
/// ```
/// use strata_core::{ir::{Expr, MapTrees, UnaryOp}, DType};
/// let x = Expr::input(0, DType::F32);
/// let e = Expr::unary(UnaryOp::Exp, x.clone());
/// let also = [x];
/// let trees = MapTrees::borrowed(&e, &also);
/// assert_eq!(trees.outputs(), 2);
/// assert_eq!(trees.iter().count(), 2);
/// assert_eq!(trees.to_owned(), trees);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MapTrees<'e> {
    /// Output 0's tree.
    pub expr: std::borrow::Cow<'e, Expr>,
    /// The further outputs' trees (subtrees of `expr`, or trees that read no position and may
    /// share subtrees with it).
    pub also: std::borrow::Cow<'e, [Expr]>,
}

impl<'e> MapTrees<'e> {
    /// The trees of a launch, borrowed.
    pub fn borrowed(expr: &'e Expr, also: &'e [Expr]) -> MapTrees<'e> {
        MapTrees {
            expr: std::borrow::Cow::Borrowed(expr),
            also: std::borrow::Cow::Borrowed(also),
        }
    }

    /// A single-output map's tree, owned.
    pub fn one(expr: Expr) -> MapTrees<'static> {
        MapTrees {
            expr: std::borrow::Cow::Owned(expr),
            also: std::borrow::Cow::Owned(Vec::new()),
        }
    }

    /// An owned copy, as a stored signature keeps it.
    pub fn to_owned(&self) -> MapTrees<'static> {
        MapTrees {
            expr: std::borrow::Cow::Owned(self.expr.clone().into_owned()),
            also: std::borrow::Cow::Owned(self.also.clone().into_owned()),
        }
    }

    /// How many outputs the map writes.
    pub fn outputs(&self) -> usize {
        1 + self.also.len()
    }

    /// Every output's tree, output 0 first.
    pub fn iter(&self) -> impl Iterator<Item = &Expr> + Clone {
        std::iter::once(self.expr.as_ref()).chain(self.also.iter())
    }
}

/// A unit of work for a backend.
///
/// ```
/// use strata_core::{DType, ir::{Expr, Kernel}};
/// let copy = Kernel::map(Expr::input(0, DType::F32));
/// assert!(matches!(copy, Kernel::Map { .. }));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Writes `expr` to every element of output 0. Fill (a scalar), arange (the linear index),
    /// strided copy (one input) and cast are all maps.
    Map {
        /// The value of each output element; its dtype is the output's.
        expr: Expr,
        /// Multi-output fusion: output `k + 1` gets `also[k]`, with output 0's shape. Each is
        /// a subtree of `expr` (an intermediate that someone still holds), so a backend
        /// computes it once and stores it as well, or a tree over the same inputs that reads
        /// no position (an optimizer's state, written beside its parameter; a sibling tree
        /// at a flush, which may share subtrees with `expr`): either way,
        /// `expr`'s random draws and position reads are all the map's. Empty for every map
        /// but a fused one or a step writing several tensors, and at most
        /// [`max_map_outputs`](crate::target::Target::max_map_outputs) `- 1` long.
        also: Vec<Expr>,
    },
    /// Reduces the trailing `reduced_axes` axes of input 0 into output 0, whose shape is the
    /// input's leading axes. Each element is converted to `acc` before it is combined, and the
    /// result is converted to the output dtype. Core guarantees a non-empty extent for `Min`,
    /// `Max`, `ArgMin` and `ArgMax`.
    Reduce {
        /// What to combine.
        op: ReduceOp,
        /// How many trailing input axes are reduced.
        reduced_axes: usize,
        /// The accumulation dtype (float accumulation may use more precision than this).
        acc: DType,
        /// Map→reduce fusion: when given, the element reduced at each position is this
        /// expression over inputs `0..` and the launch scalars, instead of input 0's element.
        /// Each further input is laid out like input 0 (shape, strides, offset, item size) or
        /// holds one value per output ([`per_output`](crate::lower::operands::per_output)),
        /// or one value per position along the reduced axes
        /// ([`per_position`](crate::lower::operands::per_position): a layer norm's weight in
        /// a row sum, per-row statistics in a column sum).
        /// It never reads the linear index. Only backends whose
        /// [`fuses_map_into_reduce`](crate::target::Target::fuses_map_into_reduce) is true get one.
        map: Option<Expr>,
        /// A reduction the map reads, run in the same kernel first: see [`RowPrologue`].
        /// Only with a map, and only on backends whose
        /// [`fuses_row_prologue`](crate::target::Target::fuses_row_prologue) is true.
        prologue: Option<RowPrologue>,
        /// Elementwise work over the rows that reads this reduction's result, run in the same
        /// kernel after it: see [`RowEpilogue`]. Only on backends whose
        /// [`fuses_row_epilogue`](crate::target::Target::fuses_row_epilogue) is true.
        epilogue: Option<RowEpilogue>,
        /// The map's value at every element is stored as well, in output 1 (of the map's
        /// dtype, with input 0's shape and strides): a pending tree that is read whole later
        /// (a bias gradient's column sum of the gradient a matmul then reads) is computed
        /// once, by its reduction. Only with a map and without a prologue or an epilogue, on
        /// backends whose [`stores_reduce_map`](crate::target::Target::stores_reduce_map) is
        /// true.
        stores_map: bool,
    },
    /// `C = α·A·B + β·C` for inputs `A` `[batch, m, k]` and `B` `[batch, k, n]` and output `C`
    /// `[batch, m, n]`, all of one dtype and any strides (a batch stride may be 0). Scalars:
    /// α, β in `acc`. When β is 0, `C` is not read (NaN in it does not propagate).
    /// Integers wrap.
    Matmul {
        /// The accumulation dtype (f32 for 16-bit floats; float accumulation may use more).
        acc: DType,
        /// f32 products may use TF32 (the device opted in with `set_allow_tf32`).
        tf32: bool,
    },
    /// Softmax (or with `log`, log-softmax) along the last axis of input 0 into output 0, of
    /// the same shape and float dtype: the composition `softmax` is defined by, run with each
    /// row kept on chip. Per row, `m` is the maximum (NaN if any element is), each element's
    /// term `t = exp(x - m)` is rounded to the dtype as that op rounds it, `s` is the sum of
    /// the terms in the dtype's [`accumulator`](DType::accumulator) rounded to the
    /// dtype, and the output is [`softmax_output`](crate::lower::softmax_plan::softmax_output)
    /// of `x`, `m` and `s`. Only the sum's order may differ from the eager composition. Only
    /// backends whose [`runs_softmax`](crate::target::Target::runs_softmax) is true get one.
    Softmax {
        /// Log-softmax: `(x - m) - log(s)` instead of `t / s`.
        log: bool,
    },
    /// Gather, scatter or scatter-add along `axis`, with inputs `[src, index]` (`index` i64,
    /// `src` of the output's dtype, all of one rank). Gather: `out[p] = src[p with coordinate
    /// axis replaced by index[p]]` over the output's positions. Scatter: for every position `p`
    /// of `index`, `out[p with coordinate axis replaced by index[p]] = src[p]` (or `+=` for
    /// [`IndexKind::ScatterAdd`]); `out` is read and written in place. Core guarantees that
    /// the other axes fit, and for a scatter that the indices are in range; with repeated
    /// indices a plain scatter's winning write is unspecified. A gather has a second output,
    /// a one-element u32 flag (zero before): it reads negative index values from the end of
    /// `src`'s axis, and sets the flag to 1 for a value still outside it (leaving that
    /// element unspecified), so the range check costs no pass of its own.
    Index {
        /// Gather, scatter or scatter-add.
        kind: IndexKind,
        /// The axis the index values select along.
        axis: usize,
    },
    /// A 2-D convolution pass over contiguous `[N, C, H, W]` operands of one float dtype
    /// (cross-correlation, zero padding, `groups` channel groups), accumulating in f32 for
    /// 16-bit floats: `Forward` reads `[x, w]` and writes `y`, `BackwardData` reads `[dy, w]`
    /// and writes `dx`, `BackwardFilter` reads `[x, dy]` and writes `dw`; the weight is
    /// `[O, C / groups, kH, kW]`. Each output is written whole (β = 0). The sum's order is the
    /// backend's (core's [`conv_plan`](crate::lower::conv_plan) is the implicit GEMM a backend
    /// without a convolution library renders).
    Convolution {
        /// Which of the three products.
        pass: ConvPass,
        /// Stride, padding, dilation and groups.
        geometry: ConvGeometry,
        /// f32 products may use TF32 (the device opted in with `set_allow_tf32`).
        tf32: bool,
    },
    /// A histogram: for each element `i` of input 0 (contiguous from offset 0, any shape), the
    /// bin `bin(x_i)`; output 0 (`[bins]`, contiguous, of dtype `u32`, `u64`, `f32` or `f64`,
    /// holding earlier counts) gets `+= 1` at that bin, or `+=` input 1's element `i` (laid out
    /// like input 0, of the output's dtype) when `weighted`. Bins outside `0..bins` are
    /// skipped. Float sums may add in any order.
    Histogram {
        /// How many bins the output has.
        bins: usize,
        /// An `i32` expression over input 0 (its only input) and the launch scalars, never
        /// reading the linear index.
        bin: Expr,
        /// Input 1 holds each element's weight.
        weighted: bool,
    },
    /// Layer norm over `rows` rows of `n` elements, each row read from memory once. Input 0
    /// is `x` (`[rows, n]`), then `γ` with `weight` and `β` with `bias` (each `[n]`), all
    /// contiguous and of one float dtype; launch scalar 0 is `eps`, in the dtype's
    /// [`accumulator`](DType::accumulator). Per row, in the accumulator dtype: `mean = Σx / n`,
    /// `var = Σ(x − mean)² / n` and `rstd = 1 / sqrt(var + eps)`; output 0 (`y`, `[rows, n]`)
    /// is `(x − mean)·rstd·γ + β` (without γ or β where not given) rounded once, outputs 1 and
    /// 2 (`[rows]`, the dtype) `mean` and `rstd` rounded (what the backward reads). Sums may
    /// add in any order. Only backends whose
    /// [`layer_norm_row`](crate::target::Target::layer_norm_row) is at least `n` get one.
    LayerNorm {
        /// An input is `γ`.
        weight: bool,
        /// The last input is `β`.
        bias: bool,
    },
    /// Layer norm's backward over `rows` rows of `n` elements, each row read from memory
    /// once. Inputs `[x, g, mean, rstd]`, then `γ` with `weight`: `x` and `g` (the upstream
    /// gradient) `[rows, n]`, `mean` and `rstd` `[rows]`, `γ` `[n]`, all contiguous and of one
    /// float dtype. With `x̂ = (x − mean)·rstd` and `ĝ = g·γ` (`g` without a weight), output 0
    /// (`dx`, `[rows, n]`) is `((ĝ − a) − x̂·b)·rstd` with `a = Σĝ / n` and `b = Σ(ĝ − a)·x̂ / n`
    /// over the row, computed in the dtype's [`accumulator`](DType::accumulator) and rounded
    /// once. With `columns`, outputs 1 and 2 (`[parts, n]`, of the accumulator dtype) get the
    /// column sums of `g·x̂` and of `g` over the rows `p, p + parts, p + 2·parts, …` in their
    /// row `p` (γ's and β's gradients are their sums over `parts`). Sums may add in any order
    /// (`b` may be taken as `(Σĝ·x̂ − a·Σx̂) / n`). Only backends whose
    /// [`layer_norm_row`](crate::target::Target::layer_norm_row) is at least
    /// `n` get one ([`layer_norm_plan`](crate::lower::layer_norm_plan)).
    LayerNormBackward {
        /// Input 4 is `γ`.
        weight: bool,
        /// Outputs 1 and 2 hold the column sums.
        columns: bool,
    },
    /// Per-channel statistics in one read of the input (batch norm's): input 0 is `x`,
    /// contiguous `[outer, channels, inner]` (`[N, C, H·W]`) of a float dtype; outputs 0 and 1
    /// (`[channels]`, the dtype) get each channel's mean and biased variance `Σ(x − mean)² / n`
    /// over its `n = outer·inner` values `x[o, c, i]`, computed in the dtype's
    /// [`accumulator`](DType::accumulator) and rounded once. Sums may add in any order, and a
    /// backend may split a channel into equal slices and merge their statistics
    /// ([`moments_plan`](crate::lower::moments_plan)); the variance must not be lost to
    /// cancellation (no `Σx² − (Σx)²/n`). Only backends whose
    /// [`channel_moments_dtypes`](crate::target::Target::channel_moments_dtypes) hold the
    /// dtype get one.
    ChannelMoments,
    /// Batch norm's backward sums in one read of its inputs: inputs `[x, g, mean, rstd]`, `x`
    /// and `g` (the upstream gradient) contiguous `[outer, channels, inner]`, `mean` and
    /// `rstd` contiguous `[channels]`, all of one float dtype; outputs 0 and 1 (`[channels]`,
    /// the dtype) get each channel's `Σg` and `Σg·(x − mean)·rstd` over its `outer·inner`
    /// values, computed in the dtype's [`accumulator`](DType::accumulator) and rounded once
    /// (β's and γ's gradients, and the sums `dx` reads). Sums may add in any order and a
    /// backend may split a channel into slices as for
    /// [`ChannelMoments`](Kernel::ChannelMoments). Only backends whose
    /// [`channel_sums_dtypes`](crate::target::Target::channel_sums_dtypes) hold the dtype get
    /// one.
    ChannelGradSums,
}

impl Kernel {
    /// The kind of kernel, in a word (`map`, `reduce`, `matmul`, …).
    ///
    /// ```
    /// use strata_core::{DType, ir::{Expr, Kernel}};
    /// assert_eq!(Kernel::map(Expr::input(0, DType::F32)).kind_name(), "map");
    /// ```
    pub fn kind_name(&self) -> &'static str {
        match self {
            Kernel::Map { .. } => "map",
            Kernel::Reduce { .. } => "reduce",
            Kernel::Matmul { .. } => "matmul",
            Kernel::Softmax { .. } => "softmax",
            Kernel::Index { .. } => "index",
            Kernel::Histogram { .. } => "histogram",
            Kernel::Convolution { .. } => "convolution",
            Kernel::LayerNorm { .. } => "layer_norm",
            Kernel::LayerNormBackward { .. } => "layer_norm_backward",
            Kernel::ChannelMoments => "channel_moments",
            Kernel::ChannelGradSums => "channel_grad_sums",
        }
    }

    /// A single-output map writing `expr`.
    ///
    /// ```
    /// use strata_core::{DType, ir::{Expr, Kernel}};
    /// let Kernel::Map { also, .. } = Kernel::map(Expr::input(0, DType::F32)) else { unreachable!() };
    /// assert!(also.is_empty());
    /// ```
    pub fn map(expr: Expr) -> Kernel {
        Kernel::Map {
            expr,
            also: Vec::new(),
        }
    }
}

/// Which product a [`Kernel::Convolution`] computes: the convolution, or one of its two
/// gradients (each the other two's transpose, so each pass's gradient is the other passes).
///
/// ```
/// use strata_core::ir::ConvPass;
/// assert_eq!(ConvPass::BackwardFilter.name(), "conv2d backward filter");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConvPass {
    /// `y = conv(x, w)`.
    Forward,
    /// The input's gradient `dx` from `dy` and `w`.
    BackwardData,
    /// The weight's gradient `dw` from `x` and `dy`.
    BackwardFilter,
}

impl ConvPass {
    /// The pass as the profiler and `explain` name it.
    pub fn name(self) -> &'static str {
        match self {
            ConvPass::Forward => "conv2d",
            ConvPass::BackwardData => "conv2d backward data",
            ConvPass::BackwardFilter => "conv2d backward filter",
        }
    }
}

/// A 2-D convolution's stride, zero padding and dilation along (height, width), and its
/// channel groups.
///
/// ```
/// use strata_core::ir::ConvGeometry;
/// let g = ConvGeometry { stride: [2, 2], padding: [1, 1], dilation: [1, 1], groups: 1 };
/// assert_eq!(g.out_len(0, 7, 3), 4);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConvGeometry {
    /// Step between windows.
    pub stride: [usize; 2],
    /// Zeros added on each side.
    pub padding: [usize; 2],
    /// Step between a window's taps.
    pub dilation: [usize; 2],
    /// Channel groups (input and output channels divide into them).
    pub groups: usize,
}

impl ConvGeometry {
    /// Output length along `axis` (0: height, 1: width) of an input of length `len` and a
    /// kernel of `k` taps; 0 when the window does not fit.
    pub fn out_len(&self, axis: usize, len: usize, k: usize) -> usize {
        let span = self.dilation[axis] * (k.max(1) - 1) + 1;
        let padded = len + 2 * self.padding[axis];
        if k == 0 || padded < span || self.stride[axis] == 0 {
            return 0;
        }
        (padded - span) / self.stride[axis] + 1
    }
}

/// What a [`Kernel::Index`] does.
///
/// ```
/// use strata_core::ir::IndexKind;
/// assert!(IndexKind::ScatterAdd.writes_through_index());
/// assert!(!IndexKind::Gather.writes_through_index());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IndexKind {
    /// Reads `src` where the index points.
    Gather,
    /// Writes `src` where the index points.
    Scatter,
    /// Adds `src` where the index points.
    ScatterAdd,
}

impl IndexKind {
    /// True for the scatters, which write the output where the index points.
    pub fn writes_through_index(self) -> bool {
        self != IndexKind::Gather
    }
}

/// A reduction that a fused reduction's map reads, computed by the same kernel before it
/// (`(x - x.max(-1, true)).exp().sum(-1)`: the maximum, then the sum, each row read once).
/// Per output it folds `op` over the elements of input `source` (laid out like input 0) and
/// writes the result to output 1 (the shape and dtype of input `source`'s leading axes'
/// values, one per output); input `result` is a view of that same buffer holding one value
/// per output, which the map reads. The map's elements, their order and the main
/// reduction's numbers are the ones the two reductions give run one after the other
/// ([`lower::prologue::split`](crate::lower::prologue::split) runs them so), so a backend may run
/// it in one pass or in two.
///
/// ```
/// use strata_core::ir::{RowPrologue, ReduceOp};
/// let p = RowPrologue { op: ReduceOp::Max, source: 0, result: 1 };
/// assert!(p.op.is_order_free());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RowPrologue {
    /// What the prologue combines: an order-free op (max or min), or a sum (on backends whose
    /// [`fuses_sum_prologue`](crate::target::Target::fuses_sum_prologue) is true, which says
    /// in what order they add it).
    pub op: ReduceOp,
    /// The input it reads, element by element.
    pub source: usize,
    /// The input through which the map reads its result (output 1's buffer).
    pub result: usize,
}

/// Elementwise work that reads a reduction's result, computed by the same kernel after it
/// (`e / e.sum(-1, true)` after `e = (x - x.max(-1, true)).exp()`: softmax from its
/// primitives, each row read once). Its output is the reduction's last output, laid out over
/// input 0's shape (the kept axes, then the reduced ones); each element is `expr` over the
/// reduction's inputs at that position and the launch scalars, where input `result` is a
/// view of output 0's buffer holding one value per output: the reduction's result as
/// stored. Its numbers are those of the reduction followed by a map of `expr`
/// ([`lower::prologue::split`](crate::lower::prologue::split) runs them so), so a backend
/// may run it in one pass or in two.
///
/// ```
/// use strata_core::ir::{BinaryOp, Expr, RowEpilogue};
/// use strata_core::DType;
/// // Each element over its row's sum (input 1).
/// let expr = Expr::binary(BinaryOp::Div, Expr::input(0, DType::F32), Expr::input(1, DType::F32));
/// let e = RowEpilogue { expr, result: 1 };
/// assert_eq!(e.result, 1);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RowEpilogue {
    /// The value of each output element. It never reads the linear index.
    pub expr: Expr,
    /// The input through which it reads the reduction's result (output 0's buffer).
    pub result: usize,
}

/// Reductions of the IR (see [`Kernel::Reduce`]).
///
/// ```
/// use strata_core::ir::ReduceOp;
/// assert!(ReduceOp::ArgMax.returns_index());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Σ; 0 for an empty extent. Integers wrap.
    Sum,
    /// Π; 1 for an empty extent. Integers wrap.
    Prod,
    /// The smallest element; NaN if any element is NaN.
    Min,
    /// The largest element; NaN if any element is NaN.
    Max,
    /// The row-major position within the reduced axes of the first smallest element (the first
    /// NaN if any), as `i64`.
    ArgMin,
    /// The position of the first largest element (the first NaN if any), as `i64`.
    ArgMax,
    /// Whether any element is non-zero, as `bool`; false for an empty extent.
    Any,
    /// Whether every element is non-zero, as `bool`; true for an empty extent.
    All,
}

impl ReduceOp {
    /// The op's name (`sum`, `arg_max`).
    ///
    /// ```
    /// assert_eq!(strata_core::ir::ReduceOp::ArgMax.name(), "arg_max");
    /// ```
    pub fn name(self) -> String {
        snake(format!("{self:?}"))
    }

    /// True for `ArgMin` and `ArgMax`, whose result is an `i64` position.
    ///
    /// ```
    /// assert!(!strata_core::ir::ReduceOp::Sum.returns_index());
    /// ```
    pub fn returns_index(self) -> bool {
        matches!(self, ReduceOp::ArgMin | ReduceOp::ArgMax)
    }

    /// True for `Min` and `Max`: their result does not depend on the order the elements are
    /// combined in (-0 is below +0 and NaN wins, on every backend), so any kernel computes
    /// the eager value — up to which NaN's bits a row of several NaNs keeps.
    ///
    /// ```
    /// use strata_core::ir::ReduceOp;
    /// assert!(ReduceOp::Max.is_order_free() && !ReduceOp::Sum.is_order_free());
    /// ```
    pub fn is_order_free(self) -> bool {
        matches!(self, ReduceOp::Min | ReduceOp::Max)
    }
}
