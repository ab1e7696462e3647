"""The host cost of one DLPack exchange, strata beside PyTorch and CuPy in the same process:
import (`from_dlpack`) plus dropping the result (the deleter), in microseconds per exchange,
median of 7 rounds of 2,000. Sizes do not matter (nothing is copied): 1,024 f32.
Run on the GPU machine with the wheel gpu-build.sh made: `bash scripts/gpu-run.sh python`."""

import statistics
import time

import numpy as np
import strata

try:
    import torch
except ImportError:
    torch = None
try:
    import cupy
except ImportError:
    cupy = None


def per_call_us(make, rounds=7, n=2000):
    for _ in range(200):
        make()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            make()
        times.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(times)


rows = []
a = np.arange(1024, dtype=np.float32)
s_cpu = strata.arange(1024).copy()
rows.append(("numpy → strata (cpu)", per_call_us(lambda: strata.from_dlpack(a))))
rows.append(("strata → numpy (cpu)", per_call_us(lambda: np.from_dlpack(s_cpu))))
if torch is not None:
    t_cpu = torch.arange(1024, dtype=torch.float32)
    rows.append(("numpy → torch (cpu, reference)", per_call_us(lambda: torch.from_dlpack(a))))
    rows.append(("torch → numpy (cpu, reference)", per_call_us(lambda: np.from_dlpack(t_cpu))))
if torch is not None and torch.cuda.is_available():
    x = torch.arange(1024, dtype=torch.float32, device="cuda")
    s = strata.arange(1024, device="cuda").copy()
    strata.synchronize("cuda")
    rows.append(("torch → strata (cuda)", per_call_us(lambda: strata.from_dlpack(x))))
    rows.append(("strata → torch (cuda)", per_call_us(lambda: torch.from_dlpack(s))))
    rows.append(("torch → torch (cuda, reference)", per_call_us(lambda: torch.from_dlpack(x.__dlpack__()))))
    # Where an exchange's time goes: the producer's export alone (a capsule made on the
    # consumer's stream, then dropped unused), and the device query PyTorch asks first.
    ts = torch.cuda.current_stream().cuda_stream or 1  # DLPack names the legacy default 1
    rows.append(("strata export alone (`__dlpack__`, cuda)", per_call_us(lambda: s.__dlpack__(stream=ts))))
    rows.append(("torch export alone (`__dlpack__`, cuda, reference)", per_call_us(lambda: x.__dlpack__(stream=ts))))
    rows.append(("strata `__dlpack_device__` (cuda)", per_call_us(lambda: s.__dlpack_device__())))
    # The two ways into torch.from_dlpack: a capsule (what the torch → torch row passes) or
    # an object with `__dlpack__` (PyTorch first asks for its current stream and the device).
    rows.append(("strata → torch, a capsule (cuda)", per_call_us(lambda: torch.from_dlpack(s.__dlpack__(stream=ts)))))
    rows.append(("torch → torch, the object (cuda, reference)", per_call_us(lambda: torch.from_dlpack(x))))
    if cupy is not None:
        c = cupy.arange(1024, dtype=cupy.float32)
        rows.append(("torch → cupy (cuda, reference)", per_call_us(lambda: cupy.from_dlpack(x))))
        rows.append(("cupy → torch (cuda, reference)", per_call_us(lambda: torch.from_dlpack(c))))
        rows.append(("cupy → strata (cuda)", per_call_us(lambda: strata.from_dlpack(c))))
        rows.append(("strata → cupy (cuda)", per_call_us(lambda: cupy.from_dlpack(s))))

print("| exchange | µs per exchange |")
print("|---|---:|")
for name, us in rows:
    print(f"| {name} | {us:.2f} |")
