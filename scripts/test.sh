#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit/property/doc tests on every backend present.
set -euo pipefail
cd "$(dirname "$0")/.."
# NVRTC installed into .venv (by .ci/run, or `pip install nvidia-cuda-nvrtc` there) lets the
# CUDA backend's code-generation test compile every kernel without a GPU.
for lib in .venv/lib/python3*/site-packages/nvidia/cu13/lib; do
  [ -d "$lib" ] && export LD_LIBRARY_PATH="$PWD/$lib:${LD_LIBRARY_PATH:-}"
done
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
