//! Stochastic rounding (neon's `stochastic_round=N`): a value between two neighbours of a
//! coarser float grid becomes the upper one with probability equal to its distance from the
//! lower one over the gap, so the rounding is unbiased and small updates survive on average.
//!
//! Built from IR nodes only (a float's bits, a Philox word, integer adds and masks), so it is
//! one map on every backend, fuses into a chain like any cast, and gives the same bits on
//! every backend for a generator's state.
//!
//! The grid of `n` mantissa bits is rounded to in the float's own bits: adding `d = m − n`
//! random bits (`m` the source's mantissa bits) to the bit pattern and clearing the low `d`
//! rounds the magnitude up exactly when the random bits reach past the dropped ones, which
//! happens with probability `dropped / 2^d`. Bit patterns are monotonic in the magnitude, and
//! the carry walks into the exponent, so this holds across binades, in the subnormals and up
//! to infinity. Where the target has fewer exponents than the source (f32 → f16, f64 → f32)
//! values below its smallest normal lie on its subnormal grid `g`: there `x / g` is split
//! into its floor and fraction (both exact) and a uniform draw below the fraction rounds up.

use crate::autograd;
use crate::dtype::{DType, FloatFormat, Scalar};
use crate::error::{Error, Result};
use crate::fusion::defer_or_launch;
use crate::ir::{BinaryOp, Expr, UnaryOp};
use crate::layout::Layout;
use crate::random::{uniform53, word32, Generator, Lanes, HALF_WORDS, ONE_WORD, TWO_WORDS};
use crate::tensor::Tensor;

fn bin(op: BinaryOp, a: Expr, b: Expr) -> Expr {
    Expr::binary(op, a, b)
}

/// A float dtype's stored mantissa bits (0 for other dtypes).
fn mantissa_bits(d: DType) -> u32 {
    d.float_format().map_or(0, |f| f.mantissa_bits)
}

/// The unsigned integer dtype of a float's size.
fn bits_dtype(d: DType) -> DType {
    match d.itemsize() {
        2 => DType::U16,
        4 => DType::U32,
        _ => DType::U64,
    }
}

/// `2^e` as a literal of float dtype `d` (exact: callers stay within `d`'s range).
fn power_of_two(d: DType, e: i32) -> Expr {
    Expr::literal(Scalar::F64(2f64.powi(e)).cast(d, false))
}

/// The integer literal `v` of dtype `d`.
fn int(d: DType, v: u64) -> Expr {
    Expr::literal(Scalar::U64(v).cast(d, false))
}

/// What one rounding draws: 16 bits per element where at most 16 are dropped (half a Philox
/// word, so one Philox call serves eight elements: the rounding then costs about what a plain
/// cast does), 32 where more are, 64 from f64.
fn lanes_for(source: DType, dropped: u32) -> Lanes {
    match source {
        DType::F64 => TWO_WORDS,
        _ if dropped <= 16 => HALF_WORDS,
        _ => ONE_WORD,
    }
}

/// The element's random bits as u32: 16 (its half of a shared word, by its position's
/// parity) or 32, per `lanes`.
fn word_bits(lanes: Lanes) -> (Expr, u32) {
    let word = word32(0, lanes);
    if lanes.per_counter != HALF_WORDS.per_counter {
        return (word, 32);
    }
    let odd = bin(
        BinaryOp::BitAnd,
        Expr::linear_index(),
        Expr::literal(Scalar::I64(1)),
    );
    let shift = bin(
        BinaryOp::Mul,
        odd.cast(DType::U32, false),
        int(DType::U32, 16),
    );
    let half = bin(
        BinaryOp::BitAnd,
        bin(BinaryOp::Shr, word, shift),
        int(DType::U32, 0xffff),
    );
    (half, 16)
}

/// `dropped` random bits (1 ≤ dropped ≤ 52) as the unsigned dtype of `source`'s size.
fn random_bits(source: DType, dropped: u32, lanes: Lanes) -> Expr {
    let u = bits_dtype(source);
    if source == DType::F64 {
        let hi = bin(
            BinaryOp::Shl,
            word32(0, TWO_WORDS).cast(DType::U64, false),
            int(DType::U64, 32),
        );
        let word = bin(
            BinaryOp::BitOr,
            hi,
            word32(1, TWO_WORDS).cast(DType::U64, false),
        );
        return bin(BinaryOp::Shr, word, int(DType::U64, 64 - dropped as u64));
    }
    let (bits, width) = word_bits(lanes);
    bin(
        BinaryOp::Shr,
        bits,
        int(DType::U32, (width - dropped) as u64),
    )
    .cast(u, false)
}

/// `x` (of float dtype `source`) rounded at random to `bits` mantissa bits, keeping the
/// source's exponent range: the bit pattern plus `m − bits` random bits, low bits cleared.
fn round_bits(x: Expr, bits: u32, lanes: Lanes) -> Expr {
    let source = x.dtype;
    let m = source.float_format().expect("a float").mantissa_bits;
    let dropped = m - bits;
    let u = bits_dtype(source);
    let raised = bin(
        BinaryOp::Add,
        x.bitcast(u),
        random_bits(source, dropped, lanes),
    );
    let mask = !((1u64 << dropped) - 1) & (u64::MAX >> (64 - 8 * source.itemsize()));
    bin(BinaryOp::BitAnd, raised, int(u, mask)).bitcast(source)
}

/// `x` rounded at random onto the subnormal grid `g = 2^(min_exponent − mantissa_bits)` of
/// `target` (valid where `|x|` is below its smallest normal): the floor of `|x| / g` plus one
/// when a uniform draw falls below the fraction, times `g`, with `x`'s sign (a negative value
/// that rounds to zero gives −0, as rounding to nearest would); every step is exact.
fn round_subnormal(x: Expr, target: FloatFormat, lanes: Lanes) -> Expr {
    let source = x.dtype;
    let grid = target.min_exponent - target.mantissa_bits as i32;
    let magnitude = Expr::unary(UnaryOp::Abs, x.clone());
    let q = bin(BinaryOp::Mul, magnitude, power_of_two(source, -grid));
    let low = Expr::unary(UnaryOp::Floor, q.clone());
    let fraction = bin(BinaryOp::Sub, q, low.clone());
    let uniform = if source == DType::F64 {
        uniform53(0, TWO_WORDS)
    } else {
        // The element's 16 or 32 random bits as a fraction (exact in f32: at most 24 bits).
        let (bits, width) = word_bits(lanes);
        let top = bin(
            BinaryOp::Shr,
            bits,
            int(DType::U32, width.saturating_sub(24) as u64),
        );
        let scale = -(width.min(24) as i32);
        bin(
            BinaryOp::Mul,
            top.cast(DType::F32, false),
            power_of_two(DType::F32, scale),
        )
        .cast(source, false)
    };
    let up = bin(BinaryOp::Lt, uniform, fraction).cast(source, false);
    let steps = bin(BinaryOp::Add, low, up);
    let rounded = bin(BinaryOp::Mul, steps, power_of_two(source, grid));
    let u = bits_dtype(source);
    let sign_bit = 1u64 << (8 * source.itemsize() - 1);
    let negative = bin(BinaryOp::Ge, x.bitcast(u), int(u, sign_bit));
    Expr::select(
        negative,
        Expr::unary(UnaryOp::Neg, rounded.clone()),
        rounded,
    )
}

/// The stochastic rounding of input 0 (of float dtype `source`) onto the grid of `target`'s
/// mantissa bits and smallest exponent, in `source`; NaN and ±inf pass through.
fn stochastic_expr(source: DType, target: FloatFormat) -> Expr {
    stochastic_of(Expr::input(0, source), target)
}

/// [`stochastic_expr`] of the value `x` (any float expression) instead of input 0.
fn stochastic_of(x: Expr, target: FloatFormat) -> Expr {
    let source = x.dtype;
    let own = source.float_format().expect("a float");
    let lanes = lanes_for(source, own.mantissa_bits - target.mantissa_bits);
    let mut rounded = round_bits(x.clone(), target.mantissa_bits, lanes);
    if target.min_exponent > own.min_exponent {
        let small = bin(
            BinaryOp::Lt,
            Expr::unary(UnaryOp::Abs, x.clone()),
            power_of_two(source, target.min_exponent),
        );
        rounded = Expr::select(small, round_subnormal(x.clone(), target, lanes), rounded);
    }
    let finite = Expr::unary(UnaryOp::IsFinite, x.clone());
    Expr::select(finite, rounded, x)
}

/// The map [`Tensor::to_dtype_stochastic`] runs: input 0 of float dtype `source` rounded at
/// random to the float `target`, reading the generator's key and counter as launch scalars 0
/// and 1 (u64), one Philox word per element (two from f64). The renderers' tests compile it.
///
/// ```
/// use strata_core::{stochastic_round::stochastic_round_expr, DType};
/// let e = stochastic_round_expr(DType::F32, DType::F16).unwrap();
/// assert_eq!(e.dtype, DType::F16);
/// assert!(e.draws_random());
/// assert!(stochastic_round_expr(DType::F16, DType::F32).is_err()); // wider
/// ```
pub fn stochastic_round_expr(source: DType, target: DType) -> Result<Expr> {
    let (Some(own), Some(format)) = (source.float_format(), target.float_format()) else {
        return Err(Error::DType(format!(
            "to_dtype_stochastic converts floats to floats, not {source} to {target}"
        )));
    };
    let narrower = format.mantissa_bits < own.mantissa_bits
        && format.min_exponent >= own.min_exponent
        && format.max_exponent <= own.max_exponent;
    if !narrower {
        return Err(Error::DType(format!(
            "to_dtype_stochastic rounds to a narrower float: {source} to {target} is not \
             (f64 → f32, f32 or f64 → f16 or bf16)"
        )));
    }
    Ok(stochastic_expr(source, format).cast(target, false))
}

/// `x` (an expression of f32 or f64) rounded at random to the narrower float `target`, for a
/// kernel that computes a value and stores it in a 16-bit float (an optimizer's bf16 update):
/// the expression and how many elements share one Philox counter (the launch takes
/// `numel.div_ceil(per_counter)` counters). It reads the generator's key and counter as
/// launch scalars 0 and 1. `None` when `target` is not narrower than `x`'s dtype.
pub(crate) fn stochastic_round_of(x: Expr, target: DType) -> Option<(Expr, usize)> {
    let (own, format) = (x.dtype.float_format()?, target.float_format()?);
    let narrower = format.mantissa_bits < own.mantissa_bits
        && format.min_exponent >= own.min_exponent
        && format.max_exponent <= own.max_exponent;
    if !narrower {
        return None;
    }
    let lanes = lanes_for(x.dtype, own.mantissa_bits - format.mantissa_bits);
    let rounded = stochastic_of(x, format).cast(target, false);
    Some((rounded, lanes.per_counter as usize))
}

impl Tensor {
    /// A copy converted to the narrower float `dtype` (f64 → f32, and f32 or f64 → f16 or
    /// bf16) with stochastic rounding: a value between two neighbours of `dtype` becomes the
    /// upper one with probability equal to its distance from the lower one over the gap,
    /// drawn from `gen` (Philox, so a state gives the same bits on every backend). Exact
    /// values stay, NaN, ±inf and ±0 are kept, and values past the largest finite one round
    /// to infinity in proportion. Probabilities are exact to the last dropped bit (below
    /// f16's smallest normal from f32, where the grid is f16's subnormal one, to 2^-16; below
    /// f32's or f16's from f64, to 2^-53). An element takes 16 random bits where at most 16
    /// are dropped (f32 → bf16 or f16), else 32 (64 from f64). The gradient is the plain
    /// cast's.
    ///
    /// ```
    /// use strata_core::{random::Generator, Device, DType, Tensor};
    /// let mut g = Generator::new(0);
    /// // 1 + 2^-9 lies a quarter of the way from 1 to bf16's next value, 1 + 2^-7.
    /// let x = Tensor::full([10000], 1.0 + 2f32.powi(-9), DType::F32, &Device::cpu()).unwrap();
    /// let r = x.to_dtype_stochastic(DType::BF16, &mut g).unwrap().to_dtype(DType::F64).unwrap();
    /// let v = r.to_vec::<f64>().unwrap();
    /// assert!(v.iter().all(|&y| y == 1.0 || y == 1.0 + 2f64.powi(-7)));
    /// let mean = v.iter().sum::<f64>() / v.len() as f64;
    /// assert!((mean - (1.0 + 2f64.powi(-9))).abs() < 2e-4);
    /// ```
    #[track_caller]
    pub fn to_dtype_stochastic(&self, dtype: DType, gen: &mut Generator) -> Result<Tensor> {
        if dtype == self.dtype && dtype.is_float() {
            return self.to_dtype(dtype);
        }
        let expr = stochastic_round_expr(self.dtype, dtype)?;
        let dropped = mantissa_bits(self.dtype) - mantissa_bits(dtype);
        let lanes = lanes_for(self.dtype, dropped);
        self.stochastic_map(expr, lanes, gen, "to_dtype_stochastic")
    }

    /// A copy whose values are rounded at random to `bits` mantissa bits (neon's
    /// `stochastic_round=bits`), keeping the dtype and its exponent range: the bit pattern
    /// plus `m − bits` random bits with the low `m − bits` cleared (`m` the dtype's mantissa
    /// bits: f64 52, f32 23, f16 10, bf16 7). `bits ≥ m` copies unchanged. Same guarantees as
    /// [`to_dtype_stochastic`](Tensor::to_dtype_stochastic).
    ///
    /// ```
    /// use strata_core::{random::Generator, Device, DType, Tensor};
    /// let mut g = Generator::new(1);
    /// let x = Tensor::from_slice(&[1.0f32, 1.3, -2.7], [3], &Device::cpu()).unwrap();
    /// let r = x.round_mantissa_stochastic(1, &mut g).unwrap().to_vec::<f32>().unwrap();
    /// assert_eq!(r[0], 1.0); // representable: exact
    /// assert!(r[1] == 1.0 || r[1] == 1.5);
    /// assert!(r[2] == -2.5 || r[2] == -3.0);
    /// ```
    #[track_caller]
    pub fn round_mantissa_stochastic(&self, bits: u32, gen: &mut Generator) -> Result<Tensor> {
        let Some(own) = self.dtype.float_format() else {
            return Err(Error::DType(format!(
                "round_mantissa_stochastic rounds floats, not {}",
                self.dtype
            )));
        };
        if bits >= own.mantissa_bits {
            return self.to_dtype(self.dtype);
        }
        let target = FloatFormat {
            mantissa_bits: bits,
            ..own
        };
        let expr = stochastic_expr(self.dtype, target);
        let lanes = lanes_for(self.dtype, own.mantissa_bits - bits);
        self.stochastic_map(expr, lanes, gen, "round_mantissa_stochastic")
    }

    /// Launches (or defers) `expr` over `self` with `gen`'s key and counter as scalars 0 and
    /// 1, recording the plain cast's gradient.
    #[track_caller]
    fn stochastic_map(
        &self,
        expr: Expr,
        lanes: Lanes,
        gen: &mut Generator,
        what: &'static str,
    ) -> Result<Tensor> {
        let dtype = expr.dtype;
        let layout = Layout::contiguous(self.shape())?;
        let scalars = gen.take(layout.numel().div_ceil(lanes.per_counter as usize));
        let inputs = vec![self.clone()];
        let out = defer_or_launch(expr, layout, inputs.clone(), scalars, self.device(), what)?;
        if !autograd::needed([self]) {
            return Ok(out);
        }
        // Unbiased: the expected value is the input, so the gradient is the cast's.
        let plain = Expr::input(0, self.dtype).cast(dtype, false);
        Ok(autograd::record_elementwise(
            autograd::backward_name(what),
            &plain,
            &inputs,
            &[],
            out,
        ))
    }
}
