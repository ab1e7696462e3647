"""PyTorch's side of `bench_gpu peer`: copies of 2^N f32 elements (argv[1], 28 by default)
between CUDA devices 0 and 1 with `t.to(device)`, each way and both ways at once, timed as
strata's are (median wall-clock ms of 20 repetitions, each a copy and both devices
synchronized), one JSON object per line."""
import json
import sys
import time

import torch


def wall(op):
    runs = []
    for k in range(23):
        t = time.perf_counter()
        op()
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        if k >= 3:
            runs.append((time.perf_counter() - t) * 1e3)
    runs.sort()
    return runs[len(runs) // 2]


def main():
    if torch.cuda.device_count() < 2:
        print("peer: one CUDA device, nothing to measure", file=sys.stderr)
        return
    n = 1 << int(sys.argv[1] if len(sys.argv) > 1 else 28)
    x0 = torch.ones(n, device="cuda:0")
    x1 = torch.ones(n, device="cuda:1")
    gib = n * 4 / (1 << 30)
    rows = [
        ("cuda:0 -> cuda:1", n * 4, lambda: x0.to("cuda:1")),
        ("cuda:1 -> cuda:0", n * 4, lambda: x1.to("cuda:0")),
        ("both ways at once", 2 * n * 4, lambda: (x0.to("cuda:1"), x1.to("cuda:0"))),
    ]
    for name, moved, op in rows:
        ms = wall(op)
        print(json.dumps({"op": f"peer copy {gib:g} GiB {name}", "ms": ms, "bytes": moved}), flush=True)

    # all_reduce (sum, in place) with torch.cuda.nccl over 2 GPUs and over all of them; bus
    # bandwidth as nccl-tests defines it.
    count = torch.cuda.device_count()
    for world in sorted({2, count}):
        ts = [torch.ones(n, device=f"cuda:{k}") for k in range(world)]
        runs = []
        for k in range(23):
            t = time.perf_counter()
            torch.cuda.nccl.all_reduce(ts)
            for d in range(world):
                torch.cuda.synchronize(d)
            if k >= 3:
                runs.append((time.perf_counter() - t) * 1e3)
        runs.sort()
        ms = runs[len(runs) // 2]
        bus = n * 4 / (ms * 1e6) * 2 * (world - 1) / world
        print(json.dumps({"op": f"all_reduce {gib:g} GiB f32 on {world} GPUs", "ms": ms,
                          "bus_gb_s": round(bus, 1)}), flush=True)


main()
