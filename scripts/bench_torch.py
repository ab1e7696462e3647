"""PyTorch's side of the CUDA benchmark: the same ops, sizes and timing method as
examples/bench_cuda.rs (median of 20 repetitions, CUDA events), one JSON object per line."""
import json
import time

import torch


def timed(op, inner=1):
    for _ in range(3):
        op()
    torch.cuda.synchronize()
    runs = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            op()
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end) / inner)
    runs.sort()
    return runs[len(runs) // 2]


def row(op, ms, nbytes=0, flops=0):
    print(json.dumps({"op": op, "ms": ms, "bytes": nbytes, "flops": flops}), flush=True)


def gelu(x):
    return 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


def kept_and_relu(a, b, c):
    """`a*b` kept beside `relu(a*b + c)`: two outputs."""
    h = a * b
    return h, torch.relu(h + c)


def softmax(x):
    e = (x - x.max(-1, keepdim=True).values).exp()
    return e / e.sum(-1, keepdim=True)


def compiled(name, fn, *args):
    """torch.compile of fn: the first call's time (compile included) as its own row, then the
    steady time under `name`; a row saying why when torch.compile is not available."""
    try:
        c = torch.compile(fn)
        torch.cuda.synchronize()
        t = time.perf_counter()
        c(*args)
        torch.cuda.synchronize()
        first = (time.perf_counter() - t) * 1e3
        print(json.dumps({"op": f"compile-first-call {name}", "first_ms": first}), flush=True)
        return timed(lambda: c(*args))
    except Exception as e:  # no triton, no compiler: say so and go on
        print(json.dumps({"op": f"compile-failed {name}", "error": str(e)[:200]}), flush=True)
        return None


def fusion_rows(a, b, n):
    """The lazy-fusion chains: eager PyTorch under the strata row names '... eager', and
    torch.compile (steady state) under '... fused'; hand-fused kernels as their own rows."""
    c = torch.rand(n, device="cuda")
    side = 1 << 14
    x2 = a.view(side, side)
    chains = [
        ("relu(a*b+c)", lambda: torch.relu(a * b + c), 16 * n),
        ("kept a*b, relu(a*b+c)", lambda: kept_and_relu(a, b, c), 20 * n),
        ("gelu-primitives", lambda: gelu(a), 8 * n),
        ("(a*b).sum()", lambda: (a * b).sum(), 8 * n),
        ("softmax-primitives", lambda: softmax(x2), 8 * n),
        ("softmax", lambda: torch.softmax(x2, -1), 8 * n),
    ]
    for name, fn, nbytes in chains:
        row(f"{name} eager", timed(fn), nbytes)
        ms = compiled(name, fn)
        if ms is not None:
            row(f"{name} fused", ms, nbytes)
    row("F.gelu(tanh) (hand-fused)",
        timed(lambda: torch.nn.functional.gelu(a, approximate="tanh")), 8 * n)
    row("torch.dot (hand-fused (a*b).sum())", timed(lambda: torch.dot(a, b)), 8 * n)


def main():
    n = 1 << 28
    a = torch.rand(n, device="cuda")
    b = torch.rand(n, device="cuda")
    row("copy", timed(lambda: a.clone()), 8 * n)
    row("add", timed(lambda: a + b), 12 * n)
    row("sum", timed(lambda: a.sum()), 4 * n)
    a4 = a.view(n // 4, 4)
    row("sum-inner-4", timed(lambda: a4.sum(-1)), 5 * n)
    side = 1 << 14
    at, bs = a.view(side, side).t(), b.view(side, side)
    row("add-transposed", timed(lambda: at + bs), 12 * n)
    fusion_rows(a, b, n)
    k = 4096
    x = torch.rand(k, k, device="cuda")
    y = torch.rand(k, k, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    row("sgemm-4096-fp32", timed(lambda: x @ y), 0, 2 * k**3)
    torch.backends.cuda.matmul.allow_tf32 = True
    row("sgemm-4096-tf32", timed(lambda: x @ y), 0, 2 * k**3)
    torch.backends.cuda.matmul.allow_tf32 = False
    # Host cost: enqueue time of bursts of 200 one-element adds and an event record (median of
    # 50, a sync between them), the same with adds and multiplies alternating, then the
    # sustained rate of 20,000 adds and one sync; as bench_gpu measures it.
    one = torch.ones(1, device="cuda")
    for _ in range(1000):
        one + one
    torch.cuda.synchronize()

    def burst_us(op):
        bursts = []
        for _ in range(50):
            t = time.perf_counter()
            for i in range(200):
                op(i)
            end = torch.cuda.Event()
            end.record()
            bursts.append((time.perf_counter() - t) * 1e6 / 200)
            end.synchronize()
        bursts.sort()
        return bursts[len(bursts) // 2]

    us = burst_us(lambda i: one + one)
    alternating = burst_us(lambda i: one + one if i % 2 == 0 else one * one)
    count = 20000
    t = time.perf_counter()
    for _ in range(count):
        one + one
    torch.cuda.synchronize()
    sustained = (time.perf_counter() - t) * 1e6 / count
    print(json.dumps({"op": "host-us-per-add", "us": us, "sustained_us": sustained,
                      "alternating_us": alternating}), flush=True)


if __name__ == "__main__":
    main()
