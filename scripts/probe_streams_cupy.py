"""Probe: how fast an elementwise kernel with several outputs runs on this GPU, by store and
load flavour (plain, streaming `.cs`), vectors a thread and launch shape. Prints one JSON line a
variant (ms, GB/s over the bytes each reads and writes once). CuPy's RawKernel, NVRTC."""
import json
import cupy as cp

N = 1 << 28
SRC = r'''
#define LD(p) LOADF(p)
extern "C" __global__ void k(const float4* __restrict__ a, const float4* __restrict__ b,
    const float4* __restrict__ c, float4* __restrict__ ga, float4* __restrict__ gb,
    float4* __restrict__ gc, long n4) {
  long stride = (long)gridDim.x * blockDim.x * VPT;
  for (long i = (long)blockIdx.x * blockDim.x * VPT + threadIdx.x; i < n4; i += stride) {
    #pragma unroll
    for (int v = 0; v < VPT; v++) {
      long j = i + (long)v * blockDim.x;
      if (j >= n4) break;
      float4 x = LD(a + j), y = LD(b + j);
#if OUTS == 3
      float4 z = LD(c + j);
      float4 m;
      m.x = x.x * y.x + z.x > 0.f ? 1.f : 0.f; m.y = x.y * y.y + z.y > 0.f ? 1.f : 0.f;
      m.z = x.z * y.z + z.z > 0.f ? 1.f : 0.f; m.w = x.w * y.w + z.w > 0.f ? 1.f : 0.f;
      STOREF(gc + j, m);
      STOREF(ga + j, make_float4(m.x * y.x, m.y * y.y, m.z * y.z, m.w * y.w));
      STOREF(gb + j, make_float4(m.x * x.x, m.y * x.y, m.z * x.z, m.w * x.w));
#elif OUTS == 2
      STOREF(ga + j, y);
      STOREF(gb + j, x);
#else
      STOREF(ga + j, make_float4(x.x * y.x, x.y * y.y, x.z * y.z, x.w * y.w));
#endif
    }
  }
}
'''

def run(outs, store, load, vpt, blocks_per_sm, threads=256):
    opts = ('-DOUTS=%d' % outs, '-DVPT=%d' % vpt,
            '-DSTOREF(p,v)=%s' % ('__stcs(p,v)' if store == 'cs' else '(*(p)=(v))'),
            '-DLOADF(p)=%s' % ('__ldcs(p)' if load == 'cs' else ('__ldg(p)' if load == 'ldg' else '(*(p))')))
    kern = cp.RawKernel(SRC, 'k', options=opts)
    a, b, c = (cp.random.rand(N, dtype=cp.float32) for _ in range(3))
    ga, gb, gc = (cp.empty(N, dtype=cp.float32) for _ in range(3))
    sms = cp.cuda.Device().attributes['MultiProcessorCount']
    n4 = N // 4
    grid = sms * blocks_per_sm if blocks_per_sm else (n4 + threads * vpt - 1) // (threads * vpt)
    args = (a, b, c, ga, gb, gc, cp.int64(n4))
    for _ in range(3):
        kern((grid,), (threads,), args)
    times = []
    for _ in range(20):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record(); kern((grid,), (threads,), args); e.record(); e.synchronize()
        times.append(cp.cuda.get_elapsed_time(s, e))
    ms = sorted(times)[len(times) // 2]
    reads = {3: 3, 2: 2, 1: 2}[outs]
    byts = 4 * N * (reads + outs)
    print(json.dumps({"outs": outs, "store": store, "load": load, "vpt": vpt,
                      "grid": "persist%d" % blocks_per_sm if blocks_per_sm else "full",
                      "ms": round(ms, 4), "GBps": round(byts / ms / 1e6)}), flush=True)

for outs in (1, 2, 3):
    for store in ('plain', 'cs'):
        for load in ('plain', 'cs'):
            run(outs, store, load, 1, 0)
for outs in (2, 3):
    for vpt in (1, 2, 4):
        for bps in (0, 4, 8):
            run(outs, 'plain', 'plain', vpt, bps)
y = cp.empty(N, dtype=cp.float32); x = cp.random.rand(N, dtype=cp.float32)
s, e = cp.cuda.Event(), cp.cuda.Event()
for _ in range(3): cp.copyto(y, x)
s.record(); [cp.copyto(y, x) for _ in range(10)]; e.record(); e.synchronize()
print(json.dumps({"copy_ms": cp.cuda.get_elapsed_time(s, e) / 10}))
