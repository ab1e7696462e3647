//! Counter-based random numbers: Philox4x32-10 and a [`Generator`] whose state is a seed and an
//! offset, so the same seed gives the same numbers on every backend and a state can be saved
//! and restored (neon's `rng_get_state` / `rng_set_state`).

use crate::device::Device;
use crate::dtype::{DType, Scalar};
use crate::error::{Error, Result};
use crate::fusion::defer_or_launch;
use crate::ir::{BinaryOp, Expr, Node, PhiloxWord, UnaryOp};
use crate::layout::IntoDims;
use crate::layout::Layout;
use crate::tensor::Tensor;

pub use crate::ir::philox4x32_10;

/// The state of a random stream: a seed and how many counters have been used. Each draw
/// takes one counter per two or four elements (one Philox call makes four 32-bit words) and
/// advances the offset.
///
/// ```
/// use strata_core::{random::Generator, Device, DType, Tensor};
/// let dev = Device::cpu();
/// let mut g = Generator::new(42);
/// let saved = g.state();
/// let a = Tensor::rand([3], DType::F32, &mut g, &dev).unwrap();
/// g.set_state(saved);
/// let b = Tensor::rand([3], DType::F32, &mut g, &dev).unwrap();
/// assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generator {
    seed: u64,
    offset: u64,
}

impl Generator {
    /// A generator at offset 0 of `seed`.
    ///
    /// ```
    /// assert_eq!(strata_core::random::Generator::new(7).state(), (7, 0));
    /// ```
    pub fn new(seed: u64) -> Generator {
        Generator { seed, offset: 0 }
    }

    /// `(seed, offset)`.
    ///
    /// ```
    /// let g = strata_core::random::Generator::new(1);
    /// assert_eq!(g.state().1, 0);
    /// ```
    pub fn state(&self) -> (u64, u64) {
        (self.seed, self.offset)
    }

    /// Restores a state from [`state`](Generator::state).
    ///
    /// ```
    /// let mut g = strata_core::random::Generator::new(1);
    /// g.set_state((5, 100));
    /// assert_eq!(g.state(), (5, 100));
    /// ```
    pub fn set_state(&mut self, (seed, offset): (u64, u64)) {
        self.seed = seed;
        self.offset = offset;
    }

    /// The launch scalars for a draw of `n` counters (key, first counter), advancing the
    /// offset.
    pub(crate) fn take(&mut self, n: usize) -> Vec<Scalar> {
        let scalars = vec![Scalar::U64(self.seed), Scalar::U64(self.offset)];
        self.offset = self.offset.wrapping_add(n as u64);
        scalars
    }
}

/// How a draw spreads Philox's four words over elements: `per_counter` neighbours share one
/// counter (one Philox call), and groups of `shared` neighbours read the same words.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lanes {
    pub(crate) per_counter: u8,
    shared: u8,
}

impl Lanes {
    const fn new(per_counter: u8, shared: u8) -> Lanes {
        Lanes {
            per_counter,
            shared,
        }
    }
}

/// Four elements per counter, one word each (32-bit draws).
pub(crate) const ONE_WORD: Lanes = Lanes::new(4, 1);
/// Eight elements per counter, pairs sharing a word: 16 random bits each (the element's half
/// of the word, by its parity), for stochastic rounding that drops at most 16 bits.
pub(crate) const HALF_WORDS: Lanes = Lanes::new(8, 2);
/// Two elements per counter, two words each (64-bit draws).
pub(crate) const TWO_WORDS: Lanes = Lanes::new(2, 1);
/// Two Box–Muller pairs per counter, two words (two 32-bit uniforms) per pair.
const PAIRS_OF_TWO_WORDS: Lanes = Lanes::new(4, 2);
/// One Box–Muller pair per counter, all four words (two 53-bit uniforms).
const PAIR_OF_FOUR_WORDS: Lanes = Lanes::new(2, 2);

/// Word `word` of this element's group of Philox words, as u32.
pub(crate) fn word32(word: u8, lanes: Lanes) -> Expr {
    Expr {
        dtype: DType::U32,
        node: Node::Philox(PhiloxWord {
            key: 0,
            counter: 1,
            word,
            per_counter: lanes.per_counter,
            shared: lanes.shared,
        }),
    }
}

/// Word `word` of this element's group of Philox words, as u64.
fn bits(word: u8, lanes: Lanes) -> Expr {
    word32(word, lanes).cast(DType::U64, false)
}

fn bin(op: BinaryOp, a: Expr, b: Expr) -> Expr {
    Expr::binary(op, a, b)
}

/// A uniform value in `[0, 1)` as f64 with 53 random bits from words `w`, `w + 1`.
///
/// The transforms' constants (shifts, scales, Box–Muller's 1, -2 and 2π) are literals, not
/// launch scalars: a GPU compiler folds them (a shift by a known count needs no range test),
/// which made CUDA's `randn` 4% faster on an H100 (BENCHMARKS.md). The values are the same.
pub(crate) fn uniform53(w: u8, lanes: Lanes) -> Expr {
    let hi = bin(
        BinaryOp::Shl,
        bits(w, lanes),
        Expr::literal(Scalar::U64(21)),
    );
    let lo = bin(
        BinaryOp::Shr,
        bits(w + 1, lanes),
        Expr::literal(Scalar::U64(11)),
    );
    let m = bin(BinaryOp::BitOr, hi, lo).cast(DType::F64, false);
    bin(BinaryOp::Mul, m, Expr::literal(Scalar::F64(2f64.powi(-53))))
}

/// A uniform value in `[0, 1)` as f32 from the top `bits` bits of word `w` (exact: `bits` is
/// at most 24, and the value rounds to no float type with as many significant bits).
pub(crate) fn uniform_f32(w: u8, lanes: Lanes, bits: u32) -> Expr {
    // 32-bit integer work: a GPU converts u32 to f32 in one instruction, u64 in several.
    let top = bin(
        BinaryOp::Shr,
        word32(w, lanes),
        Expr::literal(Scalar::U32(32 - bits)),
    );
    bin(
        BinaryOp::Mul,
        top.cast(DType::F32, false),
        Expr::literal(Scalar::F32(2f32.powi(-(bits as i32)))),
    )
}

/// The significant bits of a float dtype's uniform draws: every value `k · 2^-bits` is exact
/// in the dtype and below 1.
fn uniform_bits(dtype: DType) -> u32 {
    match dtype {
        DType::F16 => 11,
        DType::BF16 => 8,
        _ => 24,
    }
}

/// Box–Muller: `sqrt(-2 ln u1) · cos(2π u2)` for the even element of a pair, `… · sin(2π u2)`
/// for the odd one, with `u1` in `(0, 1]`; in the dtype of `u1` and `u2`. The parity test's
/// 1 and 0 are literals too: a GPU whose lanes know their parity at compile time then
/// evaluates only the branch each lane takes.
fn box_muller(u1: Expr, u2: Expr) -> Expr {
    let dtype = u1.dtype;
    let f = |x: f64| Expr::literal(Scalar::F64(x).cast(dtype, false));
    let i = |x: i64| Expr::literal(Scalar::I64(x));
    let radius = Expr::unary(
        UnaryOp::Sqrt,
        bin(
            BinaryOp::Mul,
            f(-2.0),
            Expr::unary(UnaryOp::Log, bin(BinaryOp::Sub, f(1.0), u1)),
        ),
    );
    let angle = bin(BinaryOp::Mul, f(std::f64::consts::TAU), u2);
    let odd = bin(BinaryOp::BitAnd, Expr::linear_index(), i(1));
    let even = bin(BinaryOp::Eq, odd, i(0));
    let trig = Expr::select(
        even,
        Expr::unary(UnaryOp::Cos, angle.clone()),
        Expr::unary(UnaryOp::Sin, angle),
    );
    bin(BinaryOp::Mul, radius, trig)
}

/// The expression [`Tensor::randn`] evaluates in f32 (for f32, f16 and bf16, then rounded):
/// element `i`'s normal over its Philox words and the launch scalars 0–1 (the generator's key
/// and counter, u64); its constants are literals. The renderers' tests build kernels of it.
///
/// ```
/// use strata_core::{random::randn_f32_expr, DType};
/// let e = randn_f32_expr();
/// assert_eq!(e.dtype, DType::F32);
/// assert!(e.reads_linear_index()); // a pair's parity picks the cosine or the sine
/// ```
pub fn randn_f32_expr() -> Expr {
    let lanes = PAIRS_OF_TWO_WORDS;
    box_muller(uniform_f32(0, lanes, 24), uniform_f32(1, lanes, 24))
}

/// The dtypes of every launch scalar [`randn_f32_expr`] reads, in order, as a kernel
/// signature lists them: the generator's key and counter.
///
/// ```
/// use strata_core::{random::randn_f32_scalar_dtypes, DType};
/// assert_eq!(randn_f32_scalar_dtypes(), [DType::U64, DType::U64]);
/// ```
pub fn randn_f32_scalar_dtypes() -> Vec<DType> {
    vec![DType::U64, DType::U64]
}

/// A new tensor of `dims` holding `expr` (which reads the generator's two scalars, then
/// `extra`), taking one counter per `lanes.per_counter` elements from `gen`.
#[track_caller]
fn draw(
    dims: impl IntoDims,
    dtype: DType,
    gen: &mut Generator,
    device: &Device,
    lanes: Lanes,
    extra: Vec<Scalar>,
    expr: Expr,
) -> Result<Tensor> {
    let layout = Layout::contiguous(&crate::layout::shape_arg(dims)?)?;
    device.backend().check_dtype(dtype)?;
    let mut scalars = gen.take(layout.numel().div_ceil(lanes.per_counter as usize));
    scalars.extend(extra);
    let expr = expr.cast(dtype, false);
    defer_or_launch(expr, layout, vec![], scalars, device, "random")
}

fn check_float(dtype: DType, what: &str) -> Result<()> {
    if !dtype.is_float() {
        return Err(Error::DType(format!(
            "{what} makes floats, not {dtype}; use randint for integers"
        )));
    }
    Ok(())
}

impl Tensor {
    /// Uniform values in `[0, 1)`: multiples of `2^-b` with `b` random bits, as many as the
    /// dtype holds exactly (f64 53, f32 24, f16 11, bf16 8), so no value rounds up to 1.
    /// f64 draws take two Philox words per element, the others one.
    ///
    /// ```
    /// use strata_core::{random::Generator, Device, DType, Tensor};
    /// let mut g = Generator::new(0);
    /// let t = Tensor::rand([1000], DType::F64, &mut g, &Device::cpu()).unwrap();
    /// let v = t.to_vec::<f64>().unwrap();
    /// assert!(v.iter().all(|&x| (0.0..1.0).contains(&x)));
    /// ```
    #[track_caller]
    pub fn rand(
        dims: impl IntoDims,
        dtype: DType,
        gen: &mut Generator,
        device: &Device,
    ) -> Result<Tensor> {
        check_float(dtype, "rand")?;
        if dtype == DType::F64 {
            let expr = uniform53(0, TWO_WORDS);
            return draw(dims, dtype, gen, device, TWO_WORDS, vec![], expr);
        }
        let expr = uniform_f32(0, ONE_WORD, uniform_bits(dtype));
        draw(dims, dtype, gen, device, ONE_WORD, vec![], expr)
    }

    /// Standard normal values by Box–Muller: neighbouring elements `2k` and `2k + 1` are the
    /// cosine and sine halves of one pair of uniforms. f64 computes in f64 from two 53-bit
    /// uniforms (one Philox call per pair); the other float dtypes compute in f32 from two
    /// 24-bit uniforms (one Philox call per two pairs), then round.
    ///
    /// ```
    /// use strata_core::{ops::Axes, random::Generator, Device, DType, Tensor};
    /// let mut g = Generator::new(3);
    /// let t = Tensor::randn([20000], DType::F32, &mut g, &Device::cpu()).unwrap();
    /// let mean = t.mean(Axes::All, false).unwrap().item::<f32>().unwrap();
    /// let std = t.std(Axes::All, 1, false).unwrap().item::<f32>().unwrap();
    /// assert!(mean.abs() < 0.03 && (std - 1.0).abs() < 0.03);
    /// ```
    #[track_caller]
    pub fn randn(
        dims: impl IntoDims,
        dtype: DType,
        gen: &mut Generator,
        device: &Device,
    ) -> Result<Tensor> {
        check_float(dtype, "randn")?;
        if dtype == DType::F64 {
            let lanes = PAIR_OF_FOUR_WORDS;
            let expr = box_muller(uniform53(0, lanes), uniform53(2, lanes));
            return draw(dims, dtype, gen, device, lanes, vec![], expr);
        }
        let expr = randn_f32_expr();
        draw(dims, dtype, gen, device, PAIRS_OF_TWO_WORDS, vec![], expr)
    }

    /// Integers uniform in `low..high` as an integer dtype: a random word modulo the range, of
    /// 32 bits when the range is below 2^32 (one Philox word per element), else of 64.
    ///
    /// ```
    /// use strata_core::{random::Generator, Device, DType, Tensor};
    /// let mut g = Generator::new(9);
    /// let t = Tensor::randint(-3, 3, [500], DType::I8, &mut g, &Device::cpu()).unwrap();
    /// let v = t.to_vec::<i8>().unwrap();
    /// assert!(v.iter().all(|&x| (-3..3).contains(&x)) && v.contains(&-3) && v.contains(&2));
    /// ```
    #[track_caller]
    pub fn randint(
        low: i64,
        high: i64,
        dims: impl IntoDims,
        dtype: DType,
        gen: &mut Generator,
        device: &Device,
    ) -> Result<Tensor> {
        if !dtype.is_int() || low >= high {
            return Err(Error::Invalid(format!(
                "randint({low}, {high}) as {dtype}: needs low < high and an integer dtype"
            )));
        }
        let span = (high as i128 - low as i128) as u64;
        let low_at = |k| Expr::scalar(k, DType::I64);
        if span <= u32::MAX as u64 {
            // A 32-bit word modulo a 32-bit range: 32-bit arithmetic (a 64-bit modulo is a
            // long instruction sequence on a GPU).
            let extra = vec![Scalar::U32(span as u32), Scalar::I64(low)];
            let r = bin(
                BinaryOp::Rem,
                word32(0, ONE_WORD),
                Expr::scalar(2, DType::U32),
            );
            let v = bin(BinaryOp::Add, r.cast(DType::I64, false), low_at(3));
            return draw(dims, dtype, gen, device, ONE_WORD, extra, v);
        }
        // The range and `low` stay launch scalars: one kernel serves every range.
        let extra = vec![Scalar::U64(span), Scalar::I64(low)];
        let hi = bin(
            BinaryOp::Shl,
            bits(0, TWO_WORDS),
            Expr::literal(Scalar::U64(32)),
        );
        let word = bin(BinaryOp::BitOr, hi, bits(1, TWO_WORDS));
        let r = bin(BinaryOp::Rem, word, Expr::scalar(2, DType::U64)).cast(DType::I64, false);
        let v = bin(BinaryOp::Add, r, low_at(3));
        draw(dims, dtype, gen, device, TWO_WORDS, extra, v)
    }

    /// 1 with probability `p`, else 0, as `dtype` (a uniform draw compared with `p`).
    ///
    /// ```
    /// use strata_core::{ops::Axes, random::Generator, Device, DType, Tensor};
    /// let mut g = Generator::new(5);
    /// let t = Tensor::bernoulli([10000], 0.25, DType::F32, &mut g, &Device::cpu()).unwrap();
    /// let frac = t.mean(Axes::All, false).unwrap().item::<f32>().unwrap();
    /// assert!((frac - 0.25).abs() < 0.02);
    /// ```
    #[track_caller]
    pub fn bernoulli(
        dims: impl IntoDims,
        p: f64,
        dtype: DType,
        gen: &mut Generator,
        device: &Device,
    ) -> Result<Tensor> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::Invalid(format!(
                "bernoulli probability {p} is outside [0, 1]"
            )));
        }
        let hit = bin(
            BinaryOp::Lt,
            uniform53(0, TWO_WORDS),
            Expr::scalar(2, DType::F64),
        );
        draw(
            dims,
            dtype,
            gen,
            device,
            TWO_WORDS,
            vec![Scalar::F64(p)],
            hit,
        )
    }

    /// A dropout mask: 0 with probability `p`, else `1 / (1 - p)` (so the expectation is 1).
    ///
    /// ```
    /// use strata_core::{random::Generator, Device, DType, Tensor};
    /// let mut g = Generator::new(1);
    /// let m = Tensor::dropout_mask([8], 0.5, DType::F32, &mut g, &Device::cpu()).unwrap();
    /// assert!(m.to_vec::<f32>().unwrap().iter().all(|&x| x == 0.0 || x == 2.0));
    /// ```
    #[track_caller]
    pub fn dropout_mask(
        dims: impl IntoDims,
        p: f64,
        dtype: DType,
        gen: &mut Generator,
        device: &Device,
    ) -> Result<Tensor> {
        check_float(dtype, "dropout_mask")?;
        if !(0.0..1.0).contains(&p) {
            return Err(Error::Invalid(format!(
                "dropout probability {p} is outside [0, 1)"
            )));
        }
        Tensor::bernoulli(dims, 1.0 - p, dtype, gen, device)?.mul(1.0 / (1.0 - p))
    }
}
