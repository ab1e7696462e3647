"""PyTorch's side of `bench_gpu backward`: the backward of the fused-chain benchmark's chains
over 2^N f32 elements (argv[1], default 28), eager and with torch.compile of the forward (its
backward compiled with it), timed as strata's (median of 20, CUDA events): forward, backward,
gradients cleared; then the backward alone (the loss computed before the clock starts). One
JSON object per line, `bytes` the same floor as strata's rows."""
import json
import sys

import torch

from bench_torch import timed


def main():
    log2n = int(sys.argv[1]) if len(sys.argv) > 1 else 28
    n = 1 << log2n
    side = 1 << (log2n // 2)
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(3)
    a, b, c = (torch.randn(n, device=dev, generator=g).requires_grad_() for _ in range(3))
    x2 = torch.randn(side, side, device=dev, generator=g).requires_grad_()
    w2 = torch.randn(side, side, device=dev, generator=g)
    f = 4.0 * n
    chains = [
        ("backward relu(a*b+c).sum()", 6 * f, [a, b, c], lambda: torch.relu(a * b + c).sum()),
        ("backward gelu(a).sum()", 2 * f, [a], lambda: torch.nn.functional.gelu(a).sum()),
        ("backward (a*b).sum()", 4 * f, [a, b], lambda: (a * b).sum()),
        ("backward (softmax(x)*w).sum()", 12.0 * side * side, [x2],
         lambda: (torch.softmax(x2, -1) * w2).sum()),
    ]
    for name, bytes_, leaves, loss in chains:
        for mode in ("eager", "compile"):
            fn = torch.compile(loss) if mode == "compile" else loss

            def step():
                fn().backward()
                for t in leaves:
                    t.grad = None

            ms = timed(step)
            print(json.dumps({"op": f"{name} ({mode})", "ms": ms, "bytes": bytes_}), flush=True)
            # The backward alone: the loss computed before the clock starts.
            runs = []
            for k in range(23):
                l = fn()
                torch.cuda.synchronize()
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                l.backward()
                end.record()
                end.synchronize()
                if k >= 3:
                    runs.append(start.elapsed_time(end))
                for t in leaves:
                    t.grad = None
            runs.sort()
            alone = name.replace("backward", "backward alone:", 1)
            print(json.dumps({"op": f"{alone} ({mode})", "ms": runs[len(runs) // 2],
                              "bytes": bytes_}), flush=True)
            torch._dynamo.reset()


main()
