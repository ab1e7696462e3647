"""Fits the f32 erf and erfc the wgpu backend evaluates (wgpu-backend/src/render/prelude.rs,
`erf_fast_f32` / `erfc_fast_f32`), checks them in f32 arithmetic (numpy, no fused multiply-adds)
against 40-digit values, and prints their WGSL. erf(x) = x + x p(x^2) for |x| < 1; erfc(x) =
e^(-x^2 + L(x)) for x >= 0.5, L(x) = ln erfc(x) + x^2 on four intervals, its constant split into
a multiple of 2^-16 (added exactly to -xh^2) and the rest. Needs numpy and mpmath:
`python3 -m venv /tmp/fit && /tmp/fit/bin/pip install numpy mpmath && /tmp/fit/bin/python
scripts/fit_erf_f32.py` (about 15 s). Prints the worst ulp of each function, then the fitted
parts in WGSL."""
import numpy as np, mpmath as mp
mp.mp.dps = 40
f32 = np.float32
def cheb_fit(f, lo, hi, deg, n=400):
    k = np.arange(n); s = np.cos(np.pi*(k+0.5)/n)
    x = (lo+hi)/2 + (hi-lo)/2*s
    y = np.array([float(f(mp.mpf(float(xi)))) for xi in x])
    return np.polynomial.chebyshev.cheb2poly(np.polynomial.chebyshev.chebfit(s, y, deg))
# T(z) = erf(x)/x - 1, z = x^2 in [0, 1]: fit in z directly (s = 2z - 1 then convert)
def Tf(z):
    if z == 0: return 2/mp.sqrt(mp.pi) - 1
    x = mp.sqrt(z); return mp.erf(x)/x - 1
mS = cheb_fit(Tf, 0.0, 1.0, 8)
# convert poly in s=2z-1 to poly in z
P = np.polynomial.Polynomial(mS)
Pz = P(np.polynomial.Polynomial([-1, 2]))
T = [f32(c) for c in Pz.coef]
L = lambda x: mp.log(mp.erfc(x)) + x*x
ivs = [(0.5, 1.5, 1.0, 2.0), (1.5, 3.5, 2.5, 1.0), (3.5, 5.5, 4.5, 1.0), (5.5, 10.1, 7.8, 1/2.3)]
degs = [8, 9, 9, 9]
Ls = []
for (lo, hi, mid, inv), deg in zip(ivs, degs):
    m = cheb_fit(L, lo, hi, deg)
    c0 = m[0]; ch = np.round(c0 * 65536) / 65536
    q = [f32(c) for c in m[1:]]   # L = ch + (c0 - ch) + s*Q(s); Q's constant is m[1]
    Ls.append((lo, hi, f32(mid), f32(inv), f32(ch), f32(c0 - ch), q))
LN2HI = f32(0.693145751953125); LN2LO = f32(1.4286067653e-06); LOG2E = f32(1.4426950216293335)
def expr_parts(A, B):
    # exp(A + B), A exact; Cody-Waite with A first
    k = np.round(f32(f32(A + B) * LOG2E))
    r = f32(f32(f32(A - f32(k * LN2HI)) + B) - f32(k * LN2LO))
    p = f32(1.9841269841e-04)
    for c in (1.3888888889e-03, 8.3333333333e-03, 4.1666666667e-02, 1.6666666667e-01, 0.5, 1.0, 1.0):
        p = f32(f32(p * r) + f32(c))
    h = int(k) // 2 if k >= 0 else -((-int(k)) // 2)
    lo = np.ldexp(f32(1), h).astype(np.float32); hi = np.ldexp(f32(1), int(k) - h).astype(np.float32)
    return f32(f32(p * lo) * hi)
def tail(x):  # erfc(x), x in [0.5, 10.1]
    x = f32(x)
    xh = np.frombuffer((np.array([x], dtype=np.float32).view(np.uint32) & np.uint32(0xffffc000)).tobytes(), dtype=np.float32)[0]
    for (lo, hi, mid, inv, ch, cl, q) in Ls:
        if x < hi or hi == 10.1: break
    s = f32(f32(x - mid) * inv)
    acc = q[-1]
    for c in q[-2::-1]:
        acc = f32(f32(acc * s) + c)
    Bsmall = f32(cl + f32(s * acc))                   # (c0 - ch) + s Q(s)
    B = f32(Bsmall - f32(f32(x - xh) * f32(x + xh)))
    A = f32(f32(-xh * xh) + ch)                       # exact: multiples of 2^-16 (or small)
    return expr_parts(A, B)
def erf_small(x):
    x = f32(x); z = f32(x * x)
    acc = T[-1]
    for c in T[-2::-1]:
        acc = f32(f32(acc * z) + c)
    return f32(f32(x * acc) + x)
def erfc32(x):
    x = f32(x)
    if x > f32(10.1): return f32(0)
    if x >= f32(0.5): return tail(x)
    if x > f32(-0.5): return f32(f32(1) - erf_small(x))
    return f32(f32(2) - tail(-x))
def erf32(x):
    x = f32(x); a = abs(x)
    if a < f32(1): return erf_small(x)
    if a > f32(4): return f32(np.copysign(1, x))
    return f32(np.copysign(f32(f32(1) - tail(a)), x))
def ulps(a, b):
    def key(v):
        i = int(np.array([v], dtype=np.float32).view(np.int32)[0]); return i if i >= 0 else -2**31 - i
    return abs(key(a) - key(b))
rng = np.random.default_rng(1)
worst = {}
for name, fn, ref, pts in [
    ("erf", erf32, mp.erf, np.concatenate([np.linspace(-5, 5, 20001), rng.uniform(-4, 4, 20000), np.linspace(-1e-3, 1e-3, 2001)])),
    ("erfc", erfc32, mp.erfc, np.concatenate([np.linspace(-5, 10.05, 30001), rng.uniform(0.4, 10, 20000)]))]:
    w = (0, 0)
    for x in pts.astype(np.float32):
        want = f32(float(ref(mp.mpf(float(x)))))
        if want == 0 and fn(x) == 0: continue
        if abs(float(want)) < 1.2e-38: continue  # subnormal results: flushed on NVIDIA
        u = ulps(fn(x), want)
        if u > w[0]: w = (u, float(x))
    print(name, "worst ulp", w)

def lit(v):
    s = np.format_float_scientific(np.float32(v), unique=True, trim='-') if abs(float(v)) < 1e-3 else np.format_float_positional(np.float32(v), unique=True, trim='-')
    if 'e' not in s and '.' not in s: s += '.0'
    return s + 'f'
out = []
out.append("fn erf_small_f32(x: f32) -> f32 {")
out.append("  let z = x * x;")
out.append(f"  var p = {lit(T[-1])};")
for c in T[-2::-1]:
    out.append(f"  p = p * z + {lit(c)};")
out.append("  return x * p + x;")
out.append("}")
out.append("fn erfc_tail_fast_f32(x: f32) -> f32 {")
out.append("  if (x > 10.1f) { return 0.0f; }")
out.append("  var s: f32; var ch: f32; var cl: f32; var q: f32;")
for i, (lo, hi, mid, inv, ch, cl, q) in enumerate(Ls):
    cond = f"if (x < {lit(hi)}) " if i < len(Ls) - 1 else ""
    pre = "  " if i == 0 else " else "
    body = [f"s = (x - {lit(mid)}) * {lit(inv)};", f"ch = {lit(ch)};", f"cl = {lit(cl)};", f"q = {lit(q[-1])};"]
    body += [f"q = q * s + {lit(c)};" for c in q[-2::-1]]
    out.append(pre + cond + "{")
    out.extend("    " + b for b in body)
    out.append("  }" if i == len(Ls) - 1 else "  }")
out = "\n".join(out)
print(out)
