"""PyTorch's side of `bench_gpu hist`: histc into 64 and 4096 bins, the cast to bf16 and a copy of
2^N f32 normals (N from argv, 28 unless given), timed the same way (median of 20 runs of 5 calls,
CUDA events). One JSON object per line."""
import json
import sys

import torch

from bench_torch import timed  # the same warm-up, 20 runs and CUDA events


def main():
    log2 = int(sys.argv[1]) if len(sys.argv) > 1 else 28
    x = torch.randn(1 << log2, device="cuda")
    rows = {
        f"torch-copy-f32-2^{log2}": lambda: x.clone(),
        f"torch-histc-64-2^{log2}": lambda: torch.histc(x, 64, -4, 4),
        f"torch-histc-4096-2^{log2}": lambda: torch.histc(x, 4096, -4, 4),
        f"torch-to-bf16-2^{log2}": lambda: x.to(torch.bfloat16),
    }
    for name, op in rows.items():
        print(json.dumps({"op": name, "ms": round(timed(op, inner=5), 6)}))


if __name__ == "__main__":
    main()
