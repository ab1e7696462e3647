// strata's float functions for WGSL, written once for `$T` (f64, or f32 where the adapter has no
// f64) so that every backend computes exp, log, sin, pow, erf, ... to the documented accuracy
// (WGSL's builtins are loose, and Vulkan has no f64 transcendentals). `$L` is the literal suffix,
// `$U` the same-width unsigned type. Taylor and atanh series after Cody–Waite range reduction.

fn inf_$T() -> $T { return bitcast<$T>($INF_BITS); }
fn nan_$T() -> $T { return bitcast<$T>($NAN_BITS); }
fn signbit_$T(x: $T) -> bool { return (bitcast<$U>(x) >> $SIGN_SHIFT) != $ZERO_U; }
fn isnan_$T(x: $T) -> bool { return (bitcast<$U>(x) & $ABS_MASK) > $INF_BITS; }
fn isinf_$T(x: $T) -> bool { return (bitcast<$U>(x) & $ABS_MASK) == $INF_BITS; }
fn copysign_$T(x: $T, s: $T) -> $T { return select(abs(x), -abs(x), signbit_$T(s)); }

fn exp_$T(x: $T) -> $T {
  if (isnan_$T(x)) { return x; }
  if (x > 709.79$L) { return inf_$T(); }
  if (x < -745.2$L) { return 0.0$L; }
  let k = round(x * 1.4426950408889634$L);
  // fma keeps the split constant's parts apart (see sincos).
  let r = fma(-k, 1.90821492927058770002e-10$L, fma(-k, 6.93147180369123816490e-01$L, x));
  var p = 1.0$L;
  for (var i = 14; i >= 1; i--) { p = 1.0$L + p * r / $T(i); }
  // Two steps keep the scale factor finite near the ends of the range.
  let h = i32(k) / 2;
  return ldexp(ldexp(p, h), i32(k) - h);
}

fn expm1_$T(x: $T) -> $T {
  if (x == 0.0$L) { return x; }
  if (abs(x) < 0.5$L) {
    var p = 1.0$L;
    for (var i = 19; i >= 2; i--) { p = 1.0$L + p * x / $T(i); }
    return x * p;
  }
  return exp_$T(x) - 1.0$L;
}

fn log_$T(x: $T) -> $T {
  if (isnan_$T(x) || x < 0.0$L) { return nan_$T(); }
  if (x == 0.0$L) { return -inf_$T(); }
  if (isinf_$T(x)) { return x; }
  let fr = frexp(x);
  var m = fr.fract;
  var e = $T(fr.exp);
  if (m < 0.70710678118654752440$L) { m = m * 2.0$L; e = e - 1.0$L; }
  let s = (m - 1.0$L) / (m + 1.0$L);
  let s2 = s * s;
  var p = 0.0$L;
  for (var j = 12; j >= 0; j--) { p = 1.0$L / $T(2 * j + 1) + s2 * p; }
  return 2.0$L * s * p + e * 1.90821492927058770002e-10$L + e * 6.93147180369123816490e-01$L;
}

fn log1p_$T(x: $T) -> $T {
  if (isinf_$T(x) && x > 0.0$L) { return x; }
  let u = 1.0$L + x;
  if (u == 1.0$L) { return x; }
  // x / (u - 1) first: log(u) * x overflows for x near the largest value.
  return log_$T(u) * (x / (u - 1.0$L));
}

// Bits of 2/π after the binary point, 32 to a word: enough for any f64 exponent.
var<private> TWO_OVER_PI: array<u32, 40> = array<u32, 40>(
  0xa2f9836eu, 0x4e441529u, 0xfc2757d1u, 0xf534ddc0u, 0xdb629599u, 0x3c439041u, 0xfe5163abu,
  0xdebbc561u, 0xb7246e3au, 0x424dd2e0u, 0x06492eeau, 0x09d1921cu, 0xfe1deb1cu, 0xb129a73eu,
  0xe88235f5u, 0x2ebb4484u, 0xe99c7026u, 0xb45f7e41u, 0x3991d639u, 0x835339f4u, 0x9c845f8bu,
  0xbdf9283bu, 0x1ff897ffu, 0xde05980fu, 0xef2f118bu, 0x5a0a6d1fu, 0x6d367ecfu, 0x27cb09b7u,
  0x4f463f66u, 0x9e5fea2du, 0x7527bac7u, 0xebe5f17bu, 0x3d0739f7u, 0x8a5292eau, 0x6bfb5fb1u,
  0x1f8d5d08u, 0x56033046u, 0xfc7b6babu, 0xf0cfbc20u, 0x9af4361du);

// 32 bits of 2/π starting `o` bits after the point.
fn two_over_pi_at(o: u32) -> u32 {
  let a = o >> 5u;
  let b = o & 31u;
  if (b == 0u) { return TWO_OVER_PI[a]; }
  return (TWO_OVER_PI[a] << b) | (TWO_OVER_PI[a + 1u] >> (32u - b));
}

// The full product of two words: (low word, high word).
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
  let al = a & 0xffffu; let ah = a >> 16u;
  let bl = b & 0xffffu; let bh = b >> 16u;
  let ll = al * bl;
  let mid = al * bh;
  let mid2 = mid + ah * bl;
  let mid_carry = select(0u, 0x10000u, mid2 < mid);
  let lo = ll + (mid2 << 16u);
  return vec2<u32>(lo, ah * bh + (mid2 >> 16u) + mid_carry + select(0u, 1u, lo < ll));
}

// 32 bits of the 256-bit number `p` (eight little-endian words) starting at bit `pos`.
fn bits_at(p: ptr<function, array<u32, 8>>, pos: u32) -> u32 {
  let i = pos >> 5u;
  let b = pos & 31u;
  if (b == 0u) { return (*p)[i]; }
  return ((*p)[i] >> b) | ((*p)[i + 1u] << (32u - b));
}

// Payne–Hanek reduction for |x| past the Cody–Waite range: x·(2/π) = q + f computed exactly
// enough from the 160 bits of 2/π that matter for x's exponent (earlier bits only add
// multiples of 4). Returns (f·π/2, q mod 4).
fn rem_pio2_big_$T(x: $T) -> vec2<$T> {
  // |x| = mant · 2^e with mant an integer, read from the bits (NVIDIA's compiler rejects
  // frexp here).
  let bits = bitcast<$U>(abs(x));
  let e = i32(bits >> $MANT_BITS) - $EXP_BIAS;
  let mant = $T((bits & $MANT_MASK) | $IMPLICIT_BIT);
  let m_hi = floor(mant / 4294967296.0$L);
  var m = array<u32, 2>(u32(mant - m_hi * 4294967296.0$L), u32(m_hi));
  let s = max(1, e - 1);  // the first bit of 2/π used (1-based)
  var w: array<u32, 5>;
  for (var j = 0; j < 5; j++) { w[j] = two_over_pi_at(u32(s - 1 + 32 * (4 - j))); }
  var p: array<u32, 8>;
  for (var i = 0; i < 2; i++) {
    var carry = 0u;
    for (var j = 0; j < 5; j++) {
      let prod = mul_wide(m[i], w[j]);
      let t = p[i + j] + prod.x;
      let t2 = t + carry;
      carry = prod.y + select(0u, 1u, t < prod.x) + select(0u, 1u, t2 < t);
      p[i + j] = t2;
    }
    p[i + 5] = carry;
  }
  let point = u32(s + 159 - e);  // p has this many bits after the binary point
  var q = bits_at(&p, point) & 3u;
  var f2 = bits_at(&p, point - 32u);
  var f1 = bits_at(&p, point - 64u);
  var f0 = bits_at(&p, point - 96u);
  var sign = 1.0$L;
  if (f2 >= 0x80000000u) {
    // f ≥ ½: use f − 1, negating the 96 fraction bits as integers so nothing cancels.
    q = q + 1u;
    sign = -1.0$L;
    f0 = ~f0 + 1u;
    let c0 = select(0u, 1u, f0 == 0u);
    f1 = ~f1 + c0;
    let c1 = select(0u, 1u, c0 == 1u && f1 == 0u);
    f2 = ~f2 + c1;
  }
  let f = ldexp($T(f2), -32) + ldexp($T(f1), -64) + ldexp($T(f0), -96);
  var r = sign * (f * 1.57079632679489655800e+00$L + f * 6.12323399573676603587e-17$L);
  if (x < 0.0$L) { r = -r; q = 4u - q; }
  return vec2<$T>(r, $T(q & 3u));
}

// (sin x, cos x).
fn sincos_$T(x: $T) -> vec2<$T> {
  if (isnan_$T(x) || isinf_$T(x)) { return vec2<$T>(nan_$T(), nan_$T()); }
  // ±0 returned as is: Vulkan need not keep a zero's sign through arithmetic (NVIDIA's f16
  // tan(-0) came back +0).
  if (x == 0.0$L) { return vec2<$T>(x, 1.0$L); }
  var r: $T;
  var q: i32;
  if (abs(x) < $PH_MIN) {
    // Cody–Waite: k·C1 is exact while k < 2^20. In fma form: NVIDIA's Vulkan compiler folds
    // `(x - k*C1) - k*C2` into `x - k*(C1 + C2)`, losing C2's extra bits (f32 sin was 24 ulp
    // off near a multiple of π there).
    let k = round(x * 0.63661977236758134308$L);
    r = fma(-k, 2.02226624879595063154e-21$L,
        fma(-k, 6.07710050630396597660e-11$L, fma(-k, 1.57079632673412561417e+00$L, x)));
    q = i32(k) & 3;
  } else {
    let rq = rem_pio2_big_$T(x);
    r = rq.x;
    q = i32(rq.y);
  }
  let r2 = r * r;
  var s = 1.0$L;
  for (var i = 10; i >= 1; i--) { s = 1.0$L - s * r2 / $T((2 * i) * (2 * i + 1)); }
  s = s * r;
  var c = 1.0$L;
  for (var i = 10; i >= 1; i--) { c = 1.0$L - c * r2 / $T((2 * i - 1) * (2 * i)); }
  if (q == 0) { return vec2<$T>(s, c); }
  if (q == 1) { return vec2<$T>(c, -s); }
  if (q == 2) { return vec2<$T>(-s, -c); }
  return vec2<$T>(-c, s);
}

fn tanh_$T(x: $T) -> $T {
  if (abs(x) > 22.0$L) { return copysign_$T(1.0$L, x); }
  let t = expm1_$T(2.0$L * abs(x));
  return copysign_$T(t / (t + 2.0$L), x);
}

fn atan_$T(x: $T) -> $T {
  if (isnan_$T(x)) { return x; }
  var a = abs(x);
  let inv = a > 1.0$L;
  if (inv) { a = 1.0$L / a; }
  var base = 0.0$L;
  if (a > 0.41421356237309504880$L) { a = (a - 1.0$L) / (a + 1.0$L); base = 0.78539816339744830962$L; }
  let a2 = a * a;
  var p = 0.0$L;
  for (var j = 24; j >= 0; j--) { p = 1.0$L / $T(2 * j + 1) - a2 * p; }
  var r = base + a * p;
  if (inv) { r = 1.57079632679489661923$L - r; }
  return copysign_$T(r, x);
}

fn atan2_$T(y: $T, x: $T) -> $T {
  let pi = 3.14159265358979323846$L;
  if (isnan_$T(x) || isnan_$T(y)) { return nan_$T(); }
  if (y == 0.0$L) {
    if (signbit_$T(x)) { return copysign_$T(pi, y); }
    return y;
  }
  if (x == 0.0$L) { return copysign_$T(pi / 2.0$L, y); }
  if (isinf_$T(x)) {
    if (isinf_$T(y)) { return copysign_$T(select(pi / 4.0$L, 3.0$L * pi / 4.0$L, x < 0.0$L), y); }
    return copysign_$T(select(0.0$L, pi, x < 0.0$L), y);
  }
  if (isinf_$T(y)) { return copysign_$T(pi / 2.0$L, y); }
  let r = atan_$T(abs(y / x));
  return copysign_$T(select(r, pi - r, x < 0.0$L), y);
}

fn erf_$T(x: $T) -> $T {
  let ax = abs(x);
  var v = 0.0$L;
  if (ax < 2.5$L) {
    var term = ax;
    var sum = ax;
    for (var n = 1; n < 90; n++) {
      term = -term * ax * ax / $T(n);
      sum = sum + term / $T(2 * n + 1);
      if (abs(term) <= 1e-17$L * abs(sum)) { break; }
    }
    v = sum * 1.12837916709551257390$L;
  } else {
    v = 1.0$L - erfc_tail_$T(ax);
  }
  return copysign_$T(v, x);
}

// erfc(x) for x >= 2.5 by its continued fraction.
fn erfc_tail_$T(x: $T) -> $T {
  if (isinf_$T(x)) { return 0.0$L; }
  var f = 0.0$L;
  for (var k = 59; k >= 1; k--) { f = ($T(k) / 2.0$L) / (x + f); }
  return exp_$T(-x * x) / (1.77245385090551602730$L * (x + f));
}

fn erfc_$T(x: $T) -> $T {
  if (x >= 2.5$L) { return erfc_tail_$T(x); }
  return 1.0$L - erf_$T(x);
}

fn pow_$T(x: $T, y: $T) -> $T {
  if (y == 0.0$L || x == 1.0$L) { return 1.0$L; }
  if (isnan_$T(x) || isnan_$T(y)) { return nan_$T(); }
  let ax = abs(x);
  if (isinf_$T(y)) {
    if (ax == 1.0$L) { return 1.0$L; }
    if ((ax < 1.0$L) == (y > 0.0$L)) { return 0.0$L; }
    return inf_$T();
  }
  let y_int = floor(y) == y;
  let y_odd = y_int && abs(y) < 9007199254740992.0$L && floor(y / 2.0$L) * 2.0$L != y;
  if (isinf_$T(x) || x == 0.0$L) {
    // |x|^y is inf or 0; the sign is x's for odd integer y.
    let big = (isinf_$T(x)) == (y > 0.0$L);
    let mag = select(0.0$L, inf_$T(), big);
    return select(mag, copysign_$T(mag, x), y_odd);
  }
  if (x < 0.0$L && !y_int) { return nan_$T(); }
  let r = exp_$T(y * log_$T(ax));
  return select(r, -r, x < 0.0$L && y_odd);
}

// The remainder of x / y with the sign of x (C's fmod) for finite x and y != 0, exactly: the
// quotient's bits leave the integer significands a few at a time ((m << s) % my stays in
// range), so nothing is rounded and nothing depends on whether the driver fuses or splits a
// multiply-add.
fn fmod_$T(x: $T, y: $T) -> $T {
  let ax = bitcast<$U>(x) & $ABS_MASK;
  let ay = bitcast<$U>(y) & $ABS_MASK;
  let sign = bitcast<$U>(x) & ~$ABS_MASK;
  if (ax < ay) { return x; }
  var ex = i32(ax >> $MANT_BITS);
  var ey = i32(ay >> $MANT_BITS);
  var mx = ax & $MANT_MASK;
  var my = ay & $MANT_MASK;
  // A subnormal has exponent field 0, no implicit bit, and the scale of field 1.
  if (ex == 0) { ex = 1; } else { mx = mx | $IMPLICIT_BIT; }
  if (ey == 0) { ey = 1; } else { my = my | $IMPLICIT_BIT; }
  mx = mx % my;
  while (ex > ey && mx != $ZERO_U) {
    let s = min(ex - ey, $CHUNK);
    mx = (mx << u32(s)) % my;
    ex = ex - s;
  }
  if (mx == $ZERO_U) { return bitcast<$T>(sign); }
  // Back to a float at y's scale, normalized as far as the exponent allows (else subnormal).
  while (mx < $IMPLICIT_BIT && ey > 1) { mx = mx << 1u; ey = ey - 1; }
  if (mx < $IMPLICIT_BIT) { return bitcast<$T>(sign | mx); }
  return bitcast<$T>(sign | ($U(ey) << $MANT_BITS) | (mx & $MANT_MASK));
}

// IEEE's x / 0: ±infinity with the sign of the quotient, NaN for 0 / 0 (Vulkan leaves a
// division by zero undefined, so it is decided here).
fn divzero_$T(x: $T, y: $T) -> $T {
  if (isnan_$T(x) || x == 0.0$L) { return nan_$T(); }
  return select(inf_$T(), -inf_$T(), signbit_$T(x) != signbit_$T(y));
}

// Python's float floor division (CPython's algorithm, as NumPy and PyTorch): the quotient of
// x less its exact remainder, corrected to the divisor's sign and rounded to the nearest whole
// number, so -9 // -1e-10 is 89999999999 where floor(x / y) gives 9e10.
fn floordiv_$T(x: $T, y: $T) -> $T {
  if (y == 0.0$L) { return divzero_$T(x, y); }
  if (isnan_$T(x) || isnan_$T(y) || isinf_$T(x)) { return nan_$T(); }
  var m = x;
  if (!isinf_$T(y)) { m = fmod_$T(x, y); }
  var div = (x - m) / y;
  if (m != 0.0$L && ((y < 0.0$L) != (m < 0.0$L))) { div = div - 1.0$L; }
  if (div == 0.0$L) { return select(0.0$L, -0.0$L, signbit_$T(x) != signbit_$T(y)); }
  let f = floor(div);
  return select(f, f + 1.0$L, div - f > 0.5$L);
}

// Python's modulo: the remainder takes the sign of the divisor.
fn rem_$T(x: $T, y: $T) -> $T {
  if (isnan_$T(x) || isnan_$T(y) || isinf_$T(x) || y == 0.0$L) { return nan_$T(); }
  var r = x;
  if (!isinf_$T(y)) { r = fmod_$T(x, y); }
  if (r != 0.0$L && (r < 0.0$L) != (y < 0.0$L)) { r = r + y; }
  return r;
}

fn tan_$T(x: $T) -> $T {
  if (x == 0.0$L) { return x; }
  let sc = sincos_$T(x);
  return sc.x / sc.y;
}
