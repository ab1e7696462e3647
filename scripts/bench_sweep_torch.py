"""PyTorch's side of the sweep benchmark: the ops of examples/bench_sweep.rs under the same
names, sizes and timing (median of 15, CUDA events; host<->device copies by the wall clock),
one JSON object per line. Extra rows name what PyTorch alone offers (pinned copies)."""
import json
import sys
import time

import torch

REPS = 15


def timed(op):
    for _ in range(2):
        op()
    torch.cuda.synchronize()
    runs = []
    for _ in range(REPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        op()
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end))
    runs.sort()
    return runs[len(runs) // 2]


def wall(op, reps=5):
    op()
    runs = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        op()
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - t) * 1e3)
    runs.sort()
    return runs[len(runs) // 2]


def row(op, ms):
    print(json.dumps({"op": op, "ms": ms}), flush=True)


def arg(flag, default):
    return int(sys.argv[sys.argv.index(flag) + 1]) if flag in sys.argv else default


def main():
    n = 1 << arg("--log2n", 28)
    side = arg("--side", 16384)
    k = arg("--gemm", 8192)
    dev = "cuda"
    row("zeros", timed(lambda: torch.zeros(n, device=dev)))
    row("arange", timed(lambda: torch.arange(0, n, 1, dtype=torch.float32, device=dev)))
    row("rand", timed(lambda: torch.rand(n, device=dev)))
    row("randn", timed(lambda: torch.randn(n, device=dev)))
    row("randint", timed(lambda: torch.randint(0, 1000, (n,), dtype=torch.int64, device=dev)))
    row("zeros i64", timed(lambda: torch.zeros(n, dtype=torch.int64, device=dev)))
    row("rand f64", timed(lambda: torch.rand(n, dtype=torch.float64, device=dev)))

    host = torch.arange(n, dtype=torch.float32)
    row("from_slice 1GiB", wall(lambda: host.cuda()))
    pinned = host.pin_memory()
    row("pinned upload 1GiB", wall(lambda: pinned.cuda(non_blocking=True)))
    a = torch.rand(n, device=dev)
    b = torch.rand(n, device=dev)
    row("to_vec 1GiB", wall(lambda: a.cpu()))
    pinned_out = torch.empty(n, dtype=torch.float32).pin_memory()
    row("pinned download 1GiB", wall(lambda: pinned_out.copy_(a, non_blocking=True)))
    del host, pinned, pinned_out

    row("copy", timed(lambda: a.clone()))
    row("add", timed(lambda: a + b))
    row("mul scalar", timed(lambda: a * 3.0))
    row("exp", timed(lambda: a.exp()))
    row("tanh", timed(lambda: a.tanh()))
    cond = a > 0.5
    row("where", timed(lambda: torch.where(cond, a, b)))
    row("cast f32->f16", timed(lambda: a.half()))
    row("cast f32->i32", timed(lambda: a.int()))
    row("cast f32->f64", timed(lambda: a.double()))

    m = a[: side * side].view(side, side)
    row("sum all", timed(lambda: a.sum()))
    row("sum axis -1", timed(lambda: m.sum(-1)))
    row("sum axis 0", timed(lambda: m.sum(0)))
    row("max axis 0", timed(lambda: m.amax(0)))
    row("max axis -1", timed(lambda: m.amax(-1)))
    row("mean axis -1", timed(lambda: m.mean(-1)))
    row("argmax axis -1", timed(lambda: m.argmax(-1)))
    row("transpose contiguous", timed(lambda: m.t().contiguous()))

    rows = torch.randint(0, side, (side,), device=dev)
    row("index_select axis 0", timed(lambda: m.index_select(0, rows)))
    row("index_select axis 1", timed(lambda: m.index_select(1, rows)))
    flat = torch.randint(0, n, (n // 4,), device=dev)
    row("take", timed(lambda: a.take(flat)))
    gidx = torch.randint(0, side, (side, side), device=dev)
    row("gather axis 1", timed(lambda: m.gather(1, gidx)))
    mask = m > 0.5
    row("masked_fill", timed(lambda: m.masked_fill(mask, 0.0)))

    half, half2 = m[: side // 2], m[side // 2:]
    row("cat axis 1", timed(lambda: torch.cat([half, half2], 1)))
    row("cat axis 0", timed(lambda: torch.cat([half, half2], 0)))
    row("stack axis 0", timed(lambda: torch.stack([half, half2], 0)))
    row("split axis 1 contiguous",
        timed(lambda: [p.contiguous() for p in m.split(side // 2, 1)]))

    x = torch.rand(k, k, device=dev)
    y = torch.rand(k, k, device=dev)
    torch.backends.cuda.matmul.allow_tf32 = False
    row("matmul f32", timed(lambda: x @ y))
    for name, dt in [("f16", torch.float16), ("bf16", torch.bfloat16)]:
        xh, yh = x.to(dt), y.to(dt)
        row(f"matmul {name}", timed(lambda: xh @ yh))
    xd, yd = x[: k // 4, : k // 4].double(), y[: k // 4, : k // 4].double()
    row("matmul f64 (k/4)", timed(lambda: xd @ yd))


if __name__ == "__main__":
    main()
