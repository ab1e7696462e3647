"""Probe: how fast GELU's derivative runs as one elementwise kernel on this GPU (read x, write
g·GELU'(x)), by formula and compile flags, beside a copy and the forward GELU. Prints one JSON
line a variant (ms, and GB/s over 8 bytes an element). CuPy's RawKernel, NVRTC."""
import json
import sys
import cupy as cp

N = 1 << 28
SRC = r'''
__device__ __forceinline__ float f(float x, float g) {
#if FORM == 0
  return x;
#elif FORM == 1
  float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752440f));
  float pdf = 0.3989422804014327f * expf(-0.5f * (x * x));
  return g * (cdf + x * pdf);
#elif FORM == 2
  float cdf = 0.5f * erfcf(-x * 0.70710678118654752440f);
  float pdf = 0.3989422804014327f * expf(-0.5f * (x * x));
  return g * (cdf + x * pdf);
#elif FORM == 3
  return 0.5f * x * erfcf(-x * 0.70710678118654752440f);
#elif FORM == 4
  float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752440f));
  float pdf = 0.3989422804014327f * __expf(-0.5f * (x * x));
  return g * (cdf + x * pdf);
#elif FORM == 5
  return expf(x);
#elif FORM == 6
  return tanhf(x);
#elif FORM == 7
  return sinf(x);
#elif FORM == 8
  return logf(x);
#endif
}
extern "C" __global__ void k(const float* __restrict__ a, const float* __restrict__ gp,
    float* __restrict__ out, long n) {
  float g = gp[0];
  long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
#if VEC == 4
  if (i + 3 < n) {
    float4 x = *(const float4*)(a + i);
    *(float4*)(out + i) = make_float4(f(x.x, g), f(x.y, g), f(x.z, g), f(x.w, g));
    return;
  }
#endif
  for (long j = i; j < i + VEC && j < n; j++) out[j] = f(a[j], g);
}
'''

NAMES = {0: "copy", 1: "gelu' erf+exp", 2: "gelu' erfc+exp", 3: "gelu forward (erfc)",
         4: "gelu' erf+__expf", 5: "exp", 6: "tanh", 7: "sin", 8: "log"}


def run(form, vec, fmad, level="O3", threads=256):
    opts = ('-DFORM=%d' % form, '-DVEC=%d' % vec, '--fmad=%s' % ('true' if fmad else 'false'))
    if level != "O3":
        opts += ('--Ofast-compile=%s' % level,)
    kern = cp.RawKernel(SRC, 'k', options=opts)
    a = cp.random.randn(N, dtype=cp.float32)
    g = cp.ones(1, dtype=cp.float32)
    out = cp.empty(N, dtype=cp.float32)
    grid = (N // vec + threads - 1) // threads
    args = (a, g, out, cp.int64(N))
    for _ in range(3):
        kern((grid,), (threads,), args)
    times = []
    for _ in range(20):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        kern((grid,), (threads,), args)
        e.record()
        e.synchronize()
        times.append(cp.cuda.get_elapsed_time(s, e))
    ms = sorted(times)[len(times) // 2]
    print(json.dumps({"form": NAMES[form], "vec": vec, "fmad": fmad, "level": level,
                      "ms": round(ms, 4),
                      "GBps": round(8 * N / ms / 1e6)}), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["levels"]:
        # NVRTC's -O3 beside --Ofast-compile=min (strata's level for most maps), as strata
        # compiles: four lanes a thread, no contraction.
        for form in range(9):
            for level in ("O3", "min", "O3", "min"):
                run(form, 4, False, level)
    else:
        for form in range(5):
            for vec in (1, 4):
                for fmad in (False, True):
                    run(form, vec, fmad)
    sys.stdout.flush()
