#!/usr/bin/env bash
# Builds what the GPU machine runs (it has no Rust toolchain): the release test binaries and
# the GPU benchmark, stripped, into .gpu/bin (git-ignored; carry it with the device tool).
# Carry .gpu/bin.tar.xz and .gl; then, there: `bash scripts/gpu-run.sh [mode]`.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu && mkdir -p .gpu/bin
cargo build --release --example bench_gpu --example bench_sweep --example profile --example ship_kernels
cp target/release/examples/{bench_gpu,bench_sweep,profile,ship_kernels} .gpu/bin/
# One executable per integration-test file of tests/ (cargo prints each path).
cargo test --release -p strata-tests --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])
' | while read -r name exe; do cp "$exe" ".gpu/bin/test-$name"; done
# The Python extension (DLPack with PyTorch and CuPy there): a release wheel, abi3 (the GPU
# machine's python3 is 3.12, this one's 3.11).
[ -x .venv/bin/maturin ] || { python3 -m venv .venv && .venv/bin/pip install --quiet "maturin>=1.9,<2"; }
.venv/bin/maturin build --quiet --release --locked -m python/Cargo.toml -o .gpu/wheels
mkdir -p .gpu/bin/py && cp python/tests/*.py .gpu/bin/py/
strip .gpu/bin/test-* .gpu/bin/bench_* .gpu/bin/profile .gpu/bin/ship_kernels
# Carried files are limited to 64 MiB in all: carry the compressed archive (gpu-run.sh unpacks it).
# xz's largest window (64 MiB) spans neighbouring binaries, so the shipped kernel archive each
# of them embeds (cuda-backend/shipped, 2.6 MB, already deflated) is stored about once.
XZ_OPT="-9 -T2" tar -C .gpu -cJf .gpu/bin.tar.xz bin
du -sh .gpu/bin .gpu/bin.tar.xz .gpu/wheels
ls .gpu/bin
# The unpacked copy would push the carry past its limit.
rm -rf .gpu/bin
# The Vulkan loader for the wgpu runs (the GPU machine has NVIDIA's Vulkan driver, not always
# the loader): a Debian package unpacked there by gpu-run.sh. Carry .gl beside .gpu.
if ! ls .gl/libglx0_*.deb >/dev/null 2>&1; then
  mkdir -p .gl /tmp/amd64/partial
  o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  apt-get $o update -qq && (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi
