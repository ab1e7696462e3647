// strata's CUDA prelude: the device helpers every generated kernel may use. The semantics are
// strata-core's (docs/semantics.md); each helper names the rule it implements.
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed char i8;
typedef short i16;
typedef int i32;
typedef long long i64;

// Every launch takes one struct of 64-bit words: sizes, strides, pointers and scalar bits.
template <int N> struct Args { u64 w[N]; };
// A 32-byte vector (two 128-bit accesses): a map whose draws serve eight elements a Philox call.
struct __align__(16) uint4x2 { uint4 lo, hi; };
// A batch of one kernel's launches (crate::batch): how many, then each launch's words.
template <int N, int CAP> struct Batch { u64 count; Args<N> ops[CAP]; };

// Integer traits: signedness, width, range, and the unsigned type wrapping arithmetic runs in
// (32 bits for the narrow types, so a u16 product cannot overflow a promoted int).
template <typename T> struct Int;
#define STRATA_INT(T, S, B, MN, MX, W)                                                        \
  template <> struct Int<T> {                                                                 \
    static constexpr bool is_signed = S;                                                      \
    static constexpr int bits = B;                                                            \
    typedef W wide;                                                                           \
    static constexpr T min_v = MN;                                                            \
    static constexpr T max_v = MX;                                                            \
  };
STRATA_INT(u8, false, 8, 0, 255, u32)
STRATA_INT(u16, false, 16, 0, 65535, u32)
STRATA_INT(u32, false, 32, 0u, 4294967295u, u32)
STRATA_INT(u64, false, 64, 0ull, 18446744073709551615ull, u64)
STRATA_INT(i8, true, 8, -128, 127, u32)
STRATA_INT(i16, true, 16, -32768, 32767, u32)
STRATA_INT(i32, true, 32, (-2147483647 - 1), 2147483647, u32)
STRATA_INT(i64, true, 64, (-9223372036854775807ll - 1), 9223372036854775807ll, u64)

// Wrapping arithmetic (two's complement, like PyTorch and NumPy).
template <typename T> __device__ __forceinline__ T w_add(T a, T b) {
  typedef typename Int<T>::wide W; return (T)((W)a + (W)b);
}
template <typename T> __device__ __forceinline__ T w_sub(T a, T b) {
  typedef typename Int<T>::wide W; return (T)((W)a - (W)b);
}
template <typename T> __device__ __forceinline__ T w_mul(T a, T b) {
  typedef typename Int<T>::wide W; return (T)((W)a * (W)b);
}
template <typename T> __device__ __forceinline__ T w_neg(T a) {
  typedef typename Int<T>::wide W; return (T)((W)0 - (W)a);
}

// Clamps an exact i64 value into T (T at most 32 bits wide).
template <typename T> __device__ __forceinline__ T sat_i64(i64 r) {
  return r < (i64)Int<T>::min_v ? Int<T>::min_v : (r > (i64)Int<T>::max_v ? Int<T>::max_v : (T)r);
}

// Saturating arithmetic (augpy's semantics: 0 - u8(40) is 0).
template <typename T> __device__ T s_add(T a, T b) {
  if constexpr (Int<T>::bits <= 32) {
    return sat_i64<T>((i64)a + (i64)b);
  } else if constexpr (Int<T>::is_signed) {
    T r = w_add(a, b);
    return (((a ^ r) & (b ^ r)) < 0) ? (a < 0 ? Int<T>::min_v : Int<T>::max_v) : r;
  } else {
    T r = a + b;
    return r < a ? Int<T>::max_v : r;
  }
}
template <typename T> __device__ T s_sub(T a, T b) {
  if constexpr (Int<T>::bits <= 32) {
    return sat_i64<T>((i64)a - (i64)b);
  } else if constexpr (Int<T>::is_signed) {
    T r = w_sub(a, b);
    return (((a ^ b) & (a ^ r)) < 0) ? (a < 0 ? Int<T>::min_v : Int<T>::max_v) : r;
  } else {
    return a < b ? (T)0 : (T)(a - b);
  }
}
template <typename T> __device__ T s_mul(T a, T b) {
  if constexpr (Int<T>::bits <= 16 || (Int<T>::bits == 32 && Int<T>::is_signed)) {
    return sat_i64<T>((i64)a * (i64)b);
  } else if constexpr (Int<T>::bits == 32) {
    u64 r = (u64)a * (u64)b;
    return r > (u64)Int<T>::max_v ? Int<T>::max_v : (T)r;
  } else if constexpr (Int<T>::is_signed) {
    i64 lo = (i64)((u64)a * (u64)b);
    i64 hi = __mul64hi(a, b);
    if (hi != (lo >> 63)) return ((a < 0) != (b < 0)) ? Int<T>::min_v : Int<T>::max_v;
    return lo;
  } else {
    return __umul64hi(a, b) != 0 ? Int<T>::max_v : a * b;
  }
}
template <typename T> __device__ T s_div(T a, T b) {
  if (b == 0) return 0;
  if constexpr (Int<T>::is_signed) {
    if (a == Int<T>::min_v && b == (T)-1) return Int<T>::max_v;
  }
  return (T)(a / b);
}
template <typename T> __device__ T s_neg(T a) {
  if constexpr (Int<T>::is_signed) {
    return a == Int<T>::min_v ? Int<T>::max_v : (T)(-a);
  } else {
    return 0;
  }
}

// Python's floor division and modulo; division by zero gives 0.
template <typename T> __device__ T i_floordiv(T a, T b) {
  if (b == 0) return 0;
  if constexpr (Int<T>::is_signed) {
    if (b == (T)-1) return w_neg(a);
    T q = (T)(a / b);
    return ((T)(q * b) != a && ((a < 0) != (b < 0))) ? (T)(q - 1) : q;
  } else {
    return (T)(a / b);
  }
}
template <typename T> __device__ T i_rem(T a, T b) {
  if (b == 0) return 0;
  if constexpr (Int<T>::is_signed) {
    if (b == (T)-1) return 0;
    T r = (T)(a % b);
    return (r != 0 && ((r < 0) != (b < 0))) ? (T)(r + b) : r;
  } else {
    return (T)(a % b);
  }
}
// Integer power by squaring (wrapping); a negative exponent truncates 1/a^|e|.
template <typename T> __device__ T i_pow(T a, T e) {
  if constexpr (Int<T>::is_signed) {
    if (e < 0) {
      if (a == 1) return 1;
      if (a == (T)-1) return i_rem(e, (T)2) == 0 ? (T)1 : a;
      return 0;
    }
  }
  T acc = 1;
  u64 n = (u64)e;
  while (n > 0) {
    if (n & 1) acc = w_mul(acc, a);
    a = w_mul(a, a);
    n >>= 1;
  }
  return acc;
}
// Shifts by a negative amount or by at least the width give 0 (or -1 for a negative `>>`).
template <typename T> __device__ T i_shl(T a, T b) {
  if constexpr (Int<T>::is_signed) { if (b < 0) return 0; }
  if ((u64)b >= (u64)Int<T>::bits) return 0;
  typedef typename Int<T>::wide W;
  return (T)((W)a << (u32)b);
}
template <typename T> __device__ T i_shr(T a, T b) {
  bool out = false;
  if constexpr (Int<T>::is_signed) { out = b < 0; }
  if (out || (u64)b >= (u64)Int<T>::bits) {
    if constexpr (Int<T>::is_signed) { return a < 0 ? (T)-1 : (T)0; } else { return 0; }
  }
  return (T)(a >> (u32)b);
}
template <typename T> __device__ __forceinline__ T i_abs(T a) {
  if constexpr (Int<T>::is_signed) { return a < 0 ? w_neg(a) : a; } else { return a; }
}
template <typename T> __device__ __forceinline__ T i_sign(T a) {
  if constexpr (Int<T>::is_signed) { return a > 0 ? (T)1 : (a == 0 ? (T)0 : (T)-1); }
  else { return a > 0 ? (T)1 : (T)0; }
}

// Casts. Float -> int saturates and maps NaN to 0; int -> int wraps or clamps.
template <typename T> __device__ T f2i(double v) {
  if (v != v) return 0;
  if (v <= (double)Int<T>::min_v) return Int<T>::min_v;
  if (v >= (double)Int<T>::max_v) return Int<T>::max_v;
  return (T)v;
}
template <typename T, typename S> __device__ T sat_cast(S v) {
  if constexpr (Int<S>::is_signed) {
    i64 x = (i64)v;
    if constexpr (Int<T>::is_signed) {
      if (x < (i64)Int<T>::min_v) return Int<T>::min_v;
      if (x > (i64)Int<T>::max_v) return Int<T>::max_v;
      return (T)x;
    } else {
      if (x < 0) return 0;
      return (u64)x > (u64)Int<T>::max_v ? Int<T>::max_v : (T)x;
    }
  } else {
    u64 x = (u64)v;
    return x > (u64)Int<T>::max_v ? Int<T>::max_v : (T)x;
  }
}

// 16-bit floats live as their bits (u16) and are computed in f32.
__device__ __forceinline__ float f16_to_f32(u16 h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ u16 f32_to_f16(float f) {
  u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
__device__ __forceinline__ u16 f64_to_f16(double d) {
  u16 h; asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d)); return h;
}
__device__ __forceinline__ float bf16_to_f32(u16 b) { return __uint_as_float(((u32)b) << 16); }
__device__ __forceinline__ u16 f32_to_bf16(float f) {
  u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return (u16)(u >> 16);
}
// f64 -> bf16 rounded once: round to odd into f32 first, which makes the second rounding exact.
__device__ __forceinline__ u16 f64_to_bf16(double d) {
  if (d != d) return 0x7fc0;
  float f = __double2float_rz(d);
  if ((double)f != d) f = __uint_as_float(__float_as_uint(f) | 1u);
  return f32_to_bf16(f);
}
__device__ __forceinline__ float round_f16(float x) { return f16_to_f32(f32_to_f16(x)); }
__device__ __forceinline__ float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// Float helpers: Python's modulo (sign of the divisor), NaN-propagating max and min.
__device__ __forceinline__ float f_rem(float x, float y) {
  float r = fmodf(x, y); return (r != 0.0f && ((r < 0.0f) != (y < 0.0f))) ? r + y : r;
}
__device__ __forceinline__ double f_rem(double x, double y) {
  double r = fmod(x, y); return (r != 0.0 && ((r < 0.0) != (y < 0.0))) ? r + y : r;
}
// IEEE 754-2019 maximum and minimum: NaN wins, and -0 is below +0 (fmaxf may return either
// zero), so the result does not depend on the operands' order.
__device__ __forceinline__ float f_nan(float) { return __int_as_float(0x7fc00000); }
__device__ __forceinline__ double f_nan(double) { return __longlong_as_double(0x7ff8000000000000ll); }
template <typename F> __device__ __forceinline__ F f_max(F x, F y) {
  if (x != x || y != y) return f_nan(x);
  if (x == y) return signbit(x) ? y : x;
  return x > y ? x : y;
}
template <typename F> __device__ __forceinline__ F f_min(F x, F y) {
  if (x != x || y != y) return f_nan(x);
  if (x == y) return signbit(x) ? x : y;
  return x < y ? x : y;
}
// Python's float floor division (CPython's algorithm, shared by NumPy and PyTorch): the
// quotient of x less its exact remainder, corrected to the divisor's sign and rounded to the
// nearest whole number; x / 0 is IEEE's.
__device__ __forceinline__ float f_floordiv(float x, float y) {
  if (y == 0.0f) return x / y;
  const float m = fmodf(x, y);
  float div = (x - m) / y;
  if (m != 0.0f && ((y < 0.0f) != (m < 0.0f))) div -= 1.0f;
  if (div == 0.0f) return copysignf(0.0f, x / y);
  const float f = floorf(div);
  return (div - f > 0.5f) ? f + 1.0f : f;
}
__device__ __forceinline__ double f_floordiv(double x, double y) {
  if (y == 0.0) return x / y;
  const double m = fmod(x, y);
  double div = (x - m) / y;
  if (m != 0.0 && ((y < 0.0) != (m < 0.0))) div -= 1.0;
  if (div == 0.0) return copysign(0.0, x / y);
  const double f = floor(div);
  return (div - f > 0.5) ? f + 1.0 : f;
}
// -1, 0 or 1; NaN stays NaN and both zeros give +0 (PyTorch's (0 < x) - (x < 0)).
__device__ __forceinline__ float f_sign(float x) {
  return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : (x == 0.0f ? 0.0f : x));
}
__device__ __forceinline__ double f_sign(double x) {
  return x > 0.0 ? 1.0 : (x < 0.0 ? -1.0 : (x == 0.0 ? 0.0 : x));
}
__device__ __forceinline__ bool f_isinf(float x) { return fabsf(x) == __int_as_float(0x7f800000); }
__device__ __forceinline__ bool f_isinf(double x) {
  return fabs(x) == __longlong_as_double(0x7ff0000000000000ll);
}

// A non-negative index as u64 (no sign extension to undo).
__device__ __forceinline__ u64 upos(i32 x) { return (u64)(u32)x; }
__device__ __forceinline__ u64 upos(i64 x) { return (u64)x; }

// Philox4x32-10: the four words of counter [c lo, c hi, 0, 0] under key [k lo, k hi].
__device__ __forceinline__ void philox4(u64 key, u64 counter, u32 out[4]) {
  u32 c0 = (u32)counter, c1 = (u32)(counter >> 32), c2 = 0, c3 = 0;
  u32 k0 = (u32)key, k1 = (u32)(key >> 32);
#pragma unroll
  for (int round = 0; round < 10; round++) {
    if (round > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
    u32 hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    u32 hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    u32 n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

// Word `i` of four (a select chain: a computed index into a local array would spill it).
__device__ __forceinline__ u32 pick4(const u32 w[4], int i) {
  return i == 0 ? w[0] : (i == 1 ? w[1] : (i == 2 ? w[2] : w[3]));
}

// Word `w` of Philox4x32-10 of that counter.
__device__ __forceinline__ u32 philox(u64 key, u64 counter, int w) {
  u32 out[4];
  philox4(key, counter, out);
  return pick4(out, w);
}

// Atomic read-modify-write of one element of any width (sub-word elements through their
// aligned 32-bit word), for scatter with accumulation.
template <typename S, typename F> __device__ void atomic_update(S* addr, F f) {
  if constexpr (sizeof(S) == 8) {
    u64* a = (u64*)addr;
    u64 old = *a, assumed;
    do {
      assumed = old;
      S v; memcpy(&v, &assumed, 8);
      S n = f(v);
      u64 bits; memcpy(&bits, &n, 8);
      old = atomicCAS(a, assumed, bits);
    } while (old != assumed);
  } else if constexpr (sizeof(S) == 4) {
    u32* a = (u32*)addr;
    u32 old = *a, assumed;
    do {
      assumed = old;
      S v; memcpy(&v, &assumed, 4);
      S n = f(v);
      u32 bits; memcpy(&bits, &n, 4);
      old = atomicCAS(a, assumed, bits);
    } while (old != assumed);
  } else {
    u64 p = (u64)addr;
    u32* a = (u32*)(p & ~(u64)3);
    u32 shift = (u32)(p & 3) * 8;
    u32 mask = (sizeof(S) == 1 ? 0xffu : 0xffffu) << shift;
    u32 old = *a, assumed;
    do {
      assumed = old;
      u32 part = (assumed & mask) >> shift;
      S v; memcpy(&v, &part, sizeof(S));
      S n = f(v);
      u32 nb = 0; memcpy(&nb, &n, sizeof(S));
      old = atomicCAS(a, assumed, (assumed & ~mask) | ((nb << shift) & mask));
    } while (old != assumed);
  }
}

// A warp shuffle for any accumulator type (narrow ones travel as int).
template <typename T> __device__ __forceinline__ T shfl_down(T v, int off) {
  if constexpr (sizeof(T) >= 4) {
    return __shfl_down_sync(0xffffffffu, v, off);
  } else {
    return (T)__shfl_down_sync(0xffffffffu, (int)v, off);
  }
}
