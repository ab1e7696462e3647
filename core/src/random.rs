//! Counter-based random numbers: Philox4x32-10 and a [`Generator`] whose state is a seed and an
//! offset, so the same seed gives the same numbers on every backend and a state can be saved
//! and restored (neon's `rng_get_state` / `rng_set_state`).

use crate::device::Device;
use crate::dtype::{DType, Scalar};
use crate::error::{Error, Result};
use crate::fusion::{defers, record};
use crate::ir::{BinaryOp, Expr, Node, UnaryOp};
use crate::layout::IntoDims;
use crate::layout::Layout;
use crate::tensor::{launch_map, Tensor};

/// Philox4x32-10 (Salmon et al., 2011): 10 rounds over a 128-bit counter with a 64-bit key.
///
/// ```
/// // A known-answer vector of the Random123 reference.
/// let out = strata_core::random::philox4x32_10([0; 4], [0; 2]);
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

/// The state of a random stream: a seed and how many counters have been used. Each op takes
/// one counter per element and advances the offset.
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

    /// The launch scalars for `n` elements (key, first counter), advancing the offset.
    fn take(&mut self, n: usize) -> Vec<Scalar> {
        let scalars = vec![Scalar::U64(self.seed), Scalar::U64(self.offset)];
        self.offset = self.offset.wrapping_add(n as u64);
        scalars
    }
}

/// Word `word` of this element's Philox output, as u64.
fn bits(word: u8) -> Expr {
    Expr {
        dtype: DType::U32,
        node: Node::Philox {
            key: 0,
            counter: 1,
            word,
        },
    }
    .cast(DType::U64, false)
}

fn bin(op: BinaryOp, a: Expr, b: Expr) -> Expr {
    Expr::binary(op, a, b)
}

/// A uniform value in `[0, 1)` as f64 with 53 random bits from words `w`, `w + 1`.
fn uniform53(w: u8, scalar_base: usize) -> Expr {
    let s = |k: usize| Expr::scalar(scalar_base + k, DType::U64);
    let hi = bin(BinaryOp::Shl, bits(w), s(0)); // << 21
    let lo = bin(BinaryOp::Shr, bits(w + 1), s(1)); // >> 11
    let m = bin(BinaryOp::BitOr, hi, lo).cast(DType::F64, false);
    bin(BinaryOp::Mul, m, Expr::scalar(scalar_base + 2, DType::F64))
}

/// Scalars `uniform53` reads after the two generator scalars.
fn uniform53_scalars() -> Vec<Scalar> {
    vec![
        Scalar::U64(21),
        Scalar::U64(11),
        Scalar::F64(2f64.powi(-53)),
    ]
}

/// A new tensor of `dims` holding `expr` (which reads the generator's two scalars, then
/// `extra`), taking one counter per element from `gen`.
#[track_caller]
fn draw(
    dims: impl IntoDims,
    dtype: DType,
    gen: &mut Generator,
    device: &Device,
    extra: Vec<Scalar>,
    expr: Expr,
) -> Result<Tensor> {
    let layout = Layout::contiguous(&crate::layout::shape_arg(dims)?)?;
    device.backend().check_dtype(dtype)?;
    let mut scalars = gen.take(layout.numel());
    scalars.extend(extra);
    let expr = expr.cast(dtype, false);
    if defers(device) {
        return record(expr, layout, vec![], scalars, device, "random");
    }
    let out = Tensor::alloc_with_layout(layout, dtype, device)?;
    launch_map(expr, &out, &[], scalars)?;
    Ok(out)
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
    /// Uniform values in `[0, 1)` (53 random bits, rounded to `dtype`; rounding to a 16-bit
    /// float can give 1.0).
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
        draw(
            dims,
            dtype,
            gen,
            device,
            uniform53_scalars(),
            uniform53(0, 2),
        )
    }

    /// Standard normal values (Box–Muller over two 53-bit uniforms, computed in f64).
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
        let mut extra = uniform53_scalars();
        extra.extend([
            Scalar::F64(1.0),
            Scalar::F64(-2.0),
            Scalar::F64(std::f64::consts::TAU),
        ]);
        let f = |k| Expr::scalar(k, DType::F64);
        // u1 in (0, 1]: 1 - u; u2 in [0, 1).
        let u1 = bin(BinaryOp::Sub, f(5), uniform53(0, 2));
        let u2 = uniform53(2, 2);
        let radius = Expr::unary(
            UnaryOp::Sqrt,
            bin(BinaryOp::Mul, f(6), Expr::unary(UnaryOp::Log, u1)),
        );
        let angle = Expr::unary(UnaryOp::Cos, bin(BinaryOp::Mul, f(7), u2));
        draw(
            dims,
            dtype,
            gen,
            device,
            extra,
            bin(BinaryOp::Mul, radius, angle),
        )
    }

    /// Integers uniform in `low..high` (64 random bits modulo the range) as an integer dtype.
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
        let extra = vec![Scalar::U64(32), Scalar::U64(span), Scalar::I64(low)];
        let u = |k| Expr::scalar(k, DType::U64);
        let word = bin(BinaryOp::BitOr, bin(BinaryOp::Shl, bits(0), u(2)), bits(1));
        let r = bin(BinaryOp::Rem, word, u(3)).cast(DType::I64, false);
        let v = bin(BinaryOp::Add, r, Expr::scalar(4, DType::I64));
        draw(dims, dtype, gen, device, extra, v)
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
        let mut extra = uniform53_scalars();
        extra.push(Scalar::F64(p));
        let hit = bin(BinaryOp::Lt, uniform53(0, 2), Expr::scalar(5, DType::F64));
        draw(dims, dtype, gen, device, extra, hit)
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
