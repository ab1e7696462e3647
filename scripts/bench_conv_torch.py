"""PyTorch's side of `bench_gpu conv`: F.conv2d (cuDNN) on the same ResNet-50 shapes, batch
64, f32 with TF32 off (as strata's f32 matmuls), forward and forward + backward, timed as
strata's (median of 20, CUDA events). One JSON object per line."""
import json

import torch
import torch.nn.functional as F

from bench_torch import timed

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
g = torch.Generator(device="cuda").manual_seed(1)
for c, o, k, hw, stride, pad in [(64, 64, 3, 56, 1, 1), (256, 64, 1, 56, 1, 0), (128, 128, 3, 28, 1, 1)]:
    x = torch.randn(64, c, hw, hw, device="cuda", generator=g, requires_grad=True)
    w = torch.randn(o, c, k, k, device="cuda", generator=g, requires_grad=True)
    flops = 2.0 * 64 * o * hw * hw * c * k * k
    name = f"conv2d c{c}->{o} {k}x{k} {hw}^2"
    with torch.no_grad():
        fwd = timed(lambda: F.conv2d(x, w, None, stride, pad))
    print(json.dumps({"op": f"{name} forward", "ms": fwd, "flops": flops}), flush=True)

    def both():
        F.conv2d(x, w, None, stride, pad).sum().backward()
        x.grad = None
        w.grad = None

    print(json.dumps({"op": f"{name} forward+backward", "ms": timed(both), "flops": 3 * flops}), flush=True)
