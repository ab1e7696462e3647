//! The WGSL helpers a kernel includes: 16-bit float conversions (integer code, rounding to
//! nearest even on every driver), Philox, integer helpers per dtype (Python's floor division and
//! modulo, powers, shifts, saturating arithmetic) and the float library of `math.wgsl`.

use super::{compute_type, literal, wrap, Caps};
use std::collections::BTreeSet;
use strata_core::ir::Expr;
use strata_core::DType;

const HALF: &str = "
fn f16_to_f32(h: u32) -> f32 {
  let s = (h & 0x8000u) << 16u;
  let e = (h >> 10u) & 0x1fu;
  let m = h & 0x3ffu;
  if (e == 0u) { return bitcast<f32>(s | bitcast<u32>(f32(m) * 5.9604644775390625e-8f)); }
  if (e == 31u) { return bitcast<f32>(s | 0x7f800000u | (m << 13u)); }
  return bitcast<f32>(s | ((e + 112u) << 23u) | (m << 13u));
}
fn f32_to_f16(x: f32) -> u32 {
  let b = bitcast<u32>(x);
  let s = (b >> 16u) & 0x8000u;
  let a = b & 0x7fffffffu;
  if (a > 0x7f800000u) { return s | 0x7e00u | ((a >> 13u) & 0x3ffu); }
  if (a >= 0x477ff000u) { return s | 0x7c00u; }
  if (a >= 0x38800000u) { return s | ((a + 0x0fffu + ((a >> 13u) & 1u) - 0x38000000u) >> 13u); }
  return s | u32(round(bitcast<f32>(a) * 16777216.0f));
}
fn f32_to_bf16(x: f32) -> u32 {
  let u = bitcast<u32>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) { return (u >> 16u) | 0x40u; }
  return (u + 0x7fffu + ((u >> 16u) & 1u)) >> 16u;
}
fn round_f16(x: f32) -> f32 { return f16_to_f32(f32_to_f16(x)); }
fn round_bf16(x: f32) -> f32 { return bitcast<f32>(f32_to_bf16(x) << 16u); }
";

const MATH: &str = include_str!("math.wgsl");

/// `maximum` and `minimum` of floats (IEEE 754-2019: NaN wins, -0 is below +0), for `$T` f32
/// and, where the adapter has it, f64. WGSL's `max` and `min` leave both choices open.
const MIN_MAX: &str = "
fn fmax_$T(a: $T, b: $T) -> $T {
  if (isnan_any_$T(a) || isnan_any_$T(b)) { return bitcast<$T>($NAN_BITS); }
  if (a == b) { return select(a, b, (bitcast<$U>(a) >> $SIGN_SHIFT) != $ZERO_U); }
  return select(b, a, a > b);
}
fn fmin_$T(a: $T, b: $T) -> $T {
  if (isnan_any_$T(a) || isnan_any_$T(b)) { return bitcast<$T>($NAN_BITS); }
  if (a == b) { return select(b, a, (bitcast<$U>(a) >> $SIGN_SHIFT) != $ZERO_U); }
  return select(b, a, a < b);
}
fn isnan_any_$T(x: $T) -> bool { return (bitcast<$U>(x) & $ABS_MASK) > $INF_BITS; }
";

/// f64 rounding to the nearest whole number, ties to even, from `floor` and exact arithmetic:
/// lavapipe (Mesa 22.3.6 on an AMD EPYC host) returned -1 for `round(-1.5lf)`. Below 2^52 the
/// fraction `x - floor(x)` is exact; above it (and for NaN and infinities) `x` is whole already.
/// The sign of `x` is kept on a zero result (`round(-0.4) = -0.0`).
const F64_ROUND: &str = "
fn round_even_f64(x: f64) -> f64 {
  if (!(abs(x) < 4503599627370496.0lf)) { return x; }
  let f = floor(x);
  let d = x - f;
  let odd = f - 2.0lf * floor(f * 0.5lf) != 0.0lf;
  let r = select(f, f + 1.0lf, d > 0.5lf || (d == 0.5lf && odd));
  return bitcast<f64>(bitcast<u64>(r) | (bitcast<u64>(x) & 0x8000000000000000lu));
}
";

/// f32 division and floor division correctly rounded where the adapter has f64: Vulkan allows
/// 2.5 ulp for an f32 `/` and NVIDIA's driver uses it. An f32 quotient never lies within 2^-48
/// (relative) of a point halfway between two f32 values, so a quotient computed in f64 to a
/// few of its ulps rounds to the right f32. Zero and infinite divisors are decided here (Vulkan
/// leaves them undefined).
const F32_EXACT: &str = "
fn div_f32(x: f32, y: f32) -> f32 {
  let ax = bitcast<u32>(x) & 0x7fffffffu; let ay = bitcast<u32>(y) & 0x7fffffffu;
  let sign = (bitcast<u32>(x) ^ bitcast<u32>(y)) & 0x80000000u;
  if (ax > 0x7f800000u || ay > 0x7f800000u) { return bitcast<f32>(0x7fc00000u); }
  if (ay == 0u) { return select(bitcast<f32>(sign | 0x7f800000u), bitcast<f32>(0x7fc00000u), ax == 0u); }
  if (ax == 0x7f800000u) { return select(bitcast<f32>(sign | 0x7f800000u), bitcast<f32>(0x7fc00000u), ay == 0x7f800000u); }
  if (ay == 0x7f800000u) { return bitcast<f32>(sign); }
  return f32(f64(x) / f64(y));
}
fn floordiv_f32(x: f32, y: f32) -> f32 {
  let ax = bitcast<u32>(x) & 0x7fffffffu; let ay = bitcast<u32>(y) & 0x7fffffffu;
  if (ay == 0u) { return div_f32(x, y); }
  if (ax >= 0x7f800000u || ay > 0x7f800000u) { return bitcast<f32>(0x7fc00000u); }
  var m = x;
  if (ay != 0x7f800000u) { m = f32(fmod_f64(f64(x), f64(y))); }
  var div = div_f32(x - m, y);
  if (m != 0.0f && ((y < 0.0f) != (m < 0.0f))) { div = div - 1.0f; }
  if (div == 0.0f) { return bitcast<f32>((bitcast<u32>(x) ^ bitcast<u32>(y)) & 0x80000000u); }
  let f = floor(div);
  return select(f, f + 1.0f, div - f > 0.5f);
}
";

/// The same names where the adapter has no f64: WGSL's own division (within 2.5 ulp), and
/// floor division from the f32 math library.
const F32_PLAIN: &str = "
fn div_f32(x: f32, y: f32) -> f32 { return x / y; }
";

/// The f32 square root, correctly rounded where the adapter's `fma` rounds once (probed when
/// the device opens; `Caps::fused_fma`): a Newton step from `inverseSqrt` leaves `s` within an
/// ulp, and the residual `x - s²`, exact in one fused `fma`, says on which side of the
/// midpoints between `s` and its neighbours the root lies. No f64: `randn` (a root per pair)
/// took 1.28 ms instead of 1.57 with the f64 check (2^28 f32, an H100 through Vulkan). Right for
/// every normal f32 there (the driver flushes subnormals), and for every f32 on the CPU with an
/// `inverseSqrt` up to 1,024 ulp off.
const F32_SQRT_FUSED: &str = "
fn sqrt_f32(x: f32) -> f32 {
  let b = bitcast<u32>(x);
  // Below 2^-100 (the residual would be subnormal), zero, negatives, infinities and NaN: one
  // unsigned comparison.
  if (b - 0x0d800000u >= 0x72000000u) {
    if ((b & 0x7fffffffu) > 0x7f800000u || x < 0.0f) { return bitcast<f32>(0x7fc00000u); }
    if (b == 0x7f800000u) { return x; }
    // Zero keeps its sign; a driver that flushes subnormals sees zero here too.
    let scaled = x * 1.8446744073709552e19f;
    if (scaled == 0.0f) { return x; }
    return sqrt_fused_f32(scaled) * 2.3283064365386963e-10f;
  }
  return sqrt_fused_f32(x);
}
fn sqrt_fused_f32(x: f32) -> f32 {
  let y = inverseSqrt(x);
  let s0 = x * y;
  let s = fma(fma(-s0, s0, x), 0.5f * y, s0);
  let r = fma(-s, s, x);
  let b = bitcast<u32>(s);
  // u = ulp(s) (its exponent less 23); the gap below s is half that at a power of two.
  let u = bitcast<f32>((b & 0x7f800000u) - 0x0b800000u);
  let d = select(u, 0.5f * u, (b & 0x7fffffu) == 0u);
  // The root lies past s + u/2 iff r > s u + u²/4; r and s u are whole multiples of u², so
  // iff r > s u. Below s - d/2 iff r <= -s d, likewise.
  let up = select(0u, 1u, r > s * u);
  let down = select(0u, 1u, r <= -(s * d));
  return bitcast<f32>(b + up - down);
}
";

/// The f32 square root where `fma` may round twice and the adapter has f64: WGSL's `sqrt`
/// rounded from f64's, checked against the squares of its neighbouring midpoints, which f64
/// holds exactly.
const F32_SQRT_WIDE: &str = "
fn sqrt_f32(x: f32) -> f32 {
  if (!(x > 0.0f) || (bitcast<u32>(x) & 0x7fffffffu) >= 0x7f800000u) {
    if (x < 0.0f) { return bitcast<f32>(0x7fc00000u); }
    return x;
  }
  let s = f32(sqrt(f64(x)));
  let b = bitcast<u32>(s);
  let hi = (f64(s) + f64(bitcast<f32>(b + 1u))) * 0.5lf;
  if (hi * hi < f64(x)) { return bitcast<f32>(b + 1u); }
  let lo = (f64(s) + f64(bitcast<f32>(b - 1u))) * 0.5lf;
  if (lo * lo > f64(x)) { return bitcast<f32>(b - 1u); }
  return s;
}
";

/// The f32 square root with neither: WGSL's (Vulkan allows 3 ulp).
const F32_SQRT_PLAIN: &str = "
fn sqrt_f32(x: f32) -> f32 { return sqrt(x); }
";

/// f32 exp, expm1, log, log1p and tanh computed in f32 (the math library runs in f64 where
/// the adapter has it, which makes one `exp` cost several times a copy on a GPU): fdlibm's
/// Cody–Waite reduction for exp with a Taylor polynomial short enough for f32, and log from
/// its argument's bits and a fitted polynomial (no division: `randn` 7% faster than fdlibm's
/// atanh series with its quotient). Within 3 ulp (tests/tests/elementwise.rs checks it on
/// every backend; CUDA's `expf`/`tanhf` are within 2).
const F32_FAST: &str = "
fn exp_fast_f32(x: f32) -> f32 {
  if ((bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u) { return x; }
  if (x > 88.72283935546875f) { return bitcast<f32>(0x7f800000u); }
  if (x < -103.97208404541016f) { return 0.0f; }
  return exp_parts_f32(x, 0.0f);
}
// e^(a + b) for a + b in [-105, 88.7], a exact and b the small part of the
// argument: a - k ln2_hi is computed first, so when that is exact (k * ln2_hi is: ln2_hi has 15
// significant bits, |k| <= 152) nothing of a is lost however large it is.
fn exp_parts_f32(a: f32, b: f32) -> f32 {
  let k = round((a + b) * 1.4426950216293335f);
  let r = ((a - k * 0.693145751953125f) + b) - k * 1.4286067653e-06f;
  // Taylor to r^7 on |r| <= ln2 / 2: truncation below 0.03 ulp.
  var p = 1.9841269841e-04f;
  p = p * r + 1.3888888889e-03f;
  p = p * r + 8.3333333333e-03f;
  p = p * r + 4.1666666667e-02f;
  p = p * r + 1.6666666667e-01f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^k in two normal factors (|k| <= 150), built from their bits: the same two roundings as
  // two ldexp calls, without the calls' range checks.
  let h = i32(k) / 2;
  let lo = bitcast<f32>(u32(h + 127) << 23u);
  let hi = bitcast<f32>(u32(i32(k) - h + 127) << 23u);
  return (p * lo) * hi;
}
fn expm1_fast_f32(x: f32) -> f32 {
  if (x == 0.0f) { return x; }
  if (abs(x) < 0.5f) {
    // x (1 + x/2! + ... + x^8/9!): truncation below 1e-9 relative.
    var p = 2.7557319224e-06f;
    p = p * x + 2.4801587302e-05f;
    p = p * x + 1.9841269841e-04f;
    p = p * x + 1.3888888889e-03f;
    p = p * x + 8.3333333333e-03f;
    p = p * x + 4.1666666667e-02f;
    p = p * x + 1.6666666667e-01f;
    p = p * x + 0.5f;
    p = p * x + 1.0f;
    return x * p;
  }
  return exp_fast_f32(x) - 1.0f;
}
// tanh without branches between its two forms (both are computed, one is selected): a
// polynomial below 0.9, and 1 - 2/(e^2a + 1) above, where e^2a comes from the hardware's exp2
// after a Cody–Waite reduction to |r log2 e| <= 1/2, and the quotient from one WGSL division.
// That form shrinks the errors of e^2a and of the quotient (to a third at 0.9, far less
// above), so a few ulp in exp2 or `/` cost about one: within 3 ulp where both are within 2
// (1 ulp measured on lavapipe and NVIDIA; Vulkan's worst-case bounds, 4 and 2.5 ulp, would
// allow slightly more), in a third of the instructions of expm1 and a corrected quotient.
fn tanh_fast_f32(x: f32) -> f32 {
  let a = abs(x);
  // Past 9.1, tanh rounds to 1 in f32.
  if (a > 9.1f) { return select(1.0f, -1.0f, x < 0.0f); }
  // tanh(a) = a + a^3 Q(a^2) on [0, 0.9]: a least-squares fit of relative error,
  // within 1 ulp in f32 (checked against f64 over 2 million points).
  let z = a * a;
  var q = 1.3039461337029934e-03f;
  q = fma(q, z, -6.860022898763418e-03f);
  q = fma(q, z, 2.0904097706079483e-02f);
  q = fma(q, z, -5.372147634625435e-02f);
  q = fma(q, z, 1.3330359756946564e-01f);
  q = fma(q, z, -3.333321213722229e-01f);
  let small = fma(a * z, q, a);
  let y = 2.0f * a;
  let k = round(y * 1.4426950216293335f);
  let r = fma(-k, 1.4286067653e-06f, fma(-k, 0.693145751953125f, y));
  let e = exp2(r * 1.4426950216293335f) * bitcast<f32>(u32(i32(k) + 127) << 23u);
  let large = 1.0f - 2.0f / (e + 1.0f);
  let t = select(large, small, a < 0.9f);
  return select(t, -t, (bitcast<u32>(x) & 0x80000000u) != 0u);
}
// erf and erfc in f32 (the library's series ran in f64: a GELU backward over 2^28 f32 took
// 17 ms on an H200 through Vulkan). erf(x) = x + x p(x^2) below 1, a polynomial fitted to
// erf(x)/x - 1; erfc(x) = e^(-x^2 + L(x)) from 0.5 (to 10.1, past which it is below f32's
// range), L(x) = ln erfc(x) + x^2 fitted on four intervals in s = (x - mid) / half; erfc from
// 1 - erf between -0.5 and 0.5, and 2 - erfc(-x) below; erf from 1 - erfc(|x|) from 1. The
// fits (least squares on Chebyshev nodes against 40-digit values) are within 5e-9; evaluated
// in f32 without fused multiply-adds, both functions are within 1 ulp of the correctly
// rounded value over [-5, 10] (checked on some 40,000 points each in f32 arithmetic); the
// suite's test allows 3.
fn erf_small_f32(x: f32) -> f32 {
  let z = x * x;
  var p = 1.0595261e-06f;
  p = p * z + -1.3911695e-05f;
  p = p * z + 1.1956946e-04f;
  p = p * z + -8.5426704e-04f;
  p = p * z + 0.005223785f;
  p = p * z + -0.026866134f;
  p = p * z + 0.11283791f;
  p = p * z + -0.37612638f;
  p = p * z + 0.12837917f;
  return x * p + x;
}
fn erfc_tail_fast_f32(x: f32) -> f32 {
  if (x > 10.1f) { return 0.0f; }
  var s: f32; var ch: f32; var cl: f32; var q: f32;
  if (x < 1.5f) {
    s = (x - 1.0f) * 2.0f;
    ch = -0.8496094f;
    cl = 3.8650633e-06f;
    q = -1.10815876e-07f;
    q = q * s + 2.4746245e-07f;
    q = q * s + 3.7123552e-06f;
    q = q * s + -6.1841165e-05f;
    q = q * s + 6.2711263e-04f;
    q = q * s + -0.0051951283f;
    q = q * s + 0.039223187f;
    q = q * s + -0.31948376f;
  } else if (x < 3.5f) {
    s = (x - 2.5f) * 1.0f;
    ch = -1.5568085f;
    cl = -6.8010927e-06f;
    q = -1.2164269e-07f;
    q = q * s + 1.7220398e-06f;
    q = q * s + -1.2791613e-05f;
    q = q * s + 7.707651e-05f;
    q = q * s + -4.209166e-04f;
    q = q * s + 0.0021654598f;
    q = q * s + -0.010858076f;
    q = q * s + 0.05610627f;
    q = q * s + -0.35268074f;
  } else if (x < 5.5f) {
    s = (x - 4.5f) * 1.0f;
    ch = -2.099762f;
    cl = -6.3405396e-06f;
    q = -2.3854096e-08f;
    q = q * s + 1.7696948e-07f;
    q = q * s + -1.2093154e-06f;
    q = q * s + 8.425444e-06f;
    q = q * s + -5.7983376e-05f;
    q = q * s + 3.994362e-04f;
    q = q * s + -0.0028252609f;
    q = q * s + 0.02163711f;
    q = q * s + -0.21240127f;
  } else {
    s = (x - 7.8f) * 0.4347826f;
    ch = -2.634552f;
    cl = 7.427325e-06f;
    q = -1.0864736e-06f;
    q = q * s + 4.7035774e-06f;
    q = q * s + -1.7887669e-05f;
    q = q * s + 7.883514e-05f;
    q = q * s + -3.5382895e-04f;
    q = q * s + 0.0016186008f;
    q = q * s + -0.0077813054f;
    q = q * s + 0.041466385f;
    q = q * s + -0.29021302f;
  }
  // ln erfc(x) = ch + cl + s q(s) - x^2, its exponential with the argument in two parts:
  // a = ch - xh^2 is exact (xh keeps 10 significant bits of x, ch is a multiple of 2^-16), and
  // so is a - k ln2_hi, so an argument near -100 loses nothing.
  let xh = bitcast<f32>(bitcast<u32>(x) & 0xffffc000u);
  return exp_parts_f32(ch - xh * xh, (cl + s * q) - (x - xh) * (x + xh));
}
fn erfc_fast_f32(x: f32) -> f32 {
  if ((bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u) { return x; }
  if (x >= 0.5f) { return erfc_tail_fast_f32(x); }
  if (x > -0.5f) { return 1.0f - erf_small_f32(x); }
  return 2.0f - erfc_tail_fast_f32(-x);
}
fn erf_fast_f32(x: f32) -> f32 {
  let a = abs(x);
  if ((bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u) { return x; }
  if (a < 1.0f) { return erf_small_f32(x); }
  // Past 4, erf rounds to 1 in f32.
  if (a > 4.0f) { return select(1.0f, -1.0f, x < 0.0f); }
  let r = 1.0f - erfc_tail_fast_f32(a);
  return select(r, -r, x < 0.0f);
}
// log x = k ln 2 + log1p(m - 1) with m in [sqrt(1/2), sqrt(2)): m and k from x's bits (its
// offset from sqrt(1/2)'s bits), no frexp; one unsigned comparison sends zero, subnormals,
// negatives, infinities and NaN to the slow path.
fn log_fast_f32(x: f32) -> f32 {
  var b = bitcast<u32>(x);
  var k0 = 0;
  if (b - 0x00800000u >= 0x7f000000u) {
    if ((b & 0x7fffffffu) > 0x7f800000u || x < 0.0f) { return bitcast<f32>(0x7fc00000u); }
    if (b == 0x7f800000u) { return x; }
    // Zero and subnormals, scaled by 2^23 (a driver that flushes subnormals sees zero).
    let y = x * 8388608.0f;
    if (y == 0.0f) { return bitcast<f32>(0xff800000u); }
    b = bitcast<u32>(y);
    k0 = -23;
  }
  let t = b - 0x3f3504f3u;
  let k = f32((bitcast<i32>(t) >> 23u) + k0);
  let f = bitcast<f32>(b - (t & 0xff800000u)) - 1.0f;
  // k ln2_hi is exact (ln2_hi has 15 significant bits, |k| <= 149).
  return fma(k, 0.693145751953125f, fma(k, 1.4286067653e-06f, log1p_core_f32(f)));
}
// log(1 + f) for f in [sqrt(1/2) - 1, sqrt(2) - 1] as f + f^2 Q(f), Q of degree 7 fitted for
// the relative error of the whole (2^-24.8 with its coefficients in f32): no division. Within
// 1 ulp for every f32 log, whether `fma` rounds once or twice (every positive f32 checked
// against f64 on the CPU).
fn log1p_core_f32(f: f32) -> f32 {
  var q = 8.734690398e-02f;
  q = fma(q, f, -1.430745721e-01f);
  q = fma(q, f, 1.491799951e-01f);
  q = fma(q, f, -1.657051742e-01f);
  q = fma(q, f, 1.996207088e-01f);
  q = fma(q, f, -2.500175536e-01f);
  q = fma(q, f, 3.333395123e-01f);
  q = fma(q, f, -4.999999106e-01f);
  return fma(f * f, q, f);
}
fn log1p_fast_f32(x: f32) -> f32 {
  // -0 keeps its sign (f + f^2 Q(f) would give +0).
  if (x == 0.0f) { return x; }
  // Near 0 from x itself: no 1 + x to round (nor a (1 + x) - 1 a shader compiler may fold).
  if (x > -0.2928932f && x < 0.41421356f) { return log1p_core_f32(x); }
  return log_fast_f32(1.0f + x);
}
";

/// f32 sine and cosine where the adapter has f64: arguments up to 8 in magnitude (`randn`'s
/// angles among them) reduced in f32 by Cody–Waite steps (`k ≤ 5`; π/2 in parts of 21, 21 and
/// 24 bits, so `k·C1` and `k·C2` are exact and the steps exact but the last, even where an
/// `fma` is a rounded multiply and add, as on lavapipe), larger ones
/// in f64 by math.wgsl's steps (exact enough for every f32 below 2^16; larger ones, NaN and
/// infinities take the library's whole f64 path); then polynomials fitted in f32 and the
/// quadrant by swapping the two and flipping sign bits. Within 3 ulp like F32_FAST's
/// functions; the library's f64 series, a division per term, made one sine cost about ten adds.
const F32_SINCOS: &str = "
fn sincos_fast_f32(x: f32) -> vec2<f32> {
  if (x == 0.0f) { return vec2<f32>(x, 1.0f); }
  // Past 8 in magnitude (and NaN, infinities) on a path of its own: an early return made
  // randn 2% faster on an H100 through Vulkan than one branch holding both reductions.
  if (!(abs(x) <= 8.0f)) { return sincos_wide_f32(x); }
  let k = round(x * 0.636619772f);
  return sincos_poly_f32(fma(-k, 6.22337197e-14f, fma(-k, 3.13916416e-07f, fma(-k, 1.57079601f, x))), k);
}
fn sincos_wide_f32(x: f32) -> vec2<f32> {
  if (!(abs(x) < 65536.0f)) {
    let w = sincos_f64(f64(x));
    return vec2<f32>(f32(w.x), f32(w.y));
  }
  let xd = f64(x);
  let kd = round(xd * 0.63661977236758134308lf);
  // In fma form, as in math.wgsl's sincos (NVIDIA's compiler folds the plain form's parts).
  let r = f32(fma(-kd, 2.02226624879595063154e-21lf,
      fma(-kd, 6.07710050630396597660e-11lf, fma(-kd, 1.57079632673412561417e+00lf, xd))));
  return sincos_poly_f32(r, f32(kd));
}
// (sin, cos) of r + k π/2 for |r| <= 0.8.
fn sincos_poly_f32(r: f32, k: f32) -> vec2<f32> {
  // sin r = r + r^3 P(r^2) and cos r = 1 + r^2 Q(r^2), fitted on |r| <= 0.8 (relative errors
  // 7e-9 and 4e-9 with the coefficients in f32).
  let z = r * r;
  let s = fma(r * z, fma(fma(-1.95009154e-04f, z, 8.33205041e-03f), z, -1.66666523e-01f), r);
  let c = fma(z, fma(fma(fma(2.43650829e-05f, z, -1.38864759e-03f), z, 4.16666120e-02f), z,
      -0.5f), 1.0f);
  // Quadrant k mod 4: odd ones swap sine and cosine; bit 1 of k (of k + 1) negates the sine
  // (the cosine).
  let q = i32(k);
  let odd = (q & 1) == 1;
  let a = select(s, c, odd);
  let b = select(c, s, odd);
  return vec2<f32>(bitcast<f32>(bitcast<u32>(a) ^ (u32(q & 2) << 30u)),
      bitcast<f32>(bitcast<u32>(b) ^ (u32((q + 1) & 2) << 30u)));
}
";

/// The float helpers every kernel computing in floats includes.
fn float_helpers(caps: Caps) -> String {
    let mut s = instantiate(MIN_MAX, false);
    if caps.f64 {
        s += &instantiate(MIN_MAX, true);
        s += F64_ROUND;
        s += F32_EXACT;
        s += F32_SINCOS;
    } else {
        s += F32_PLAIN;
    }
    s += match (caps.fused_fma, caps.f64) {
        (true, _) => F32_SQRT_FUSED,
        (false, true) => F32_SQRT_WIDE,
        (false, false) => F32_SQRT_PLAIN,
    };
    s += F32_FAST;
    s
}

/// The float type the math library runs in: f64 where the adapter has it.
pub(crate) fn math_type(caps: Caps) -> &'static str {
    if caps.f64 {
        "f64"
    } else {
        "f32"
    }
}

/// `math.wgsl` instantiated for `f64` or `f32`.
fn math(caps: Caps) -> String {
    instantiate(MATH, caps.f64)
}

/// A `$T`-generic piece of WGSL for `f64` (`wide`) or `f32`.
fn instantiate(template: &str, wide: bool) -> String {
    let subs: [(&str, &str); 14] = if wide {
        [
            ("$INF_BITS", "0x7ff0000000000000lu"),
            ("$NAN_BITS", "0x7ff8000000000000lu"),
            ("$SIGN_SHIFT", "63u"),
            ("$ZERO_U", "0lu"),
            ("$ABS_MASK", concat!("0x7fffffffffffffff", "lu")),
            ("$T", "f64"),
            ("$U", "u64"),
            ("$L", "lf"),
            ("$MANT_BITS", "52u"),
            ("$EXP_BIAS", "1075"),
            ("$MANT_MASK", concat!("0xfffffffffffff", "lu")),
            ("$IMPLICIT_BIT", concat!("0x10000000000000", "lu")),
            // Cody–Waite below 2^19; f32's constants are too short for it past π/4.
            ("$PH_MIN", "524288.0lf"),
            // Bits a significand (< 2^53) may be shifted by and stay in 64 bits.
            ("$CHUNK", "11"),
        ]
    } else {
        [
            ("$INF_BITS", "0x7f800000u"),
            ("$NAN_BITS", "0x7fc00000u"),
            ("$SIGN_SHIFT", "31u"),
            ("$ZERO_U", "0u"),
            ("$ABS_MASK", "0x7fffffffu"),
            ("$T", "f32"),
            ("$U", "u32"),
            ("$L", "f"),
            ("$MANT_BITS", "23u"),
            ("$EXP_BIAS", "150"),
            ("$MANT_MASK", "0x7fffffu"),
            ("$IMPLICIT_BIT", "0x800000u"),
            ("$PH_MIN", "0.785f"),
            ("$CHUNK", "8"),
        ]
    };
    let mut s = template.to_string();
    for (k, v) in subs {
        s = s.replace(k, v);
    }
    s
}

/// Every dtype a tree computes in (its nodes' and their operands').
pub(crate) fn dtypes_of(e: &Expr, out: &mut BTreeSet<DType>) {
    out.insert(e.dtype);
    e.children().for_each(|c| dtypes_of(c, out));
}

/// Philox4x32-10 (the words of counter `[c0, c1, 0, 0]` under key `[k0, k1]`) with its ten
/// rounds written out, each round's key a literal offset of the first: NVIDIA's Vulkan driver
/// kept a `for` loop over the rounds as a loop, and unrolled `randn` took 0.82 ms instead of
/// 1.13 (2^28 f32 on an H100).
fn philox_source() -> String {
    let mut s = String::from(
        "fn philox_round(c: vec4<u32>, k0: u32, k1: u32) -> vec4<u32> {
  let p0 = mul_hi_lo(0xD2511F53u, c.x);
  let p1 = mul_hi_lo(0xCD9E8D57u, c.z);
  return vec4<u32>(p1.x ^ c.y ^ k0, p1.y, p0.x ^ c.w ^ k1, p0.y);
}
fn philox4(key0: u32, key1: u32, ctr0: u32, ctr1: u32) -> vec4<u32> {
  var c = vec4<u32>(ctr0, ctr1, 0u, 0u);
",
    );
    for round in 0..10u32 {
        let (w0, w1) = (
            0x9E37_79B9u32.wrapping_mul(round),
            0xBB67_AE85u32.wrapping_mul(round),
        );
        s += &format!("  c = philox_round(c, key0 + {w0:#x}u, key1 + {w1:#x}u);\n");
    }
    s += "  return c;
}
// Word w of it.
fn philox(key0: u32, key1: u32, ctr0: u32, ctr1: u32, w: u32) -> u32 {
  return philox4(key0, key1, ctr0, ctr1)[w];
}
";
    s
}

/// The high and low words of a 32×32-bit product (Philox's rounds take two): one 64-bit
/// multiply where the adapter has 64-bit integers (rand 1.5× faster on an H200 through Vulkan
/// than the 16-bit pieces), else four 16-bit partial products for the high word.
fn mul_hi_lo(caps: Caps) -> &'static str {
    if caps.int64 {
        "fn mul_hi_lo(a: u32, b: u32) -> vec2<u32> {
  let p = u64(a) * u64(b);
  return vec2<u32>(u32(p >> 32u), u32(p));
}
"
    } else {
        "fn mul_hi_lo(a: u32, b: u32) -> vec2<u32> {
  let a0 = a & 0xffffu; let a1 = a >> 16u; let b0 = b & 0xffffu; let b1 = b >> 16u;
  let p01 = a0 * b1; let p10 = a1 * b0;
  let mid = ((a0 * b0) >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
  return vec2<u32>(a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u), a * b);
}
"
    }
}

/// The helpers for kernels computing in `dtypes`.
pub(crate) fn helpers(dtypes: &BTreeSet<DType>, caps: Caps) -> String {
    let mut s = String::from(mul_hi_lo(caps));
    s.push_str(&philox_source());
    s.push_str(HALF);
    if dtypes.iter().any(|d| d.is_float()) {
        s.push_str(&math(caps));
        s.push_str(&float_helpers(caps));
    }
    for &d in dtypes {
        if d.is_int() {
            s.push_str(&int_helpers(d));
        }
    }
    s
}

/// Integer helpers for dtype `d`, named `<op>_<dtype>`.
fn int_helpers(d: DType) -> String {
    let t = compute_type(d);
    let signed = t.starts_with('i');
    let narrow = d.itemsize() < 4;
    let bits = d.itemsize() * 8;
    let (min, max) = super::int_range(d);
    let l = |v: i128| literal(d, v);
    let (z, one) = (l(0), l(1));
    let (mn, mx) = (l(min), l(max));
    let nm = d.name();
    let mut out = format!(
        "fn wrap_{nm}(x: {t}) -> {t} {{ return {}; }}\n",
        wrap(d, "x")
    );
    let bits_l = l(bits as i128);
    if signed {
        let m1 = l(-1);
        out += &format!(
            "fn floordiv_{nm}(a: {t}, b: {t}) -> {t} {{
  if (b == {z}) {{ return {z}; }}
  if (b == {m1}) {{ return wrap_{nm}(-a); }}
  let q = a / b;
  if (q * b != a && ((a < {z}) != (b < {z}))) {{ return q - {one}; }}
  return q;
}}
fn rem_{nm}(a: {t}, b: {t}) -> {t} {{
  if (b == {z} || b == {m1}) {{ return {z}; }}
  let r = a % b;
  if (r != {z} && ((r < {z}) != (b < {z}))) {{ return r + b; }}
  return r;
}}
fn pow_{nm}(base: {t}, e: {t}) -> {t} {{
  if (e < {z}) {{
    if (base == {one}) {{ return {one}; }}
    if (base == {m1}) {{ return select(base, {one}, e % {l2} == {z}); }}
    return {z};
  }}
  var acc = {one}; var a = base; var n = e;
  loop {{
    if (n <= {z}) {{ break; }}
    if ((n & {one}) == {one}) {{ acc = wrap_{nm}(acc * a); }}
    a = wrap_{nm}(a * a);
    n = n >> 1u;
  }}
  return acc;
}}
fn shl_{nm}(a: {t}, b: {t}) -> {t} {{
  if (b < {z} || b >= {bits_l}) {{ return {z}; }}
  return wrap_{nm}(a << u32(b));
}}
fn shr_{nm}(a: {t}, b: {t}) -> {t} {{
  if (b < {z} || b >= {bits_l}) {{ return select({z}, {m1}, a < {z}); }}
  return a >> u32(b);
}}
fn divs_{nm}(a: {t}, b: {t}) -> {t} {{
  if (b == {z}) {{ return {z}; }}
  if (a == {mn} && b == {m1}) {{ return {mx}; }}
  return a / b;
}}
fn negs_{nm}(a: {t}) -> {t} {{ return select(-a, {mx}, a == {mn}); }}
",
            l2 = l(2)
        );
        if narrow {
            out += &format!(
                "fn adds_{nm}(a: {t}, b: {t}) -> {t} {{ return clamp(a + b, {mn}, {mx}); }}
fn subs_{nm}(a: {t}, b: {t}) -> {t} {{ return clamp(a - b, {mn}, {mx}); }}
fn muls_{nm}(a: {t}, b: {t}) -> {t} {{ return clamp(a * b, {mn}, {mx}); }}
"
            );
        } else {
            out += &format!(
                "fn adds_{nm}(a: {t}, b: {t}) -> {t} {{
  let r = a + b;
  if (((a ^ r) & (b ^ r)) < {z}) {{ return select({mx}, {mn}, a < {z}); }}
  return r;
}}
fn subs_{nm}(a: {t}, b: {t}) -> {t} {{
  let r = a - b;
  if (((a ^ b) & (a ^ r)) < {z}) {{ return select({mx}, {mn}, a < {z}); }}
  return r;
}}
fn muls_{nm}(a: {t}, b: {t}) -> {t} {{
  if (a == {z} || b == {z}) {{ return {z}; }}
  let r = a * b;
  if (r / b != a || (a == {m1} && b == {mn}) || (b == {m1} && a == {mn})) {{
    return select({mx}, {mn}, (a < {z}) != (b < {z}));
  }}
  return r;
}}
",
                m1 = l(-1)
            );
        }
    } else {
        out += &format!(
            "fn floordiv_{nm}(a: {t}, b: {t}) -> {t} {{ if (b == {z}) {{ return {z}; }} return a / b; }}
fn rem_{nm}(a: {t}, b: {t}) -> {t} {{ if (b == {z}) {{ return {z}; }} return a % b; }}
fn pow_{nm}(base: {t}, e: {t}) -> {t} {{
  var acc = {one}; var a = base; var n = e;
  loop {{
    if (n == {z}) {{ break; }}
    if ((n & {one}) == {one}) {{ acc = wrap_{nm}(acc * a); }}
    a = wrap_{nm}(a * a);
    n = n >> 1u;
  }}
  return acc;
}}
fn shl_{nm}(a: {t}, b: {t}) -> {t} {{
  if (b >= {bits_l}) {{ return {z}; }}
  return wrap_{nm}(a << u32(b));
}}
fn shr_{nm}(a: {t}, b: {t}) -> {t} {{
  if (b >= {bits_l}) {{ return {z}; }}
  return a >> u32(b);
}}
fn divs_{nm}(a: {t}, b: {t}) -> {t} {{ if (b == {z}) {{ return {z}; }} return a / b; }}
fn negs_{nm}(a: {t}) -> {t} {{ return {z}; }}
fn subs_{nm}(a: {t}, b: {t}) -> {t} {{ return select(a - b, {z}, a < b); }}
"
        );
        if narrow {
            out += &format!(
                "fn adds_{nm}(a: {t}, b: {t}) -> {t} {{ return min(a + b, {mx}); }}
fn muls_{nm}(a: {t}, b: {t}) -> {t} {{ return min(a * b, {mx}); }}
"
            );
        } else {
            out += &format!(
                "fn adds_{nm}(a: {t}, b: {t}) -> {t} {{ let r = a + b; return select(r, {mx}, r < a); }}
fn muls_{nm}(a: {t}, b: {t}) -> {t} {{
  if (a == {z}) {{ return {z}; }}
  let r = a * b;
  return select(r, {mx}, r / a != b);
}}
"
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_takes_a_wide_multiply_where_the_adapter_has_64_bit_integers() {
        for int64 in [true, false] {
            let caps = Caps {
                int64,
                f64: false,
                f16: false,
                fused_fma: false,
                coop_f16: false,
                subgroups: false,
            };
            let src = format!(
                "{}@group(0) @binding(0) var<storage, read_write> out: array<u32>;\n\
                 @compute @workgroup_size(1) fn main() {{ out[0] = philox4(1u, 2u, 3u, 4u).x; }}\n",
                helpers(&BTreeSet::from([DType::U32]), caps)
            );
            assert_eq!(src.contains("u64(a) * u64(b)"), int64, "{src}");
            let c = if int64 {
                naga::valid::Capabilities::SHADER_INT64
            } else {
                naga::valid::Capabilities::empty()
            };
            let module = naga::front::wgsl::parse_str(&src).unwrap();
            naga::valid::Validator::new(naga::valid::ValidationFlags::all(), c)
                .validate(&module)
                .unwrap_or_else(|e| panic!("int64 {int64}: {}\n{src}", e.emit_to_string(&src)));
        }
    }
}
