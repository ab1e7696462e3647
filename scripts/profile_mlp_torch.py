"""PyTorch's side of `bench_gpu mlp --profile`: one training step of the same GELU MLP (eager,
TF32 matmuls, cross-entropy, torch.optim.AdamW or SGD from argv[2]) under torch.profiler, after
warm-up: the table of CUDA kernels by device time, and the peak allocated memory of the step."""
import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile


def main():
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
    optimizer = sys.argv[2] if len(sys.argv) > 2 else "adamw"
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(5)
    sizes = [784, 4096, 4096, 10]
    params = []
    for fan_in, fan_out in zip(sizes, sizes[1:]):
        w = (torch.randn(fan_in, fan_out, device=dev, generator=g) / fan_in**0.5).requires_grad_()
        b = torch.zeros(fan_out, device=dev, requires_grad=True)
        params += [w, b]
    x = torch.randn(batch, 784, device=dev, generator=g)
    y = torch.randint(0, 10, (batch,), device=dev, generator=g)
    opt = torch.optim.AdamW(params, lr=1e-3) if optimizer == "adamw" else torch.optim.SGD(params, lr=0.01)

    def step():
        h = x
        for k in range(0, len(params), 2):
            h = h @ params[k] + params[k + 1]
            if k + 2 < len(params):
                h = F.gelu(h)
        F.cross_entropy(h, y).backward()
        opt.step()
        opt.zero_grad()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25))
    print(f"step peak beyond the resident tensors: {(torch.cuda.max_memory_allocated() - base) / 2**20:.1f} MiB")


main()
