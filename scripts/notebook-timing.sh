#!/usr/bin/env bash
# Measures how fast a new notebook answers: a fresh strata kernel with a cold evcxr cache (an
# empty XDG_CACHE_HOME), then a fresh kernel with that cache warm. For each it prints the
# seconds until the kernel is ready, until the first cell's output (a device, a tensor and its
# display) and until a simple later cell's output. Needs what scripts/test.sh's notebook tests
# need (evcxr_jupyter, .venv with jupyter_client). Uses the committed HEAD (see jupyter/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export JUPYTER_DATA_DIR="$work/jupyter" XDG_CACHE_HOME="$work/cache" XDG_RUNTIME_DIR="$work"
cargo run --locked --quiet -p strata-jupyter -- install --no-warm >/dev/null
first='let dev = Device::auto()?;
let t = Tensor::ones([2, 3], DType::F32, &dev)?;
t'
later='(&t * 2.0)?'
for cache in cold warm; do
  echo "== $cache cache (device: ${STRATA_DEVICE:-auto})"
  .venv/bin/python jupyter/src/run_cells.py strata "$first" "$later" 2>&1 | grep -v '^ *Compiling'
done
