"""PyTorch's side of `bench_gpu norms`: `layer_norm` over the last axis of [65536, 4096] f32,
softmax over [65536, 4096] and [16384, 16384] (`torch.softmax`, and the primitives compiled),
training `batch_norm` over [256, 256, 28, 28] (running statistics updated) and `linear` + bias
+ ReLU ([8192, 4096] · [4096, 4096]ᵀ, TF32 on), each forward and forward + backward (a fixed
upstream gradient; gradients of the input, weight and bias), eager and under torch.compile,
timed as strata's (median of 20, CUDA events). One JSON object per line, with strata's names
and `bytes` / `flops`."""
import json

import torch
import torch.nn.functional as F

from bench_torch import timed


def rows(name, nbytes, flops, forward, leaves, gy):
    for mode in ("eager", "compile"):
        fn = torch.compile(forward) if mode == "compile" else forward
        with torch.no_grad():
            ms = timed(fn)
        print(json.dumps({"op": f"{name} forward ({mode})", "ms": ms, "bytes": nbytes[0],
                          "flops": flops}), flush=True)

        def step():
            fn().backward(gy)
            for t in leaves:
                t.grad = None

        ms = timed(step)
        print(json.dumps({"op": f"{name} forward + backward ({mode})", "ms": ms,
                          "bytes": nbytes[1], "flops": 3 * flops}), flush=True)
        torch._dynamo.reset()


def main():
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(4)

    def randn(*shape):
        return torch.randn(*shape, device=dev, generator=g)

    x = randn(65536, 4096).requires_grad_()
    w, b = randn(4096).requires_grad_(), randn(4096).requires_grad_()
    gy = randn(65536, 4096)
    n = x.numel()
    ms = timed(lambda: x.detach().clone())
    print(json.dumps({"op": "copy [65536, 4096]", "ms": ms, "bytes": 8 * n}), flush=True)
    rows("layer_norm [65536, 4096]", (8 * n, 20 * n), 0,
         lambda: F.layer_norm(x, (4096,), w, b, 1e-5), [x, w, b], gy)
    del x, gy

    # Softmax over rows a warp's and a block's in strata's plans: eager, and the primitives
    # compiled (strata's "softmax from primitives").
    def primitives(t):
        e = (t - t.amax(-1, keepdim=True)).exp()
        return e / e.sum(-1, keepdim=True)

    compiled = torch.compile(primitives)
    for shape in ((65536, 4096), (16384, 16384)):
        t = randn(*shape)
        for name, fn in (("softmax", lambda: torch.softmax(t, -1)),
                         ("softmax from primitives (compile)", lambda: compiled(t))):
            print(json.dumps({"op": f"{name} {list(shape)}", "ms": timed(fn),
                              "bytes": 8 * t.numel()}), flush=True)
        del t
    torch._dynamo.reset()

    x = randn(256, 256, 28, 28).requires_grad_()
    w, b = randn(256).requires_grad_(), randn(256).requires_grad_()
    mean, var = torch.zeros(256, device=dev), torch.ones(256, device=dev)
    gy = randn(256, 256, 28, 28)
    n = x.numel()
    ms = timed(lambda: x.detach().clone())
    print(json.dumps({"op": "copy [256, 256, 28, 28]", "ms": ms, "bytes": 8 * n}), flush=True)
    rows("batch_norm training [256, 256, 28, 28]", (8 * n, 20 * n), 0,
         lambda: F.batch_norm(x, mean, var, w, b, True, 0.1, 1e-5), [x, w, b], gy)
    del x, gy

    torch.backends.cuda.matmul.allow_tf32 = True
    x = randn(8192, 4096).requires_grad_()
    w, b = (randn(4096, 4096) * 0.015).requires_grad_(), randn(4096).requires_grad_()
    gy = randn(8192, 4096)
    rows("linear + bias + relu [8192, 4096]·[4096, 4096]", (0, 0), 2 * 8192 * 4096 * 4096,
         lambda: F.relu(F.linear(x, w, b)), [x, w, b], gy)


main()
