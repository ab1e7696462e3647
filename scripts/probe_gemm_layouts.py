"""cuBLAS's rate by operand layout (the call strata makes, `cublasGemmStridedBatchedEx`, through
ctypes on PyTorch's tensors), for `Target::k_major_tf32_from`: C[M, N] = A[M, K]·B[K, N] with A
row-major (r) or column-major (c, a transposed view) and B likewise, per dtype (TF32, f32, f16,
bf16, f64), in µs (median of 40 CUDA-event timings). `cr` is a weight's gradient `xᵀ·dy`.
Run on the GPU machine: python3 scripts/probe_gemm_layouts.py"""
import ctypes
import glob
import os

import torch

def load(name):
    import nvidia
    for p in nvidia.__path__:
        for f in glob.glob(os.path.join(p, "*", "lib", name + "*")):
            return ctypes.CDLL(f)
    return ctypes.CDLL(name)

cublas = load("libcublas.so")
V = ctypes.c_void_p
handle = V()
assert cublas.cublasCreate_v2(ctypes.byref(handle)) == 0
assert cublas.cublasSetStream_v2(handle, V(torch.cuda.current_stream().cuda_stream)) == 0

def median_us(f, n=40):
    for _ in range(5):
        f()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    ts = []
    for _ in range(n):
        s.record(); f(); e.record(); torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) * 1000)
    return sorted(ts)[n // 2]

def as_blas(t):
    """(transpose, ld) of a row-major or transposed 2-D tensor as cuBLAS's column-major Xᵀ."""
    return (0, t.stride(0)) if t.stride(1) == 1 else (1, t.stride(1))

def gemm(a, b, c, data, compute, scalar):
    # Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ, as strata's planner computes it.
    (m, k), n = a.shape, b.shape[1]
    (tb, ldb), (ta, lda) = as_blas(b), as_blas(a)
    one, zero, z = scalar(1.0), scalar(0.0), ctypes.c_longlong(0)
    def run():
        r = cublas.cublasGemmStridedBatchedEx(
            handle, tb, ta, n, m, k, ctypes.byref(one), V(b.data_ptr()), data, ldb, z,
            V(a.data_ptr()), data, lda, z, ctypes.byref(zero), V(c.data_ptr()), data, n, z, 1,
            compute, -1)
        assert r == 0, r
    return run

g = torch.Generator(device="cuda").manual_seed(0)
rn = lambda *s: torch.randn(*s, device="cuda", generator=g)
# (name, torch dtype, cudaDataType, cublasComputeType, scalar type)
kinds = (("tf32", torch.float32, 0, 77, ctypes.c_float), ("f32", torch.float32, 0, 68, ctypes.c_float),
         ("f16", torch.float16, 2, 68, ctypes.c_float), ("bf16", torch.bfloat16, 14, 68, ctypes.c_float),
         ("f64", torch.float64, 1, 70, ctypes.c_double))
print(f"{'dtype':5} {'M K N':>16}   rr       rc       cr       cc      (µs)")
for name, dt, data, compute, scalar in kinds:
    for m, k, n in ((4096, 8192, 4096), (784, 8192, 4096), (2048, 2048, 2048), (1024, 1024, 1024)):
        a = {"r": rn(m, k).to(dt), "c": rn(k, m).to(dt).t()}
        b = {"r": rn(k, n).to(dt), "c": rn(n, k).to(dt).t()}
        c = torch.empty(m, n, device="cuda", dtype=dt)
        ts = [median_us(gemm(a[la], b[lb], c, data, compute, scalar)) for la in "rc" for lb in "rc"]
        print(f"{name:5} {m:>5} {k:>5} {n:>5} " + " ".join(f"{t:8.1f}" for t in ts))
