"""PyTorch's side of `bench_gpu mlp`: the same GELU MLP training step (784 -> 4096 -> 4096 -> 10,
f32 with TF32 matmuls, cross-entropy, torch.optim.SGD lr 0.01 or AdamW lr 0.001: argv[2] `sgd`
or `adamw`, PyTorch's default foreach implementations), eager and with torch.compile (of the
forward), timed the same way (median of 20 steps, CUDA events), with the peak allocated memory
of each. One JSON object per line. argv[3] `cpu`: on the CPU instead, eager only, timed by the
host clock, no memory row (op names `mlp-cpu-…`, as strata's on its CPU backend)."""
import json
import sys
import time

import torch
import torch.nn.functional as F


def main():
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
    optimizer = sys.argv[2] if len(sys.argv) > 2 else "sgd"
    name = "mlp-adamw" if optimizer == "adamw" else "mlp"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = sys.argv[3] if len(sys.argv) > 3 else "cuda"
    cuda = dev == "cuda"
    if not cuda:
        name += "-" + dev
    for mode in ("eager", "compile") if cuda else ("eager",):
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        g = torch.Generator(device=dev).manual_seed(5)
        sizes = [784, 4096, 4096, 10]
        params = []
        for fan_in, fan_out in zip(sizes, sizes[1:]):
            w = (torch.randn(fan_in, fan_out, device=dev, generator=g) / fan_in**0.5).requires_grad_()
            b = torch.zeros(fan_out, device=dev, requires_grad=True)
            params.append((w, b))
        x = torch.randn(batch, 784, device=dev, generator=g)
        y = torch.randint(0, 10, (batch,), device=dev, generator=g)

        def forward(x, y):
            h = x
            for k, (w, b) in enumerate(params):
                h = h @ w + b
                if k + 1 < len(params):
                    h = F.gelu(h)
            return F.cross_entropy(h, y)

        fwd = torch.compile(forward) if mode == "compile" else forward
        flat = [p for pair in params for p in pair]
        if optimizer == "adamw":
            opt = torch.optim.AdamW(flat, lr=1e-3)
        else:
            opt = torch.optim.SGD(flat, lr=0.01)

        def step():
            loss = fwd(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad()

        sync = torch.cuda.synchronize if cuda else (lambda: None)
        t0 = time.perf_counter()
        step()
        sync()
        first_ms = (time.perf_counter() - t0) * 1e3
        for _ in range(3):
            step()
        sync()
        runs = []
        for _ in range(20):
            if not cuda:
                t0 = time.perf_counter()
                step()
                runs.append((time.perf_counter() - t0) * 1e3)
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            runs.append(start.elapsed_time(end))
        runs.sort()
        flops = 3 * sum(2 * batch * a * b for a, b in zip(sizes, sizes[1:]))
        print(json.dumps({"op": f"{name}-step-{batch} ({mode})", "ms": runs[len(runs) // 2],
                          "flops": flops, "first_ms": first_ms}), flush=True)
        if not cuda:
            continue
        peak = torch.cuda.max_memory_allocated() / 2**20
        print(json.dumps({"op": f"{name}-peak-mib-{batch} ({mode})", "mib": peak}), flush=True)


main()
