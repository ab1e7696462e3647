#!/usr/bin/env bash
# Runs on the GPU machine (no Rust toolchain there): the binaries scripts/gpu-build.sh put in
# .gpu/bin. Modes: tests (the differential suite on CUDA), sanitize (a reduced suite under
# compute-sanitizer memcheck and racecheck), bench (strata's CUDA backend beside PyTorch),
# sweep (every op family, strata beside PyTorch, and on wgpu), wgpu-tests (the differential suite on the wgpu backend, NVIDIA's Vulkan driver), wgpu-bench
# (the wgpu backend's benchmark), python (the Python extension's DLPack tests with PyTorch
# and CuPy), profile (per-kernel profiles of softmax on CUDA and wgpu), copies (pinned copies
# beside kernels on two streams), sweep-ab (an earlier build's sweep beside this one's), host
# (the host cost per op), first-op (a new process's first calls, cold, beside an earlier
# build's), random (thousands of random programs on cuda:0 and on wgpu,
# RANDOM_PROGRAMS of them, 3000 unless set), hist (histograms and stochastic rounding beside
# PyTorch), train (optimizer steps and the MLP's training step beside PyTorch), soak (the
# soak test's cycles on cuda:0, SOAK_CYCLES of them, 10^5 unless set, and a tenth of them on
# wgpu), cpu-train (the MLP step on the CPU backend beside PyTorch's CPU), multi (several
# GPUs: copies between devices, collectives and the mixed-device tests, beside PyTorch, and
# the CNN's step data-parallel; dp that step alone), conv (the
# convolution tests with cuDNN on and off, and conv2d beside PyTorch's cuDNN; conv-own the
# own-kernel half of it in one short call), cnn (a small
# CNN's training step beside PyTorch eager and compiled, and on wgpu), norms (layer_norm,
# batch_norm and linear + bias + relu beside PyTorch), ship (record and build
# the shipped kernel archive), ship-check (first calls with it and without), all.
# Writes logs and a summary to $OUT (or .gpu/out).
set -uo pipefail
cd "$(dirname "$0")/.."
mode="${1:-all}"
out="${OUT:-.gpu/out}"
mkdir -p "$out"
bin=.gpu/bin
# The archive gpu-build.sh made (a warm machine may still hold binaries of an earlier carry).
if [ -e .gpu/bin.tar.xz ]; then rm -rf "$bin" && tar -C .gpu -xJf .gpu/bin.tar.xz; fi

# The CUDA libraries strata loads at run time: the toolkit's, or the pip wheels'.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import nvidia, os; [print(os.path.join(p, s, "lib")) for p in nvidia.__path__ for s in os.listdir(p)]' 2>/dev/null); do
  [ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$d"
done
export LD_LIBRARY_PATH
# A test process that crashes prints the faulting thread's stack (tests/src/crash_trace.rs;
# resolve its offsets with addr2line against the unstripped binary in target/release/deps).
export STRATA_CRASH_TRACE="${STRATA_CRASH_TRACE:-1}"
# Outside .gpu, so carrying fresh binaries keeps the compiled kernels of earlier runs.
export STRATA_CACHE_DIR="${STRATA_CACHE_DIR:-/tmp/strata-cache}"
summary="$out/summary.txt"

# Vulkan for the wgpu runs: the loader gpu-build.sh fetched into .gl, and NVIDIA's ICD.
setup_vulkan() {
  # The loader and libglvnd (NVIDIA's ICD library needs its dispatch libraries).
  for f in .gl/*.deb; do [ -e "$f" ] && dpkg -x "$f" /; done
  ldconfig
  icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  egl=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
  if [ -z "${VK_DRIVER_FILES:-}" ] && [ -e "$icd" ]; then export VK_DRIVER_FILES="$icd"; fi
  if [ -e "$egl" ]; then export __EGL_VENDOR_LIBRARY_FILENAMES="$egl"; fi
  export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
}

run_tests() {
  devices="${1:-cuda:0}"
  echo "== differential suite on $devices" | tee -a "$summary"
  for t in "$bin"/test-*; do
    name=$(basename "$t")
    # ONLY="reduce streams" limits the run to those test files; FILTER="name" to the tests
    # whose names contain it (printing what they print).
    if [ -n "${ONLY:-}" ] && ! [[ " $ONLY " == *" ${name#test-} "* ]]; then continue; fi
    STRATA_TEST_DEVICES="$devices" timeout 900 "$t" ${FILTER:+"$FILTER" --nocapture} --test-threads=1 > "$out/$name.log" 2>&1
    rc=$?
    printf '%-28s rc=%-3s %s\n' "$name" "$rc" "$(grep -E '^test result' "$out/$name.log" | tail -1)" | tee -a "$summary"
    [ $rc -ne 0 ] && grep -E 'panicked|FAILED|failed' "$out/$name.log" | head -20 | tee -a "$summary"
  done
}

run_sanitize() {
  echo "== compute-sanitizer (reduced suite)" | tee -a "$summary"
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  # memcheck: out-of-bounds and misaligned accesses; racecheck: shared-memory races (the
  # kernels that use shared memory: reductions by a block, our matmul). memcheck on the reduce
  # file takes about 6 minutes on an H100: give it SANITIZE_TIMEOUT=560 (seconds) on its own.
  # SANITIZE_PAIRS="memcheck:fusion racecheck:fusion" (and FILTER="name") picks other runs.
  for pair in ${SANITIZE_PAIRS:-memcheck:streams memcheck:index_ops memcheck:seed_examples \
              memcheck:join_random memcheck:matmul memcheck:reduce racecheck:matmul racecheck:reduce}; do
    tool=${pair%%:*}; name=test-${pair#*:}
    [ -x "$bin/$name" ] || continue
    STRATA_TEST_DEVICES=cuda:0 timeout "${SANITIZE_TIMEOUT:-150}" "$cs" --tool "$tool" --error-exitcode 86 \
      "$bin/$name" ${FILTER:+"$FILTER"} --test-threads=1 > "$out/sanitize-$tool-$name.log" 2>&1
    rc=$?
    printf '%-10s %-22s rc=%-3s %s\n' "$tool" "$name" "$rc" "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$out/sanitize-$tool-$name.log" | tail -2 | tr '\n' ' ')" | tee -a "$summary"
  done
}

run_bench() {
  echo "== benchmark: strata vs PyTorch, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" | tee -a "$summary"
  "$bin/bench_gpu" --device cuda > "$out/strata.jsonl" 2> "$out/strata-bench.err"
  # The host cost again with the CUDA backend's launch batching off, for comparison.
  STRATA_CUDA_BATCH=0 "$bin/bench_gpu" host 2>> "$out/strata-bench.err" | sed 's/"op": "host/"op": "unbatched-host/' >> "$out/strata.jsonl"
  python3 scripts/bench_torch.py > "$out/torch.jsonl" 2> "$out/torch-bench.err"
  cold=$(mktemp -d); 
  STRATA_CACHE_DIR="$cold" CUDA_CACHE_PATH="$cold/nv" "$bin/bench_gpu" first-op | sed 's/first-op/first-op-cold/' >> "$out/strata.jsonl"
  STRATA_CACHE_DIR="$cold" CUDA_CACHE_PATH="$cold/nv" "$bin/bench_gpu" first-op | sed 's/first-op/first-op-warm/' >> "$out/strata.jsonl"
  python3 scripts/bench_table.py "$out/strata.jsonl" "$out/torch.jsonl" | tee -a "$summary"
}

run_wgpu_bench() {
  echo "== benchmark: the wgpu backend on NVIDIA's Vulkan driver" | tee -a "$summary"
  "$bin/bench_gpu" --device wgpu > "$out/wgpu.jsonl" 2> "$out/wgpu-bench.err"
  head -3 "$out/wgpu-bench.err" | tee -a "$summary"
  python3 scripts/bench_table.py "$out/wgpu.jsonl" | tee -a "$summary"
}

# The sweep of the whole op set: strata on CUDA, PyTorch, then strata on wgpu (smaller runs
# of it are SWEEP_ARGS="--log2n 24 --side 4096 --gemm 2048"), joined into one table.
run_sweep() {
  echo "== sweep: strata vs PyTorch, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" | tee -a "$summary"
  "$bin/bench_sweep" --device cuda ${SWEEP_ARGS:-} > "$out/sweep-strata.jsonl" 2> "$out/sweep-strata.err"
  python3 scripts/bench_sweep_torch.py ${SWEEP_ARGS:-} > "$out/sweep-torch.jsonl" 2> "$out/sweep-torch.err"
  wgpu=""
  if [ -z "${SWEEP_NO_WGPU:-}" ]; then
    (setup_vulkan; "$bin/bench_sweep" --device wgpu ${SWEEP_ARGS:-} > "$out/sweep-wgpu.jsonl" 2> "$out/sweep-wgpu.err")
    wgpu="$out/sweep-wgpu.jsonl"
  fi
  tail -n 3 "$out"/sweep-*.err | tee -a "$summary"
  python3 scripts/bench_sweep_table.py "$out/sweep-strata.jsonl" "$out/sweep-torch.jsonl" $wgpu | tee -a "$summary"
}

# The sweep of an earlier build (.gpu/before/bench_sweep, copied there by hand after
# gpu-build.sh) and of this one, on SWEEP_DEVICE (wgpu unless set), twice each in turn: a
# before/after table from one machine, so a change is told apart from another GPU's numbers.
run_sweep_ab() {
  device="${SWEEP_DEVICE:-wgpu}"
  [ "$device" = wgpu ] && setup_vulkan
  echo "== sweep before/after on $device" | tee -a "$summary"
  for i in 1 2; do
    .gpu/before/bench_sweep --device "$device" ${SWEEP_ARGS:-} > "$out/ab-before-$i.jsonl" 2>/dev/null
    "$bin/bench_sweep" --device "$device" ${SWEEP_ARGS:-} > "$out/ab-now-$i.jsonl" 2>/dev/null
  done
  python3 - "$out" <<'PY' | tee -a "$summary"
import json, sys
out = sys.argv[1]
def load(name):
    rows = {}
    for i in (1, 2):
        for line in open(f"{out}/ab-{name}-{i}.jsonl"):
            r = json.loads(line)
            if "ms" in r:
                rows.setdefault(r["op"], []).append(r["ms"])
    return rows
before, now = load("before"), load("now")
print("| op | before (ms, 2 runs) | now (ms, 2 runs) | before / now |\n|---|---:|---:|---:|")
for op, ms in now.items():
    b = before.get(op)
    fmt = lambda v: " / ".join(f"{x:.3f}" for x in v)
    ratio = f"{min(b) / min(ms):.2f}×" if b else ""
    print(f"| {op} | {fmt(b) if b else ''} | {fmt(ms)} | {ratio} |")
PY
}

# The Python extension's tests (python/tests) with PyTorch and CuPy: the wheel gpu-build.sh
# made, unpacked beside the tests (no network, no install into the image's environment).
run_python() {
  echo "== Python extension: DLPack with PyTorch, CuPy and NumPy" | tee -a "$summary"
  py=/tmp/strata-py && rm -rf "$py" && mkdir -p "$py"
  python3 -m pip install --quiet --no-deps --no-index --target "$py" .gpu/wheels/*.whl > "$out/python-install.log" 2>&1
  PYTHONPATH="$py" timeout 560 python3 -m pytest -q -p no:cacheprovider "$bin/py" > "$out/python.log" 2>&1
  rc=$?
  printf 'rc=%-3s %s\n' "$rc" "$(tail -1 "$out/python.log")" | tee -a "$summary"
  [ $rc -ne 0 ] && grep -E '^(FAILED|ERROR)|Error' "$out/python.log" | head -30 | tee -a "$summary"
  # The host cost of one exchange, strata beside PyTorch and CuPy.
  PYTHONPATH="$py" timeout 300 python3 scripts/bench_dlpack.py 2>&1 | tee -a "$summary"
}

# Per-kernel profiles of softmax (examples/profile.rs softmax) on CUDA and on NVIDIA's Vulkan
# driver: each kernel's time and bandwidth, to see where a composite op spends it.
run_profile() {
  for device in cuda wgpu; do
    [ "$device" = wgpu ] && setup_vulkan
    echo "== softmax profile on $device" | tee -a "$summary"
    timeout 300 "$bin/profile" "$device" "$out/profile-$device" softmax 2>&1 | tee -a "$summary"
  done
}

# Pinned host↔device copies on one stream beside kernels on another (examples/profile.rs
# copies): the profile's device times show whether they overlap.
run_copies() {
  echo "== pinned copies beside kernels (profile copies)" | tee -a "$summary"
  timeout 200 "$bin/profile" cuda "$out/profile-copies" copies 2>&1 | tee -a "$summary"
}

# The host cost of an op (bench_gpu host): enqueue, sustained, recording; three runs, since
# one run's spread is about a microsecond.
run_host() {
  echo "== host cost per op (bench_gpu host, 3 runs)" | tee -a "$summary"
  for i in 1 2 3; do timeout 120 "$bin/bench_gpu" host 2>&1 | grep host-us-per-add | tee -a "$summary"; done
}

# The first calls of a new process with empty caches (bench_gpu first-op: context, first
# add+sum+read, first new fused kernel, and how much of a second one is the compile), three
# runs each of an earlier build (.gpu/before/bench_gpu, when copied there) and this one, in turn.
run_first_op() {
  echo "== first calls, cold caches (bench_gpu first-op)" | tee -a "$summary"
  for i in 1 2 3; do
    for b in .gpu/before/bench_gpu "$bin/bench_gpu"; do
      [ -x "$b" ] || continue
      cold=$(mktemp -d)
      printf '%-24s %s\n' "$b" "$(STRATA_CACHE_DIR="$cold" CUDA_CACHE_PATH="$cold/nv" timeout 60 "$b" first-op)" | tee -a "$summary"
      rm -rf "$cold"
    done
  done
}

# The shipped kernel archive (examples/ship_kernels.rs): record the common work's kernels on
# this GPU, then compile them for every shipped architecture with this machine's NVRTC into
# $out/shipped (copy kernels.bin and kernels.txt into cuda-backend/shipped/ and rebuild).
run_ship() {
  echo "== shipped kernels: record and build" | tee -a "$summary"
  rec=$(mktemp -d)
  # Each well inside the device tool's 600 s a command (about 20 s each on an H200 host).
  timeout 280 "$bin/ship_kernels" record "$rec" 2>&1 | tail -3 | tee -a "$summary"
  timeout 280 "$bin/ship_kernels" build "$rec" "$out/shipped" 2>&1 | tail -3 | tee -a "$summary"
  [ -d "$out/shipped" ] && tar -C "$rec" -cJf "$out/shipped/sources.tar.xz" .
  rm -rf "$rec"
}

# Whether the archive built into these binaries is current, and what it saves: the common
# work's first calls in a new process with empty caches, with the archive and without
# (STRATA_CUDA_SHIPPED=0), two runs each in turn; then bench_gpu first-op likewise.
run_ship_check() {
  echo "== first calls with the shipped archive and without (cold caches)" | tee -a "$summary"
  for i in 1 2; do
    for shipped in 1 0; do
      cold=$(mktemp -d)
      STRATA_CUDA_SHIPPED=$shipped STRATA_CACHE_DIR="$cold" CUDA_CACHE_PATH="$cold/nv" timeout 300 \
        "$bin/ship_kernels" check > "$out/ship-check-$shipped-$i.txt" 2>&1
      printf 'shipped=%s %s\n' "$shipped" "$(head -1 "$out/ship-check-$shipped-$i.txt")" | tee -a "$summary"
      cold2=$(mktemp -d)
      printf 'shipped=%s %s\n' "$shipped" "$(STRATA_CUDA_SHIPPED=$shipped STRATA_CACHE_DIR="$cold2" CUDA_CACHE_PATH="$cold2/nv" timeout 60 "$bin/bench_gpu" first-op)" | tee -a "$summary"
      rm -rf "$cold" "$cold2"
    done
  done
}

# Random programs (tests/tests/random_programs.rs) on CUDA and then on NVIDIA's Vulkan driver.
run_random() {
  n="${RANDOM_PROGRAMS:-3000}"
  for devices in cuda:0 wgpu; do
    [ "$devices" = wgpu ] && setup_vulkan
    echo "== random programs on $devices: $n" | tee -a "$summary"
    STRATA_TEST_DEVICES="$devices" STRATA_RANDOM_PROGRAMS="$n" timeout 560 \
      "$bin/test-random_programs" --test-threads=1 --nocapture > "$out/random-$devices.log" 2>&1
    rc=$?
    printf 'rc=%-3s %s\n' "$rc" "$(grep -E '^random programs on|^test result' "$out/random-$devices.log" | tr '\n' ' ')" | tee -a "$summary"
    [ $rc -ne 0 ] && grep -A12 -E 'failing programs|^seed' "$out/random-$devices.log" | head -40 | tee -a "$summary"
  done
}

# Histograms and stochastic rounding (issue 42): bench_gpu hist beside PyTorch, same call.
run_hist() {
  echo "== histograms and stochastic rounding, 2^28 f32 (bench_gpu hist, bench_hist_torch.py)" | tee -a "$summary"
  timeout 300 "$bin/bench_gpu" hist > "$out/hist.jsonl" 2> "$out/hist.err"
  timeout 300 python3 scripts/bench_hist_torch.py >> "$out/hist.jsonl" 2>> "$out/hist.err"
  python3 - "$out/hist.jsonl" <<'PY' | tee -a "$summary"
import json, sys
rows, moved = {}, {}
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        rows[r["op"]], moved[r["op"]] = r["ms"], r.get("bytes", 0)
copy = "copy-f32-2^28"
bw = moved.get(copy, 0) / rows[copy] if copy in rows else 0
for op, ms in rows.items():
    if op.startswith("torch-"):
        continue
    peer = rows.get("torch-" + op)
    vs = f"torch {peer:.3f} ms, {peer / ms:.2f}x" if peer else ""
    of_copy = f"{moved[op] / ms / bw:.2f} of copy bandwidth" if bw else ""
    print(f"{op:32s} {ms:8.3f} ms  {vs:28s} {of_copy}")
PY
}

run_train() {
  echo "== optimizers and training steps (bench_gpu optim/mlp, bench_optim_torch.py, bench_mlp_torch.py)" | tee -a "$summary"
  timeout 300 "$bin/bench_gpu" optim > "$out/train.jsonl" 2> "$out/train.err"
  timeout 300 python3 scripts/bench_optim_torch.py >> "$out/train.jsonl" 2>> "$out/train.err"
  for opt in sgd adamw; do
    timeout 300 "$bin/bench_gpu" mlp --batch 8192 --optimizer $opt >> "$out/train.jsonl" 2>> "$out/train.err"
    timeout 300 python3 scripts/bench_mlp_torch.py 8192 $opt >> "$out/train.jsonl" 2>> "$out/train.err"
  done
  # The backward of the fused chains (2^28 f32), beside PyTorch eager and torch.compile.
  timeout 300 "$bin/bench_gpu" backward >> "$out/train.jsonl" 2>> "$out/train.err"
  timeout 300 python3 scripts/bench_backward_torch.py >> "$out/train.jsonl" 2>> "$out/train.err"
  # The CPU backend beside PyTorch's CPU (this machine's cores; batch 256), and the step on
  # wgpu through NVIDIA's Vulkan driver (beside strata's CUDA rows above).
  timeout 300 "$bin/bench_gpu" mlp --device cpu --batch 256 --optimizer adamw >> "$out/train.jsonl" 2>> "$out/train.err"
  timeout 300 python3 scripts/bench_mlp_torch.py 256 adamw cpu >> "$out/train.jsonl" 2>> "$out/train.err"
  (setup_vulkan; timeout 300 "$bin/bench_gpu" mlp --device wgpu --batch 8192 --optimizer adamw >> "$out/train.jsonl" 2>> "$out/train.err")
  # TRAIN_PROFILE=1: one AdamW step of each profiled, kernel by kernel (mlp-profile-*.txt).
  if [ -n "${TRAIN_PROFILE:-}" ]; then
    timeout 300 "$bin/bench_gpu" mlp --batch 8192 --optimizer adamw --profile > /dev/null 2> "$out/mlp-profile-strata.txt"
    timeout 300 python3 scripts/profile_mlp_torch.py 8192 adamw > "$out/mlp-profile-torch.txt" 2>&1
  fi
  python3 - "$out/train.jsonl" <<'PY' | tee -a "$summary"
import json, sys
rows = {}
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        rows[r["op"]] = r
for op, r in rows.items():
    if op.startswith("torch-") or op.endswith((" (eager)", " (compile)")):
        continue
    if "ms" not in r:
        peers = "  ".join(f"{m} {rows[f'{op} ({m})']['mib']:.1f}" for m in ("eager", "compile") if f"{op} ({m})" in rows)
        print(f"{op:30s} {r['mib']:8.1f} MiB  torch {peers}")
        continue
    ms, moved = r["ms"], r.get("bytes", 0)
    peers = []
    for label, p in (("torch", "torch-" + op), ("fused", "torch-" + op + "-fused"),
                     ("eager", op + " (eager)"), ("compile", op + " (compile)")):
        if p in rows:
            peers.append(f"{label} {rows[p]['ms']:.3f} ({rows[p]['ms'] / ms:.2f}x)")
    gbs = f"{moved / ms / 1e6:7.0f} GB/s" if moved else ""
    print(f"{op:30s} {ms:8.3f} ms {gbs}  " + "  ".join(peers))
PY
}

run_soak() {
  n="${SOAK_CYCLES:-100000}"
  echo "== soak: $n cycles on cuda:0, $((n / 10)) on wgpu (tests/tests/soak.rs)" | tee -a "$summary"
  STRATA_SOAK_CYCLES=$n STRATA_TEST_DEVICES=cuda:0 timeout 500 "$bin/test-soak" --nocapture > "$out/soak-cuda.log" 2>&1
  printf 'cuda rc=%s %s\n' "$?" "$(grep -E '^soak on|test result' "$out/soak-cuda.log" | tr '\n' ' ')" | tee -a "$summary"
  (setup_vulkan; STRATA_SOAK_CYCLES=$((n / 10)) STRATA_TEST_DEVICES=wgpu timeout 300 "$bin/test-soak" --nocapture > "$out/soak-wgpu.log" 2>&1
   printf 'wgpu rc=%s %s\n' "$?" "$(grep -E '^soak on|test result' "$out/soak-wgpu.log" | tr '\n' ' ')" | tee -a "$summary")
}

# Several GPUs (the nvidia-h100-x2/-x4 kinds): the devices tests on cuda:0 with cuda:1 (peer
# copies, mixed-device errors), the NCCL collectives, and copies and all_reduce beside
# PyTorch's. NVLink multicast stays off for anything that starts NCCL (KINDS.md).
# NCCL without NVLink multicast (KINDS.md), where strata loads it.
setup_nccl() {
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  # strata loads NCCL as libnccl.so; pip's nvidia-nccl-cu13 has only libnccl.so.2.
  nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib", "libnccl.so.2"))' 2>/dev/null)
  if [ -n "$nccl" ] && [ -e "$nccl" ]; then
    mkdir -p /tmp/strata-nccl && ln -sf "$nccl" /tmp/strata-nccl/libnccl.so
    export LD_LIBRARY_PATH="/tmp/strata-nccl:$LD_LIBRARY_PATH"
  fi
}

run_dp() {
  setup_nccl
  echo "-- host cost of small ops from one thread, and from a thread per GPU (bench_gpu host-threads)" | tee -a "$summary"
  timeout 200 "$bin/bench_gpu" host-threads 2>&1 | tee -a "$summary"
  echo "-- the CNN's training step data-parallel (bench_gpu dp), 256 images per GPU" | tee -a "$summary"
  timeout 300 "$bin/bench_gpu" dp 2>&1 | tee -a "$summary"
  # The step is bound by the host: each rank pinned to two CPUs of its own (as a launcher
  # would with taskset or numactl) keeps the scheduler from moving or crowding it.
  cpus=""; for ((k = 0; k < $(nvidia-smi -L | wc -l); k++)); do cpus+="$((8 * k)),$((8 * k + 1));"; done
  echo "-- the same, process per GPU, rank k on CPUs 8k and 8k+1 (STRATA_DP_CPUS=$cpus)" | tee -a "$summary"
  STRATA_DP_ONLY=processes STRATA_DP_CPUS="$cpus" timeout 300 "$bin/bench_gpu" dp 2>&1 | tee -a "$summary"
}

run_multi() {
  setup_nccl
  echo "== several GPUs: $(nvidia-smi -L | wc -l) devices" | tee -a "$summary"
  nvidia-smi topo -m 2>&1 | head -8 | tee -a "$summary"
  for t in devices collectives; do
    STRATA_TEST_DEVICES=cuda:0 timeout 300 "$bin/test-$t" --test-threads=1 > "$out/$t.log" 2>&1
    printf 'test-%s rc=%s %s\n' "$t" "$?" "$(grep -E '^test result' "$out/$t.log")" | tee -a "$summary"
    grep -E 'panicked|CUDA device' "$out/$t.log" | head -10 | tee -a "$summary"
  done
  echo "-- conv2d: strata (bench_gpu conv), then PyTorch (cuDNN)" | tee -a "$summary"
  timeout 300 "$bin/bench_gpu" conv 2>&1 | tee -a "$summary"
  timeout 200 python3 scripts/bench_conv_torch.py 2>&1 | tee -a "$summary"
  echo "-- strata (bench_gpu peer), then PyTorch" | tee -a "$summary"
  timeout 200 "$bin/bench_gpu" peer 2>&1 | tee -a "$summary"
  timeout 200 python3 scripts/bench_peer_torch.py 2>&1 | tee -a "$summary"
  run_dp
}

# Convolutions through cuDNN (loaded from the pip nvidia-cudnn package) and, with
# STRATA_CUDNN=0, strata's own implicit-GEMM kernels as without cuDNN: the tests that
# convolve, then `bench_gpu conv` both ways and on wgpu (NVIDIA's Vulkan) beside PyTorch's
# F.conv2d.
run_conv() {
  echo "== convolutions: cuDNN on, then off (STRATA_CUDNN=0)" | tee -a "$summary"
  for cudnn in 1 0; do
    for t in nn_functional training; do
      STRATA_CUDNN=$cudnn STRATA_TEST_DEVICES=cuda:0 timeout 300 "$bin/test-$t" --test-threads=1 > "$out/$t-cudnn$cudnn.log" 2>&1
      printf 'test-%s (STRATA_CUDNN=%s) rc=%s %s\n' "$t" "$cudnn" "$?" "$(grep -E '^test result' "$out/$t-cudnn$cudnn.log")" | tee -a "$summary"
      grep -E 'panicked' -A2 "$out/$t-cudnn$cudnn.log" | head -10 | tee -a "$summary"
    done
  done
  echo "-- conv2d: strata with cuDNN, strata's own kernels (STRATA_CUDNN=0), PyTorch (cuDNN), wgpu" | tee -a "$summary"
  timeout 200 "$bin/bench_gpu" conv 2>&1 | tee -a "$summary"
  STRATA_CUDNN=0 timeout 200 "$bin/bench_gpu" conv 2>&1 | sed 's/"op": "/"op": "own /' | tee -a "$summary"
  timeout 200 python3 scripts/bench_conv_torch.py 2>&1 | tee -a "$summary"
  (setup_vulkan; timeout 200 "$bin/bench_gpu" conv --device wgpu 2>&1 | tee -a "$summary")
}

# The own-kernel half of run_conv in one short call: the convolution tests and the CNN's
# training on the digits with STRATA_CUDNN=0, conv2d with strata's own kernels beside PyTorch,
# and on wgpu; last, the one-kernel-a-pass test through cuDNN.
run_conv_own() {
  echo "== convolutions: strata's own kernels (STRATA_CUDNN=0)" | tee -a "$summary"
  for t in nn_functional training; do
    STRATA_CUDNN=0 STRATA_TEST_DEVICES=cuda:0 timeout 120 "$bin/test-$t" --test-threads=1 > "$out/$t-own.log" 2>&1
    printf 'test-%s (STRATA_CUDNN=0) rc=%s %s\n' "$t" "$?" "$(grep -E '^test result' "$out/$t-own.log")" | tee -a "$summary"
    grep -E 'panicked' -A2 "$out/$t-own.log" | head -10 | tee -a "$summary"
  done
  for tile in 64x64 128x128 256x64 64x256 256x16 16x256; do
    STRATA_CONV_TILE=$tile STRATA_CUDNN=0 STRATA_TEST_DEVICES=cuda:0 timeout 60 "$bin/test-nn_functional" one_kernel --test-threads=1 > "$out/one-kernel-$tile.log" 2>&1
    printf 'one_kernel, tile %s: rc=%s %s\n' "$tile" "$?" "$(grep -E '^test result' "$out/one-kernel-$tile.log")" | tee -a "$summary"
    grep -E 'panicked' -A2 "$out/one-kernel-$tile.log" | head -6 | tee -a "$summary"
  done
  echo "-- conv2d: strata's own kernels (STRATA_CUDNN=0), PyTorch (cuDNN), wgpu" | tee -a "$summary"
  STRATA_CUDNN=0 timeout 120 "$bin/bench_gpu" conv 2>&1 | sed 's/"op": "/"op": "own /' | tee -a "$summary"
  timeout 90 python3 scripts/bench_conv_torch.py 2>&1 | tee -a "$summary"
  (setup_vulkan; timeout 90 "$bin/bench_gpu" conv --device wgpu 2>&1 | tee -a "$summary")
  STRATA_TEST_DEVICES=cuda:0 timeout 60 "$bin/test-nn_functional" one_kernel --test-threads=1 > "$out/one-kernel-cudnn.log" 2>&1
  printf 'test-nn_functional one_kernel (cuDNN) rc=%s %s\n' "$?" "$(grep -E '^test result' "$out/one-kernel-cudnn.log")" | tee -a "$summary"
  grep -E 'panicked' -A4 "$out/one-kernel-cudnn.log" | head -12 | tee -a "$summary"
}

run_cnn() {
  echo "== the small CNN's AdamW step, batch 256: strata (bench_gpu cnn), PyTorch eager and compiled" | tee -a "$summary"
  timeout 300 "$bin/bench_gpu" cnn --profile 2> "$out/cnn-profile-strata.txt" | tee -a "$summary"
  timeout 400 python3 scripts/bench_cnn_torch.py 256 2>&1 | tee -a "$summary"
  (setup_vulkan; timeout 300 "$bin/bench_gpu" cnn --device wgpu --batch 256 2>&1 | tee -a "$summary")
}

# issue 40's normalization and linear rows: strata (with each pass's kernels), PyTorch eager
# and compiled.
run_norms() {
  echo "== layer_norm, batch_norm, linear + bias + relu: strata (bench_gpu norms), PyTorch" | tee -a "$summary"
  timeout 300 "$bin/bench_gpu" norms --profile 2> "$out/norms-profile-strata.txt" | tee -a "$summary"
  (cd scripts && timeout 400 python3 bench_norms_torch.py 2>&1) | tee -a "$summary"
}

run_cpu_train() {
  echo "== the MLP step on the CPU backend (batch 256) beside PyTorch's CPU" | tee -a "$summary"
  timeout 300 "$bin/bench_gpu" mlp --device cpu --batch 256 --optimizer adamw 2>&1 | tee -a "$summary"
  timeout 300 python3 scripts/bench_mlp_torch.py 256 adamw cpu 2>&1 | tee -a "$summary"
}

case "$mode" in
  hist) run_hist ;;
  train) run_train ;;
  soak) run_soak ;;
  cpu-train) run_cpu_train ;;
  multi) run_multi ;;
  conv) run_conv ;;
  conv-own) run_conv_own ;;
  cnn) run_cnn ;;
  norms) run_norms ;;
  dp) run_dp ;;
  tests) run_tests ;;
  sanitize) run_sanitize ;;
  bench) run_bench ;;
  wgpu-tests) setup_vulkan; run_tests wgpu ;;
  wgpu-bench) setup_vulkan; run_wgpu_bench ;;
  random) run_random ;;
  profile) run_profile ;;
  copies) run_copies ;;
  sweep-ab) run_sweep_ab ;;
  host) run_host ;;
  first-op) run_first_op ;;
  ship) run_ship ;;
  ship-check) run_ship_check ;;
  sweep) run_sweep ;;
  python) run_python ;;
  all) run_tests; run_python; run_sanitize; run_bench; setup_vulkan; run_wgpu_bench ;;
esac
