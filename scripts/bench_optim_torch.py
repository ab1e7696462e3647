"""PyTorch's side of `bench_gpu optim`: optimizer steps alone over the GELU MLP's parameters
(784x4096, 4096x4096, 4096x10 weights and their biases, gradients set once): SGD, SGD with
momentum 0.9, AdamW on f32 and on bf16 parameters, each with PyTorch's default (foreach)
implementation and, where PyTorch has one, its fused kernel (`fused=True`). Timed like
bench_torch.py (median of 20 runs, CUDA events). One JSON object per line."""
import json

import torch

from bench_torch import timed  # the same warm-up, 20 runs and CUDA events


def params(dtype, g):
    sizes = [784, 4096, 4096, 10]
    out = []
    for fan_in, fan_out in zip(sizes, sizes[1:]):
        for shape in ((fan_in, fan_out), (fan_out,)):
            p = torch.randn(shape, device="cuda", generator=g).to(dtype).requires_grad_()
            p.grad = torch.randn(shape, device="cuda", generator=g).to(dtype)
            out.append(p)
    return out


def main():
    g = torch.Generator(device="cuda").manual_seed(9)
    cases = [
        ("sgd", torch.float32, lambda ps, **k: torch.optim.SGD(ps, lr=1e-3, **k)),
        ("sgd-momentum", torch.float32, lambda ps, **k: torch.optim.SGD(ps, lr=1e-3, momentum=0.9, **k)),
        ("adamw", torch.float32, lambda ps, **k: torch.optim.AdamW(ps, lr=1e-3, **k)),
        ("adamw-bf16", torch.bfloat16, lambda ps, **k: torch.optim.AdamW(ps, lr=1e-3, **k)),
    ]
    for name, dtype, make in cases:
        for impl in ("foreach", "fused"):
            opt = make(params(dtype, g), **{impl: True})
            ms = timed(opt.step)
            suffix = "" if impl == "foreach" else "-fused"
            print(json.dumps({"op": f"torch-optim-{name}{suffix}", "ms": round(ms, 6)}), flush=True)


if __name__ == "__main__":
    main()
