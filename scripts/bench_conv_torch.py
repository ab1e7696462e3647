"""PyTorch's side of `bench_gpu conv`: F.conv2d (cuDNN, its default algorithm choice) on the
same ResNet-50 shapes, batch 64: f32 with TF32 off (the names without a suffix), f32 with TF32
on, then bf16; forward and forward + backward, timed as strata's (median of 20, CUDA events).
One JSON object per line."""
import json

import torch
import torch.nn.functional as F

from bench_torch import timed

g = torch.Generator(device="cuda").manual_seed(1)
SHAPES = [(64, 64, 3, 56, 1, 1), (256, 64, 1, 56, 1, 0), (128, 128, 3, 28, 1, 1),
          (256, 256, 3, 14, 1, 1), (512, 512, 3, 7, 1, 1), (3, 64, 7, 224, 2, 3)]
for dtype, tf32, suffix in [(torch.float32, False, ""), (torch.float32, True, " tf32"),
                            (torch.bfloat16, False, " bf16")]:
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    for c, o, k, hw, stride, pad in SHAPES:
        x = torch.randn(64, c, hw, hw, device="cuda", generator=g).to(dtype).requires_grad_(True)
        w = torch.randn(o, c, k, k, device="cuda", generator=g).to(dtype).requires_grad_(True)
        out = (hw + 2 * pad - k) // stride + 1
        flops = 2.0 * 64 * o * out * out * c * k * k
        name = f"conv2d c{c}->{o} {k}x{k} {hw}^2{suffix}"
        with torch.no_grad():
            fwd = timed(lambda: F.conv2d(x, w, None, stride, pad))
        print(json.dumps({"op": f"{name} forward", "ms": fwd, "flops": flops}), flush=True)

        def both():
            F.conv2d(x, w, None, stride, pad).sum().backward()
            x.grad = None
            w.grad = None

        print(json.dumps({"op": f"{name} forward+backward", "ms": timed(both), "flops": 3 * flops}), flush=True)
