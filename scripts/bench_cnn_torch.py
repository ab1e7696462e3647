"""PyTorch's side of `bench_gpu cnn`: the same small ResNet-style CNN (examples/bench_gpu/cnn.rs)
and the same training step, eager and with torch.compile (of the forward and loss), timed the
same way (median of 20 steps, CUDA events), with the peak allocated memory and the first step's
wall-clock time of each. f32 with TF32 convolutions and matmuls, cuDNN's algorithm timed at
the first call (`cudnn.benchmark = True`, as strata's `cudnnFind`), AdamW lr 0.001 (PyTorch's
default foreach implementation). argv[1]: the batch (256). One JSON object per line.

The network: 32x32 RGB inputs; conv3x3 (no bias) -> BatchNorm2d -> ReLU blocks of 3->64,
64->128 (then max-pool 2), a residual block of two 128->128 blocks, 128->256 (then max-pool
2), a residual block of two 256->256 blocks; global average pool, Linear(256, 10),
cross-entropy."""
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def block(i, o):
    return nn.Sequential(nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU())


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.b = nn.ModuleList([block(3, 64), block(64, 128), block(128, 128), block(128, 128),
                                block(128, 256), block(256, 256), block(256, 256)])
        self.head = nn.Linear(256, 10)

    def forward(self, x, y):
        b = self.b
        h = b[0](x)
        h = F.max_pool2d(b[1](h), 2)
        h = h + b[3](b[2](h))
        h = F.max_pool2d(b[4](h), 2)
        h = h + b[6](b[5](h))
        h = F.adaptive_avg_pool2d(h, 1).flatten(1)
        return F.cross_entropy(self.head(h), y)


def main():
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    dev = "cuda"
    for mode in ("eager", "compile"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        torch.manual_seed(7)
        model = Cnn().to(dev)
        g = torch.Generator(device=dev).manual_seed(8)
        x = torch.randn(batch, 3, 32, 32, device=dev, generator=g)
        y = torch.randint(0, 10, (batch,), device=dev, generator=g)
        fwd = torch.compile(model) if mode == "compile" else model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step():
            fwd(x, y).backward()
            opt.step()
            opt.zero_grad()

        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        first_ms = (time.perf_counter() - t0) * 1e3
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        runs = []
        for _ in range(20):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            runs.append(start.elapsed_time(end))
        runs.sort()
        print(json.dumps({"op": f"cnn-step-{batch} ({mode})", "ms": runs[len(runs) // 2],
                          "first_ms": first_ms}), flush=True)
        peak = torch.cuda.max_memory_allocated() / 2**20
        print(json.dumps({"op": f"cnn-peak-mib-{batch} ({mode})", "mib": peak}), flush=True)


main()
