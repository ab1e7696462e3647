#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit/property/doc tests on every backend present.
set -euo pipefail
cd "$(dirname "$0")/.."
# NVRTC installed into .venv (by .ci/run, or `pip install nvidia-cuda-nvrtc` there) lets the
# CUDA backend's code-generation test compile every kernel without a GPU.
for lib in .venv/lib/python3*/site-packages/nvidia/cu13/lib; do
  [ -d "$lib" ] && export LD_LIBRARY_PATH="$PWD/$lib:${LD_LIBRARY_PATH:-}"
done
# The wgpu backend runs on Mesa's lavapipe where no GPU driver is present (CI, dev machines).
lvp=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -e "$lvp" ] && ! [ -e /dev/nvidia0 ]; then
  export VK_DRIVER_FILES="$lvp"
fi
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
# Each stage's start, with the seconds since the script began: a slow run says where it went.
stage() { echo "== [$(date -u +%H:%M:%S), ${SECONDS} s] $*"; }
stage "formatting and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
stage "unit, doc and differential tests (cpu)"
cargo test --workspace --locked
# The wgpu backend against the CPU backend, on lavapipe (or the adapter STRATA_WGPU_ADAPTER
# picks). One test thread: the backend shares one command batch between threads.
if [ -n "${VK_DRIVER_FILES:-}" ] || [ -n "${STRATA_REQUIRE_WGPU:-}" ]; then
  stage "the differential suite on cpu and wgpu"
  STRATA_TEST_DEVICES=cpu,wgpu cargo test --locked -p strata-tests -- --test-threads=1
  stage "wgpu with a 128-byte binding cap, and packed f16"
  # Windows past the storage-binding limit, reached with small tensors: a 128-byte cap splits
  # every matmul by batch and rows (the large test covers maps and reductions at 128 MiB).
  STRATA_WGPU_MAX_BINDING=128 STRATA_TEST_DEVICES=wgpu cargo test --locked -p strata-tests \
    --test matmul -- --test-threads=1
  # Row broadcasts read once per vec4 (splats) when every operand is bound through a window.
  STRATA_WGPU_MAX_BINDING=128 STRATA_TEST_DEVICES=wgpu cargo test --locked -p strata-tests \
    --test elementwise row_and_column -- --test-threads=1
  # Random draws split into pieces: each piece's vectors know their positions (PositionKind::Aligned)
  # and take the counters of their own elements; cat's parts as rows (whole vec4 words at
  # decoded offsets) inside windows.
  STRATA_WGPU_MAX_BINDING=128 STRATA_TEST_DEVICES=wgpu cargo test --locked -p strata-tests \
    --test join_random -- --test-threads=1
  # Histograms whose values and bins span many bindings: a dispatch per piece and bin range.
  STRATA_WGPU_MAX_BINDING=128 STRATA_TEST_DEVICES=wgpu cargo test --locked -p strata-tests \
    --test histogram -- bincount between_edges --test-threads=1
  # Softmax rows in pieces of rows, and rows past a binding through the composition.
  STRATA_WGPU_MAX_BINDING=128 STRATA_TEST_DEVICES=wgpu cargo test --locked -p strata-tests \
    --test reduce softmax_rows_in_pieces -- --test-threads=1
  # Convolutions in pieces of one sample (implicit GEMM), backward filter adding each piece
  # to a partial product that spans several.
  STRATA_WGPU_MAX_BINDING=1536 STRATA_TEST_DEVICES=wgpu cargo test --locked -p strata-tests \
    --test nn_functional one_kernel -- --test-threads=1
  # Every tile of the implicit GEMM (small shapes choose the smallest by themselves).
  for tile in 64x64 128x128 256x64 64x256 256x16 16x256; do
    STRATA_CONV_TILE=$tile STRATA_TEST_DEVICES=wgpu cargo test --locked -p strata-tests \
      --test nn_functional one_kernel -- --test-threads=1
  done
  # Map→reduce fusion where a fused map's inputs exceed one binding: core runs the map first.
  STRATA_WGPU_MAX_BINDING=128 STRATA_TEST_DEVICES=wgpu cargo test --locked -p strata-tests \
    --test fusion reductions_read_pending_trees -- --test-threads=1
  # WebGPU's default of 8 storage buffers a kernel (lavapipe has 32): fusion splits a chain of
  # seven inputs into two kernels, and keeps every kernel within the limit.
  STRATA_WGPU_MAX_BINDINGS=8 STRATA_TEST_DEVICES=wgpu cargo test --locked -p strata-tests \
    --test fusion -- --test-threads=1
  # Six bindings: an AdamW step (three tensors written, four read) no longer fits one kernel,
  # so each new value is computed first and then written (write_values' other path).
  STRATA_WGPU_MAX_BINDINGS=6 STRATA_TEST_DEVICES=wgpu cargo test --locked -p strata-tests \
    --test optim -- --test-threads=1
  # f16 packed into u32 words (the path for adapters without SHADER_F16; lavapipe has it, so
  # the run above stores f16 natively): the every-dtype tests for f16 alone.
  STRATA_WGPU_F16=packed STRATA_TEST_DTYPES=f16 STRATA_TEST_DEVICES=wgpu cargo test --locked -p strata-tests \
    --test elementwise --test index_ops --test matmul --test reduce --test stochastic_round --test histogram -- --test-threads=1
  STRATA_WGPU_F16=packed STRATA_TEST_DEVICES=wgpu cargo test --locked -p strata-tests \
    --test nn_functional conv -- --test-threads=1
fi

# Lazy fusion off (every elementwise op launched at once, as before fusion): the differential
# suite once more, so both modes stay equal to the reference on every backend present.
fusion_off_devices=cpu
if [ -n "${VK_DRIVER_FILES:-}" ] || [ -n "${STRATA_REQUIRE_WGPU:-}" ]; then fusion_off_devices=cpu,wgpu; fi
stage "the differential suite with fusion off ($fusion_off_devices)"
STRATA_FUSION=0 STRATA_TEST_DEVICES=$fusion_off_devices cargo test --locked -p strata-tests -- --test-threads=1

# The Python extension (python/): built with maturin into .venv, then its DLPack tests against
# NumPy on the CPU (and wgpu through a host copy where Vulkan runs). PyTorch and CuPy tests
# skip without a GPU (the GPU machine runs them: `bash scripts/gpu-run.sh python`).
if python3 -m venv --help >/dev/null 2>&1; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/python -c "import maturin, numpy, pytest" 2>/dev/null ||
    .venv/bin/pip install --quiet --disable-pip-version-check "maturin>=1.9,<2" numpy pytest
fi
if [ -x .venv/bin/maturin ] && .venv/bin/python -c "import numpy, pytest" 2>/dev/null; then
  stage "the Python extension"
  VIRTUAL_ENV="$PWD/.venv" .venv/bin/maturin develop --quiet --locked -m python/Cargo.toml
  .venv/bin/python -m pytest -q python/tests
elif [ -n "${STRATA_REQUIRE_PYTHON:-}" ]; then
  echo "the Python extension's tests need python3-venv (for maturin, numpy and pytest in .venv)" >&2
  exit 1
else
  echo "skipping the Python extension's tests: no python3 venv"
fi

# The notebooks: every one in notebooks/ executed through nbclient with the strata kernel, on
# the CPU and (where a Vulkan driver is present) on wgpu. Needs evcxr_jupyter and a .venv with
# nbclient and pytest (.ci/run installs both). The kernel loads the committed HEAD of this
# repository (see jupyter/README.md), so commit before running them.
evcxr_found=""
if command -v evcxr_jupyter >/dev/null 2>&1 || [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/evcxr_jupyter" ]; then
  evcxr_found=1
fi
# Jupyter's client libraries for them, in .venv, whenever evcxr is here (scripts/notebook.sh
# and .ci/run install it): the README's test command runs everything on a newcomer's machine.
if [ -n "$evcxr_found" ] && python3 -m venv --help >/dev/null 2>&1; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/python -c "import jupyter_client, nbclient, nbformat, pytest, PIL" 2>/dev/null ||
    .venv/bin/pip install --quiet --disable-pip-version-check jupyter_client nbclient nbformat pytest pillow
  # A headless browser for the screenshot test, where this machine can install one.
  if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium for the screenshot test (apt-get, about a minute)"
    { apt-get update -qq && apt-get install -y -qq chromium; } >/dev/null 2>&1 ||
      echo "could not install chromium: the screenshot test will be skipped (see the summary)"
  fi
fi
if [ -n "$evcxr_found" ] && [ -x .venv/bin/python ] && .venv/bin/python -c "import nbclient, pytest" 2>/dev/null; then
  export JUPYTER_DATA_DIR="$PWD/target/jupyter"  # a kernelspec of the tests' own
  cargo run --locked --quiet -p strata-jupyter -- install --no-warm
  devices=cpu
  if [ -n "${VK_DRIVER_FILES:-}" ] || [ -n "${STRATA_REQUIRE_WGPU:-}" ]; then devices=cpu,wgpu; fi
  stage "the notebooks ($devices)"
  # -v names each test as it starts: a run stopped by a time limit says which one it was in.
  # -rs: a skipped test says why in the summary (no chromium for the screenshot test, say).
  STRATA_NOTEBOOK_DEVICES=$devices .venv/bin/python -m pytest -v -rs --durations=30 jupyter/tests
elif [ -n "${STRATA_REQUIRE_NOTEBOOKS:-}" ]; then
  echo "notebook tests need evcxr_jupyter and .venv with nbclient and pytest (see .ci/run)" >&2
  exit 1
else
  echo "skipping the notebook tests: evcxr_jupyter or .venv with nbclient/pytest is missing"
fi
stage "done"
