"""Times the MLP's matmul shapes through `mm` and through `bmm` (batch 1, the call strata
makes), TF32 on: whether cuBLAS picks the same kernels for both (median of 20, CUDA events)."""
import torch

from bench_torch import timed

torch.backends.cuda.matmul.allow_tf32 = True
d = "cuda"
h = torch.randn(8192, 4096, device=d); g = torch.randn(8192, 4096, device=d)
x = torch.randn(8192, 784, device=d); g1 = torch.randn(8192, 4096, device=d)
w = torch.randn(4096, 4096, device=d)
for name, f in [
    ("mm h.t()@g (dW2)", lambda: torch.mm(h.t(), g)),
    ("bmm h.t()@g (dW2)", lambda: torch.bmm(h.t().unsqueeze(0), g.unsqueeze(0))),
    ("mm x.t()@g1 (dW1)", lambda: torch.mm(x.t(), g1)),
    ("bmm x.t()@g1 (dW1)", lambda: torch.bmm(x.t().unsqueeze(0), g1.unsqueeze(0))),
    ("mm g@w.t() (dX2)", lambda: torch.mm(g, w.t())),
    ("bmm g@w.t() (dX2)", lambda: torch.bmm(g.unsqueeze(0), w.t().unsqueeze(0))),
    ("mm h@w (fwd2)", lambda: torch.mm(h, w)),
    ("bmm h@w (fwd2)", lambda: torch.bmm(h.unsqueeze(0), w.unsqueeze(0))),
]:
    print(f"{name:24s} {timed(f):.3f} ms")
