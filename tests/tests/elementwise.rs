//! Every elementwise op × every dtype × layout, against plain-Rust references written here
//! (integers in i128, floats in f64, then converted with the documented cast rule).
//!
//! Tolerances (relative, or absolute near zero): f64 1e-12, f32 2e-6, f16 2e-3, bf16 1.6e-2.
//! Integers and bools are exact.

use strata::prelude::*;
use strata_tests::{indices, test_device};

// ---------------------------------------------------------------- inputs and layouts

/// Deterministic values of `dtype`, with edge cases (0, ±1, extremes, NaN, ±inf).
fn values(dtype: DType, n: usize, seed: u64) -> Vec<Scalar> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 11
    };
    (0..n)
        .map(|i| {
            let r = next();
            let s = if dtype.is_float() {
                let special = [
                    0.0,
                    -0.0,
                    1.0,
                    -1.5,
                    2.5,
                    f64::NAN,
                    f64::INFINITY,
                    -3.0,
                    0.5,
                    100.25,
                ];
                if i % 3 == 0 {
                    Scalar::F64(special[(r % special.len() as u64) as usize])
                } else {
                    Scalar::F64((r % 20001) as f64 / 1000.0 - 10.0)
                }
            } else if dtype == DType::Bool {
                Scalar::Bool(r % 2 == 0)
            } else {
                let (lo, hi) = dtype.min_max();
                let special = [0.0, 1.0, -1.0, 2.0, 3.0, 7.0, lo, hi];
                if i % 2 == 0 {
                    Scalar::I64(special[(r % special.len() as u64) as usize] as i64)
                } else {
                    Scalar::I64(((r % 41) as i64) - 20)
                }
            };
            s.cast(dtype, false)
        })
        .collect()
}

fn tensor(vals: &[Scalar], shape: &[usize], dtype: DType, dev: &Device) -> Result<Tensor> {
    let t = Tensor::empty(shape, dtype, dev)?;
    let flat = t.reshape([-1])?;
    for (i, v) in vals.iter().enumerate() {
        flat.set(s![i], *v)?;
    }
    Ok(t)
}

/// A logical array on the host: what a tensor holds, in row-major order.
#[derive(Clone, Debug)]
struct Host {
    shape: Vec<usize>,
    vals: Vec<Scalar>,
}

fn host(t: &Tensor) -> Result<Host> {
    let flat = t.reshape([-1])?;
    let vals = (0..flat.numel())
        .map(|i| flat.slice(s![i])?.item_scalar())
        .collect::<Result<Vec<_>>>()?;
    Ok(Host {
        shape: t.shape().to_vec(),
        vals,
    })
}

/// An operand: a tensor in some layout, or a Rust scalar.
#[derive(Clone)]
enum Arg {
    T(Tensor),
    S(Scalar),
}

impl Arg {
    fn value(&self) -> Value {
        match self {
            Arg::T(t) => Value::from(t),
            Arg::S(s) => Value::from(*s),
        }
    }
    fn host(&self) -> Result<Host> {
        match self {
            Arg::T(t) => host(t),
            Arg::S(s) => Ok(Host {
                shape: vec![],
                vals: vec![*s],
            }),
        }
    }
}

/// Pairs of operands of `dtype` in every layout the suite covers.
fn layouts(dtype: DType, dev: &Device) -> Result<Vec<(&'static str, Arg, Arg)>> {
    let v = |n, seed| values(dtype, n, seed);
    let t = |n: usize, shape: &[usize], seed| tensor(&v(n, seed), shape, dtype, dev);
    let contiguous = (t(12, &[3, 4], 1)?, t(12, &[3, 4], 2)?);
    let transposed = (t(12, &[4, 3], 3)?.t()?, t(12, &[4, 3], 4)?.t()?);
    let negative = (
        t(12, &[3, 4], 5)?.slice(s![..;-1, ..])?,
        t(24, &[3, 8], 6)?.slice(s![.., ..;-2])?,
    );
    let offset = (
        t(20, &[4, 5], 7)?.slice(s![1.., 1..])?,
        t(20, &[4, 5], 8)?.slice(s![..3, 1..])?,
    );
    let broadcast = (t(3, &[3, 1], 9)?, t(4, &[4], 10)?);
    let expanded = (t(4, &[4], 11)?.expand([3, 4])?, t(12, &[3, 4], 12)?);
    let zero = (t(0, &[0, 4], 13)?, t(4, &[1, 4], 14)?);
    let zero_d = (t(1, &[], 15)?, t(12, &[3, 4], 16)?);
    let both_0d = (t(1, &[], 17)?, t(1, &[], 18)?);
    let scalar = v(1, 19)[0];
    Ok(vec![
        (
            "contiguous",
            Arg::T(contiguous.0),
            Arg::T(contiguous.1.clone()),
        ),
        ("transposed", Arg::T(transposed.0), Arg::T(transposed.1)),
        ("negative-stride", Arg::T(negative.0), Arg::T(negative.1)),
        ("offset view", Arg::T(offset.0), Arg::T(offset.1)),
        ("broadcast", Arg::T(broadcast.0), Arg::T(broadcast.1)),
        ("stride-0 expand", Arg::T(expanded.0), Arg::T(expanded.1)),
        ("zero-size", Arg::T(zero.0), Arg::T(zero.1)),
        ("0-d with tensor", Arg::T(zero_d.0), Arg::T(zero_d.1)),
        ("0-d", Arg::T(both_0d.0), Arg::T(both_0d.1)),
        (
            "tensor op scalar",
            Arg::T(contiguous.1.clone()),
            Arg::S(scalar),
        ),
        ("scalar op tensor", Arg::S(scalar), Arg::T(contiguous.1)),
    ])
}

/// NumPy broadcasting of two host arrays: the shape and, per output element, both sources.
fn broadcast(a: &Host, b: &Host) -> (Vec<usize>, Vec<(Scalar, Scalar)>) {
    let n = a.shape.len().max(b.shape.len());
    let pad = |s: &[usize]| [vec![1; n - s.len()], s.to_vec()].concat();
    let (sa, sb) = (pad(&a.shape), pad(&b.shape));
    let shape: Vec<usize> = sa
        .iter()
        .zip(&sb)
        .map(|(&x, &y)| if x == 1 { y } else { x })
        .collect();
    let at = |h: &Host, s: &[usize], idx: &[usize]| {
        let flat = idx
            .iter()
            .zip(s)
            .fold(0, |acc, (&i, &d)| acc * d + if d == 1 { 0 } else { i });
        h.vals[flat]
    };
    let pairs = indices(&shape)
        .iter()
        .map(|idx| (at(a, &sa, idx), at(b, &sb, idx)))
        .collect();
    (shape, pairs)
}

// ---------------------------------------------------------------- promotion

/// PyTorch's promote_types over strata's dtypes (u16/u32/u64 with signed follow NumPy).
const PROMOTION: &str = "
      bool u8   u16  u32  u64  i8   i16  i32  i64  f16  bf16 f32  f64
bool  bool u8   u16  u32  u64  i8   i16  i32  i64  f16  bf16 f32  f64
u8    u8   u8   u16  u32  u64  i16  i16  i32  i64  f16  bf16 f32  f64
u16   u16  u16  u16  u32  u64  i32  i32  i32  i64  f16  bf16 f32  f64
u32   u32  u32  u32  u32  u64  i64  i64  i64  i64  f16  bf16 f32  f64
u64   u64  u64  u64  u64  u64  f64  f64  f64  f64  f16  bf16 f32  f64
i8    i8   i16  i32  i64  f64  i8   i16  i32  i64  f16  bf16 f32  f64
i16   i16  i16  i32  i64  f64  i16  i16  i32  i64  f16  bf16 f32  f64
i32   i32  i32  i32  i64  f64  i32  i32  i32  i64  f16  bf16 f32  f64
i64   i64  i64  i64  i64  f64  i64  i64  i64  i64  f16  bf16 f32  f64
f16   f16  f16  f16  f16  f16  f16  f16  f16  f16  f16  f32  f32  f64
bf16  bf16 bf16 bf16 bf16 bf16 bf16 bf16 bf16 bf16 f32  bf16 f32  f64
f32   f32  f32  f32  f32  f32  f32  f32  f32  f32  f32  f32  f32  f64
f64   f64  f64  f64  f64  f64  f64  f64  f64  f64  f64  f64  f64  f64
";

fn promotion_table() -> Vec<(DType, DType, DType)> {
    let mut lines = PROMOTION.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<DType> = lines
        .next()
        .unwrap()
        .split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect();
    lines
        .flat_map(|line| {
            let mut cells = line.split_whitespace();
            let row: DType = cells.next().unwrap().parse().unwrap();
            let header = header.clone();
            cells
                .zip(header)
                .map(move |(c, col)| (row, col, c.parse().unwrap()))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn promotion(dev: &Device) -> Result<()> {
    let table = promotion_table();
    assert_eq!(table.len(), 169);
    for (a, b, want) in table {
        let (x, y) = (Tensor::zeros([1], a, dev)?, Tensor::zeros([1], b, dev)?);
        assert_eq!(
            x.add(&y).map(|t| t.dtype()).unwrap_or(DType::Bool),
            if a == DType::Bool && b == DType::Bool {
                DType::Bool
            } else {
                want
            },
            "{a} + {b}"
        );
        assert_eq!(x.eq(&y)?.dtype(), DType::Bool);
    }
    // Scalars and 0-d tensors only raise the category.
    let u8s = Tensor::zeros([2, 2, 4], DType::U8, dev)?;
    assert_eq!((&u8s + 3)?.dtype(), DType::U8);
    assert_eq!((&u8s + 3.5)?.dtype(), DType::F32);
    assert_eq!((&u8s + Tensor::scalar(3i64, dev)?)?.dtype(), DType::U8);
    assert_eq!((&u8s + Tensor::scalar(3.0f64, dev)?)?.dtype(), DType::F64);
    let i32s = Tensor::zeros([2], DType::I32, dev)?;
    assert_eq!(
        (&i32s + Tensor::zeros([2], DType::F16, dev)?)?.dtype(),
        DType::F16
    );
    assert_eq!((&i32s / 2)?.dtype(), DType::F32);
    assert_eq!(
        (Tensor::zeros([2], DType::Bool, dev)? + 1)?.dtype(),
        DType::I64
    );
    assert_eq!(
        (Tensor::zeros([2], DType::F16, dev)? * 2.5)?.dtype(),
        DType::F16
    );
    Ok(())
}
test_device!(type_promotion_follows_pytorch, promotion);

// ---------------------------------------------------------------- references

fn int_range(d: DType) -> (i128, i128) {
    let (lo, hi) = d.min_max();
    match d {
        DType::U64 => (0, u64::MAX as i128),
        DType::I64 => (i64::MIN as i128, i64::MAX as i128),
        _ => (lo as i128, hi as i128),
    }
}

fn from_i128(v: i128, d: DType) -> Scalar {
    // Wrap modulo 2^bits, as the cast rule says.
    Scalar::I64(v as i64).cast(d, false).cast(d, false)
}

fn ipow(x: i128, y: i128) -> i128 {
    if y < 0 {
        return match x {
            1 => 1,
            -1 => {
                if y % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    let (mut acc, mut base, mut e) = (1i128, x, y as u128);
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        e >>= 1;
    }
    acc
}

/// CPython's float floor division: `a` less its exact remainder, over `b`, corrected to the
/// divisor's sign and rounded to the nearest whole number; `x / 0` is IEEE's quotient.
macro_rules! python_floor_div {
    ($name:ident, $t:ty) => {
        fn $name(a: $t, b: $t) -> $t {
            if b == 0.0 {
                return a / b;
            }
            let m = a % b;
            let mut div = (a - m) / b;
            if m != 0.0 && (b < 0.0) != (m < 0.0) {
                div -= 1.0;
            }
            if div == 0.0 {
                return (0.0 as $t).copysign(a / b);
            }
            let fl = div.floor();
            if div - fl > 0.5 {
                fl + 1.0
            } else {
                fl
            }
        }
    };
}
python_floor_div!(python_floor_div, f64);
python_floor_div!(python_floor_div_f32, f32);

fn floor_div(x: i128, y: i128) -> i128 {
    if y > 0 {
        x.div_euclid(y)
    } else {
        (-x).div_euclid(-y)
    }
}

/// The reference result of `name(x, y)` computed in `d`, or `None` where the op rejects `d`.
fn binary_ref(name: &str, x: Scalar, y: Scalar, d: DType) -> Option<Scalar> {
    let b = |v: bool| Some(Scalar::Bool(v));
    let (fx, fy) = (x.to_f64(), y.to_f64());
    let equal = if d.is_float() {
        fx == fy
    } else {
        x.to_i128() == y.to_i128()
    };
    match name {
        "eq" => return b(equal),
        "ne" => return b(!equal),
        "lt" => {
            return b(if d.is_float() {
                fx < fy
            } else {
                x.to_i128() < y.to_i128()
            })
        }
        "le" => {
            return b(if d.is_float() {
                fx <= fy
            } else {
                x.to_i128() <= y.to_i128()
            })
        }
        "gt" => {
            return b(if d.is_float() {
                fx > fy
            } else {
                x.to_i128() > y.to_i128()
            })
        }
        "ge" => {
            return b(if d.is_float() {
                fx >= fy
            } else {
                x.to_i128() >= y.to_i128()
            })
        }
        "logical_and" => return b(x.to_bool() && y.to_bool()),
        "logical_or" => return b(x.to_bool() || y.to_bool()),
        "logical_xor" => return b(x.to_bool() != y.to_bool()),
        _ => {}
    }
    if d == DType::Bool {
        let (p, q) = (x.to_bool(), y.to_bool());
        return match name {
            "add" | "maximum" | "bitwise_or" => b(p | q),
            "mul" | "minimum" | "bitwise_and" => b(p & q),
            "bitwise_xor" => b(p ^ q),
            _ => None,
        };
    }
    if d.is_float() {
        let f = |v: f64| Some(Scalar::F64(v).cast(d, false));
        let single = d == DType::F32;
        return match name {
            "add" | "add_sat" => f(fx + fy),
            "sub" | "sub_sat" => f(fx - fy),
            "mul" | "mul_sat" => f(fx * fy),
            "div" | "div_sat" => f(fx / fy),
            // Python's algorithm, in f32 steps for the 32- and 16-bit floats.
            "floor_divide" if d == DType::F64 => f(python_floor_div(fx, fy)),
            "floor_divide" => f(python_floor_div_f32(fx as f32, fy as f32) as f64),
            "remainder" => {
                let r = fx % fy;
                f(if r != 0.0 && (r < 0.0) != (fy < 0.0) {
                    r + fy
                } else {
                    r
                })
            }
            "pow" if single => f((fx as f32).powf(fy as f32) as f64),
            "pow" => f(fx.powf(fy)),
            "maximum" => f(if fx.is_nan() || fy.is_nan() {
                f64::NAN
            } else {
                fx.max(fy)
            }),
            "minimum" => f(if fx.is_nan() || fy.is_nan() {
                f64::NAN
            } else {
                fx.min(fy)
            }),
            "atan2" if single => f((fx as f32).atan2(fy as f32) as f64),
            "atan2" => f(fx.atan2(fy)),
            _ => None,
        };
    }
    let (a, c) = (x.to_i128(), y.to_i128());
    let (lo, hi) = int_range(d);
    let bits = (d.itemsize() * 8) as i128;
    let w = |v: i128| Some(from_i128(v, d));
    let sat = |v: i128| Some(from_i128(v.clamp(lo, hi), d));
    match name {
        "add" => w(a.wrapping_add(c)),
        "sub" => w(a.wrapping_sub(c)),
        "mul" => w(a.wrapping_mul(c)),
        "add_sat" => sat(a + c),
        "sub_sat" => sat(a - c),
        "mul_sat" => sat(a.saturating_mul(c)),
        "div_sat" => sat(if c == 0 { 0 } else { a / c }),
        "floor_divide" => w(if c == 0 { 0 } else { floor_div(a, c) }),
        "remainder" => w(if c == 0 { 0 } else { a - c * floor_div(a, c) }),
        "pow" => w(ipow(a, c)),
        "maximum" => w(a.max(c)),
        "minimum" => w(a.min(c)),
        "bitwise_and" => w(a & c),
        "bitwise_or" => w(a | c),
        "bitwise_xor" => w(a ^ c),
        "bitwise_left_shift" => w(if c < 0 || c >= bits {
            0
        } else {
            a.wrapping_shl(c as u32)
        }),
        "bitwise_right_shift" => w(if c < 0 || c >= bits {
            if a < 0 {
                -1
            } else {
                0
            }
        } else {
            a >> c
        }),
        _ => None,
    }
}

/// The dtype an op computes in for operands promoted to `d` (the op's documented rule).
fn compute_dtype(name: &str, d: DType) -> DType {
    if matches!(name, "div" | "atan2") && !d.is_float() {
        DType::F32
    } else {
        d
    }
}

fn unary_ref(name: &str, x: Scalar, d: DType) -> Option<Scalar> {
    let float_fn: Option<fn(f64) -> f64> = match name {
        "sqrt" => Some(f64::sqrt),
        "rsqrt" => Some(|v| 1.0 / v.sqrt()),
        "reciprocal" => Some(|v| 1.0 / v),
        "exp" => Some(f64::exp),
        "exp2" => Some(f64::exp2),
        "expm1" => Some(f64::exp_m1),
        "log" => Some(f64::ln),
        "log2" => Some(f64::log2),
        "log10" => Some(f64::log10),
        "log1p" => Some(f64::ln_1p),
        "sin" => Some(f64::sin),
        "cos" => Some(f64::cos),
        "tan" => Some(f64::tan),
        "tanh" => Some(f64::tanh),
        "sigmoid" => Some(|v| 1.0 / (1.0 + (-v).exp())),
        "gelu" => Some(|v| 0.5 * v * (1.0 + libm_erf(v / 2f64.sqrt()))),
        "erf" => Some(libm_erf),
        _ => None,
    };
    let b = |v: bool| Some(Scalar::Bool(v));
    let fx = x.to_f64();
    match name {
        "isnan" => return b(fx.is_nan()),
        "isinf" => return b(fx.is_infinite()),
        "isfinite" => return b(fx.is_finite()),
        "logical_not" => return b(!x.to_bool()),
        _ => {}
    }
    if let Some(f) = float_fn {
        let out = if d.is_float() { d } else { DType::F32 };
        let v = x.cast(out, false).to_f64();
        return Some(Scalar::F64(f(v)).cast(out, false));
    }
    if d == DType::Bool {
        return match name {
            "bitwise_not" => b(!x.to_bool()),
            "abs" | "floor" | "ceil" | "round" | "trunc" | "relu" | "sign" | "square" => Some(x),
            _ => None,
        };
    }
    if d.is_float() {
        let f = |v: f64| Some(Scalar::F64(v).cast(d, false));
        return match name {
            "neg" | "neg_sat" => f(-fx),
            "abs" => f(fx.abs()),
            "sign" => f(if fx > 0.0 {
                1.0
            } else if fx < 0.0 {
                -1.0
            } else if fx.is_nan() {
                fx
            } else {
                0.0
            }),
            "square" => f(fx * fx),
            "relu" => f(if fx.is_nan() || fx > 0.0 { fx } else { 0.0 }),
            "floor" => f(fx.floor()),
            "ceil" => f(fx.ceil()),
            "trunc" => f(fx.trunc()),
            "round" => f({
                let r = fx.round();
                if (fx - fx.trunc()).abs() == 0.5 {
                    2.0 * (fx / 2.0).round()
                } else {
                    r
                }
            }),
            _ => None,
        };
    }
    let a = x.to_i128();
    let (lo, hi) = int_range(d);
    let w = |v: i128| Some(from_i128(v, d));
    match name {
        "neg" => w(-a),
        "neg_sat" => w((-a).clamp(lo, hi)),
        "abs" => w(a.abs()),
        "sign" => w(a.signum()),
        "square" => w(a.wrapping_mul(a)),
        "relu" => w(a.max(0)),
        "floor" | "ceil" | "round" | "trunc" => w(a),
        "bitwise_not" => w(!a),
        _ => None,
    }
}

/// erf by its Taylor series / continued fraction, independent of the library strata uses.
fn libm_erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let ax = x.abs();
    let v = if ax < 2.5 {
        // Σ (-1)^n x^(2n+1) / (n! (2n+1)), converging fast for |x| < 2.5.
        let (mut term, mut sum, mut n) = (ax, ax, 0.0);
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -ax * ax / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // Continued fraction for erfc.
        let mut f = 0.0;
        for k in (1..60).rev() {
            f = (k as f64 / 2.0) / (ax + f);
        }
        1.0 - (-ax * ax).exp() / (std::f64::consts::PI.sqrt() * (ax + f))
    };
    v.copysign(x)
}

// ---------------------------------------------------------------- comparison

fn close(got: Scalar, want: Scalar) -> bool {
    if got.dtype() != want.dtype() {
        return false;
    }
    let d = got.dtype();
    if !d.is_float() {
        return got == want;
    }
    let (g, w) = (got.to_f64(), want.to_f64());
    if g.is_nan() || w.is_nan() {
        return g.is_nan() && w.is_nan();
    }
    if g.is_infinite() || w.is_infinite() {
        return g == w;
    }
    let tol = match d {
        DType::F64 => 1e-12,
        DType::F32 => 2e-6,
        DType::F16 => 2e-3,
        _ => 1.6e-2,
    };
    (g - w).abs() <= tol * w.abs().max(1.0)
}

const BINARY: &[&str] = &[
    "add",
    "sub",
    "mul",
    "div",
    "floor_divide",
    "remainder",
    "pow",
    "maximum",
    "minimum",
    "atan2",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "bitwise_left_shift",
    "bitwise_right_shift",
    "add_sat",
    "sub_sat",
    "mul_sat",
    "div_sat",
    "logical_and",
    "logical_or",
    "logical_xor",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
];

/// Runs `name(a, b)`. A scalar on the left goes through a 0-d tensor of its dtype (the same
/// promotion here, since the scalar was drawn in the tensor's dtype); the Rust operator forms
/// (`5 - &t`) are tested separately.
fn call_binary(name: &str, a: &Value, b: &Value) -> Result<Tensor> {
    match (a, b) {
        (Value::Tensor(t), _) => t.call(name, b),
        (Value::Scalar(s), Value::Tensor(t)) => Tensor::scalar(*s, t.device())?.call(name, b),
        _ => unreachable!("the layouts have a tensor on one side"),
    }
}

trait Call {
    fn call(&self, name: &str, b: &Value) -> Result<Tensor>;
}
impl Call for Tensor {
    fn call(&self, name: &str, b: &Value) -> Result<Tensor> {
        let b = b.clone();
        match name {
            "add" => self.add(b),
            "sub" => self.sub(b),
            "mul" => self.mul(b),
            "div" => self.div(b),
            "floor_divide" => self.floor_divide(b),
            "remainder" => self.remainder(b),
            "pow" => self.pow(b),
            "maximum" => self.maximum(b),
            "minimum" => self.minimum(b),
            "atan2" => self.atan2(b),
            "bitwise_and" => self.bitwise_and(b),
            "bitwise_or" => self.bitwise_or(b),
            "bitwise_xor" => self.bitwise_xor(b),
            "bitwise_left_shift" => self.bitwise_left_shift(b),
            "bitwise_right_shift" => self.bitwise_right_shift(b),
            "add_sat" => self.add_sat(b),
            "sub_sat" => self.sub_sat(b),
            "mul_sat" => self.mul_sat(b),
            "div_sat" => self.div_sat(b),
            "logical_and" => self.logical_and(b),
            "logical_or" => self.logical_or(b),
            "logical_xor" => self.logical_xor(b),
            "eq" => self.eq(b),
            "ne" => self.ne(b),
            "lt" => self.lt(b),
            "le" => self.le(b),
            "gt" => self.gt(b),
            "ge" => self.ge(b),
            other => panic!("no op {other}"),
        }
    }
}

fn binary_ops(dev: &Device) -> Result<()> {
    for dtype in strata_tests::dtypes() {
        for (layout, a, b) in layouts(dtype, dev)? {
            let (ha, hb) = (a.host()?, b.host()?);
            let (shape, pairs) = broadcast(&ha, &hb);
            for &name in BINARY {
                // A scalar operand is a Rust value: it keeps the tensor's dtype here because it
                // was drawn in that dtype's category.
                let promoted = dtype;
                let compute = compute_dtype(name, promoted);
                let expect: Vec<Option<Scalar>> = pairs
                    .iter()
                    .map(|&(x, y)| {
                        binary_ref(
                            name,
                            x.cast(compute, false),
                            y.cast(compute, false),
                            compute,
                        )
                    })
                    .collect();
                let rejects = binary_ref(
                    name,
                    Scalar::I8(1).cast(compute, false),
                    Scalar::I8(1).cast(compute, false),
                    compute,
                )
                .is_none();
                let got = call_binary(name, &a.value(), &b.value());
                let ctx = format!("{name} on {dtype} ({layout})");
                if rejects {
                    let e = got.expect_err(&format!("{ctx} should be an error"));
                    assert!(
                        e.to_string().contains(name) || e.to_string().contains(dtype.name()),
                        "{ctx}: {e}"
                    );
                    continue;
                }
                let got = got.map_err(|e| Error::Invalid(format!("{ctx}: {e}")))?;
                assert_eq!(got.shape(), &shape[..], "{ctx}");
                let gh = host(&got)?;
                for (i, (g, w)) in gh.vals.iter().zip(&expect).enumerate() {
                    let w = w.unwrap_or_else(|| panic!("{ctx}: no reference"));
                    assert!(
                        close(*g, w),
                        "{ctx} element {i}: {:?} op {:?} gave {g:?}, want {w:?}",
                        pairs[i].0,
                        pairs[i].1
                    );
                }
            }
        }
    }
    Ok(())
}
test_device!(binary_ops_every_dtype_and_layout, binary_ops);

const UNARY: &[&str] = &[
    "neg",
    "neg_sat",
    "abs",
    "sign",
    "square",
    "sqrt",
    "rsqrt",
    "reciprocal",
    "exp",
    "exp2",
    "expm1",
    "log",
    "log2",
    "log10",
    "log1p",
    "sin",
    "cos",
    "tan",
    "tanh",
    "sigmoid",
    "relu",
    "gelu",
    "erf",
    "floor",
    "ceil",
    "round",
    "trunc",
    "isnan",
    "isinf",
    "isfinite",
    "logical_not",
    "bitwise_not",
];

fn call_unary(t: &Tensor, name: &str) -> Result<Tensor> {
    match name {
        "neg" => t.neg(),
        "neg_sat" => t.neg_sat(),
        "abs" => t.abs(),
        "sign" => t.sign(),
        "square" => t.square(),
        "sqrt" => t.sqrt(),
        "rsqrt" => t.rsqrt(),
        "reciprocal" => t.reciprocal(),
        "exp" => t.exp(),
        "exp2" => t.exp2(),
        "expm1" => t.expm1(),
        "log" => t.log(),
        "log2" => t.log2(),
        "log10" => t.log10(),
        "log1p" => t.log1p(),
        "sin" => t.sin(),
        "cos" => t.cos(),
        "tan" => t.tan(),
        "tanh" => t.tanh(),
        "sigmoid" => t.sigmoid(),
        "relu" => t.relu(),
        "gelu" => t.gelu(),
        "erf" => t.erf(),
        "floor" => t.floor(),
        "ceil" => t.ceil(),
        "round" => t.round(),
        "trunc" => t.trunc(),
        "isnan" => t.isnan(),
        "isinf" => t.isinf(),
        "isfinite" => t.isfinite(),
        "logical_not" => t.logical_not(),
        "bitwise_not" => t.bitwise_not(),
        other => panic!("no op {other}"),
    }
}

fn unary_ops(dev: &Device) -> Result<()> {
    for dtype in strata_tests::dtypes() {
        for (layout, a, _) in layouts(dtype, dev)? {
            let Arg::T(t) = a else { continue };
            let ha = host(&t)?;
            for &name in UNARY {
                let ctx = format!("{name} on {dtype} ({layout})");
                let rejects = unary_ref(name, Scalar::I8(1).cast(dtype, false), dtype).is_none();
                let got = call_unary(&t, name);
                if rejects {
                    got.expect_err(&format!("{ctx} should be an error"));
                    continue;
                }
                let got = got.map_err(|e| Error::Invalid(format!("{ctx}: {e}")))?;
                assert_eq!(got.shape(), t.shape(), "{ctx}");
                for (i, (g, x)) in host(&got)?.vals.iter().zip(&ha.vals).enumerate() {
                    let w = unary_ref(name, *x, dtype).expect("accepted");
                    assert!(
                        close(*g, w),
                        "{ctx} element {i}: {name}({x:?}) gave {g:?}, want {w:?}"
                    );
                }
            }
        }
    }
    Ok(())
}
test_device!(unary_ops_every_dtype_and_layout, unary_ops);

/// Casts of every dtype pair over every layout, wrapping and saturating, against the rule.
fn casts(dev: &Device) -> Result<()> {
    for from in DType::ALL {
        for (layout, a, _) in layouts(from, dev)? {
            let Arg::T(t) = a else { continue };
            let ha = host(&t)?;
            for to in DType::ALL {
                let chosen = strata_tests::dtypes();
                if !chosen.contains(&from) && !chosen.contains(&to) {
                    continue;
                }
                for saturate in [false, true] {
                    let got = if saturate {
                        t.to_dtype_sat(to)?
                    } else {
                        t.to_dtype(to)?
                    };
                    assert_eq!((got.shape(), got.dtype()), (t.shape(), to));
                    for (g, x) in host(&got)?.vals.iter().zip(&ha.vals) {
                        let w = x.cast(to, saturate);
                        let same = *g == w || (g.to_f64().is_nan() && w.to_f64().is_nan());
                        assert!(same, "{from} -> {to} sat={saturate} ({layout}): {x:?} gave {g:?}, want {w:?}");
                    }
                }
            }
        }
    }
    Ok(())
}
test_device!(casts_every_dtype_pair_and_layout, casts);

/// sin, cos and tan of arguments far past 2π (where Cody–Waite reduction runs out of bits and
/// Payne–Hanek takes over), against Rust's correctly reduced f64 functions.
fn trig_of_huge_arguments(dev: &Device) -> Result<()> {
    let f64s = [
        524_288.5,
        -1e6 - 0.25,
        1e10,
        1e22,
        -(2f64.powi(60)),
        i64::MAX as f64,
        3.4e38,
        1e300,
        f64::MAX,
        // The double closest to a multiple of π/2 (Kahan–McDonald): 6381956970095103·2^797.
        6381956970095103.0 * 2f64.powi(797),
    ];
    let f32s: Vec<f32> = [1e6f32, -123456789.0, 1e10, 3.4e38, -1.7e38, 16777216.0].to_vec();
    for (name, f) in [
        ("sin", f64::sin as fn(f64) -> f64),
        ("cos", f64::cos),
        ("tan", f64::tan),
    ] {
        let t = Tensor::from_slice(&f64s, [f64s.len()], dev)?;
        let got = call_unary(&t, name)?.to_vec::<f64>()?;
        for (x, g) in f64s.iter().zip(&got) {
            let w = f(*x);
            assert!(
                (g - w).abs() <= 1e-12 * w.abs().max(1.0),
                "{name}({x:e}) gave {g}, want {w}"
            );
        }
        let t = Tensor::from_slice(&f32s, [f32s.len()], dev)?;
        let got = call_unary(&t, name)?.to_vec::<f32>()?;
        for (x, g) in f32s.iter().zip(&got) {
            let w = f(*x as f64);
            let g = *g as f64;
            assert!(
                (g - w).abs() <= 2e-6 * w.abs().max(1.0),
                "{name}({x:e}f32) gave {g}, want {w}"
            );
        }
    }
    Ok(())
}
test_device!(
    trig_of_huge_arguments_is_reduced_exactly,
    trig_of_huge_arguments
);

/// Python's modulo where the quotient is huge (exponents far apart, subnormal divisors): the
/// remainder is exact, so every backend must give Rust's `%` (then the sign fix) bit for bit.
fn remainder_at_huge_quotients(dev: &Device) -> Result<()> {
    let py = |x: f64, y: f64| {
        let r = x % y;
        if r != 0.0 && (r < 0.0) != (y < 0.0) {
            r + y
        } else {
            r
        }
    };
    let pairs64 = [
        (1e300, 3.0),
        (-1e300, 3.0),
        (1e17 + 2.0, -3.0),
        (f64::MAX, 1e-300),
        (f64::MAX, 5e-324),
        (1e-300, 3e-310),
        (7.5, 2.0),
        (-0.0, 2.0),
        (4.0, 2.0),
        (2f64.powi(1000) + 2f64.powi(948), 0.1),
    ];
    let (x, y): (Vec<f64>, Vec<f64>) = pairs64.iter().copied().unzip();
    let got = Tensor::from_slice(&x, [x.len()], dev)?
        .remainder(&Tensor::from_slice(&y, [y.len()], dev)?)?
        .to_vec::<f64>()?;
    for ((a, b), g) in pairs64.iter().zip(&got) {
        assert_eq!(
            g.to_bits(),
            py(*a, *b).to_bits(),
            "{a:e} % {b:e} gave {g:e}"
        );
    }
    let pairs32 = [
        (3.4e38f32, 3.0f32),
        (-1e10, 0.1),
        (16777215.0, 7.0),
        // Normal divisors only: NVIDIA's Vulkan driver flushes f32 subnormals to zero.
        (1e-30, 3e-38),
        (3.0e38, -1.2e-37),
    ];
    let (x, y): (Vec<f32>, Vec<f32>) = pairs32.iter().copied().unzip();
    let got = Tensor::from_slice(&x, [x.len()], dev)?
        .remainder(&Tensor::from_slice(&y, [y.len()], dev)?)?
        .to_vec::<f32>()?;
    for ((a, b), g) in pairs32.iter().zip(&got) {
        let r = a % b;
        let want = if r != 0.0 && (r < 0.0) != (*b < 0.0) {
            r + b
        } else {
            r
        };
        assert_eq!(
            g.to_bits(),
            want.to_bits(),
            "{a:e}f32 % {b:e}f32 gave {g:e}"
        );
    }
    Ok(())
}
test_device!(
    remainder_is_exact_at_huge_quotients,
    remainder_at_huge_quotients
);

/// Units in the last place between two finite f32 values (their distance on the ordered
/// integer line of f32 bit patterns).
fn ulps(a: f32, b: f32) -> u64 {
    let key = |x: f32| {
        let bits = x.to_bits() as i64;
        if bits < 0 {
            i64::from(i32::MIN) - bits
        } else {
            bits
        }
    };
    key(a).abs_diff(key(b))
}

/// f32 exp, expm1, log, log1p, tanh, sin, cos and erf are within 3 ulp of the correctly rounded value on
/// every backend (CUDA's functions are within 2; the wgpu backend computes them in f32, see
/// docs/semantics.md), over a sweep of their ranges including the edges.
fn f32_transcendentals_within_3_ulp(dev: &Device) -> Result<()> {
    let n = 20_000;
    let sweep = |lo: f32, hi: f32| -> Vec<f32> {
        (0..n)
            .map(|i| lo + (hi - lo) * i as f32 / (n - 1) as f32)
            .collect()
    };
    type Case = (&'static str, Vec<f32>, fn(f64) -> f64);
    // Sine and cosine also near multiples of π/2, where the reduction must keep every bit.
    let near_half_pis: Vec<f32> = (1..=4000)
        .flat_map(|k| {
            let x = (k as f64 * std::f64::consts::FRAC_PI_2) as f32;
            [
                x,
                f32::from_bits(x.to_bits() + 1),
                f32::from_bits(x.to_bits() - 1),
            ]
        })
        .collect();
    let trig_args = || {
        sweep(-10.0, 10.0)
            .into_iter()
            .chain(sweep(-60000.0, 60000.0))
            .chain(near_half_pis.iter().flat_map(|&x| [x, -x]))
            .collect::<Vec<f32>>()
    };
    let cases: [Case; 8] = [
        ("exp", sweep(-87.0, 88.5), f64::exp),
        ("expm1", sweep(-20.0, 20.0), f64::exp_m1),
        (
            "log",
            sweep(1e-30, 1e6)
                .into_iter()
                .chain(sweep(0.5, 2.0))
                .collect(),
            f64::ln,
        ),
        ("log1p", sweep(-0.999, 10.0), f64::ln_1p),
        (
            "tanh",
            // Also densely near 0 and where an f32 algorithm may switch forms (0.25, 0.55, 0.9).
            [
                (-12.0, 12.0),
                (-1e-3, 1e-3),
                (0.2, 0.3),
                (0.5, 0.6),
                (-0.95, -0.85),
                (0.85, 0.95),
            ]
            .into_iter()
            .flat_map(|(lo, hi)| sweep(lo, hi))
            .collect(),
            f64::tanh,
        ),
        ("sin", trig_args(), f64::sin),
        ("cos", trig_args(), f64::cos),
        (
            "erf",
            // Also densely near 0 and where an f32 algorithm may switch forms (0.5, 1, 4).
            [
                (-5.0, 5.0),
                (-1e-3, 1e-3),
                (0.45, 0.55),
                (-1.05, -0.95),
                (0.95, 1.05),
                (3.9, 4.1),
            ]
            .into_iter()
            .flat_map(|(lo, hi)| sweep(lo, hi))
            .collect(),
            libm_erf,
        ),
    ];
    for (name, xs, reference) in cases {
        let t = Tensor::from_slice(&xs, [xs.len()], dev)?;
        let y = match name {
            "exp" => t.exp()?,
            "expm1" => t.expm1()?,
            "log" => t.log()?,
            "log1p" => t.log1p()?,
            "sin" => t.sin()?,
            "cos" => t.cos()?,
            "erf" => t.erf()?,
            _ => t.tanh()?,
        };
        let got = y.to_vec::<f32>()?;
        let worst = xs
            .iter()
            .zip(&got)
            .map(|(&x, &g)| (ulps(g, reference(x as f64) as f32), x, g))
            .max_by_key(|w| w.0)
            .unwrap_or((0, 0.0, 0.0));
        eprintln!(
            "{name} on {}: worst {} ulp at {:e}",
            dev.name(),
            worst.0,
            worst.1
        );
        assert!(
            worst.0 <= 3,
            "{name} on {}: {} ulp at x = {:e} (got {:e}, want {:e})",
            dev.name(),
            worst.0,
            worst.1,
            worst.2,
            reference(worst.1 as f64) as f32
        );
    }
    Ok(())
}
test_device!(
    f32_transcendentals_are_within_3_ulp,
    f32_transcendentals_within_3_ulp
);

/// erfc by its continued fraction from 2.5 (relative accuracy where erfc is tiny), else 1 - erf.
fn libm_erfc(x: f64) -> f64 {
    if x < 2.5 {
        return 1.0 - libm_erf(x);
    }
    let mut f = 0.0;
    for k in (1..60).rev() {
        f = (k as f64 / 2.0) / (x + f);
    }
    (-x * x).exp() / (std::f64::consts::PI.sqrt() * (x + f))
}

/// f32 GELU far into its negative tail, where it is `0.5·x·erfc(-x/√2)` with erfc tiny: within
/// 2e-5 of the exact value relative to it, down to x = -12 (a backend that rounds -x/√2 to f32
/// first, as CUDA and wgpu do, moves erfc by up to 2t² ulp for t = -x/√2: 9e-6 there).
fn gelu_tail(dev: &Device) -> Result<()> {
    let xs: Vec<f32> = (0..=15_000).map(|i| -12.0 + i as f32 * 1e-3).collect();
    let got = Tensor::from_slice(&xs, [xs.len()], dev)?
        .gelu()?
        .to_vec::<f32>()?;
    for (&x, &g) in xs.iter().zip(&got) {
        let x = x as f64;
        let want = 0.5 * x * libm_erfc(-x * std::f64::consts::FRAC_1_SQRT_2);
        assert!(
            (g as f64 - want).abs() <= 2e-5 * want.abs(),
            "gelu({x}) on {}: got {g:e}, want {want:e}",
            dev.name()
        );
    }
    Ok(())
}
test_device!(f32_gelu_is_relatively_accurate_in_its_tail, gelu_tail);

/// Inputs broadcast along the rows (`[n, 1]`, strides (1, 0)) or along the columns (`[1, m]`)
/// beside a contiguous input, at sizes where vectors apply (rows a multiple of 4) and past
/// 32×32 (where the planner once sent row broadcasts through column tiles): on targets with
/// vector splats (CUDA, wgpu) the row values are read once per vector. Small integers in f32
/// and i32, so every backend's answer is exact.
fn row_broadcasts(dev: &Device) -> Result<()> {
    for (rows, cols) in [(3, 4), (8, 12), (40, 64), (33, 36)] {
        for dtype in [DType::F32, DType::I32] {
            let n = rows * cols;
            let x: Vec<i32> = (0..n as i32).map(|v| v % 97 - 40).collect();
            let m: Vec<i32> = (0..rows as i32).map(|r| r % 7 - 3).collect();
            let c: Vec<i32> = (0..cols as i32).map(|k| k % 5 - 2).collect();
            let xt = Tensor::from_slice(&x, [rows, cols], dev)?.to_dtype(dtype)?;
            let mt = Tensor::from_slice(&m, [rows, 1], dev)?.to_dtype(dtype)?;
            let ct = Tensor::from_slice(&c, [1, cols], dev)?.to_dtype(dtype)?;
            // The row values alone beside x (one kernel), then a column broadcast too.
            let y = (&xt - &mt)?.mul(&mt)?;
            let got = y.to_dtype(DType::I32)?.to_vec::<i32>()?;
            let want: Vec<i32> = (0..n).map(|i| (x[i] - m[i / cols]) * m[i / cols]).collect();
            assert_eq!(got, want, "{rows}×{cols} {dtype} on {}", dev.name());
            let got = y.add(&ct)?.to_dtype(DType::I32)?.to_vec::<i32>()?;
            let want: Vec<i32> = (0..n).map(|i| want[i] + c[i % cols]).collect();
            assert_eq!(got, want, "{rows}×{cols} {dtype} on {}", dev.name());
        }
    }
    Ok(())
}
test_device!(row_and_column_broadcasts_are_exact, row_broadcasts);
