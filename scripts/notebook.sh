#!/usr/bin/env bash
# The main job: JupyterLab on notebooks/ with the strata kernel, on the best device present
# (CUDA, then a hardware wgpu adapter, then the CPU; STRATA_DEVICE=cpu|wgpu|cuda:N chooses).
# Installs JupyterLab into .venv, evcxr_jupyter when missing (about 15 minutes on two cores,
# once), the "Rust (strata)" kernelspec, and warms evcxr's build cache. Extra arguments go to
# `jupyter lab` (for example --ip=0.0.0.0 --no-browser).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! python3 -m venv --help >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq python3-venv
  else
    echo "python3-venv is missing: sudo apt-get install python3-venv" >&2
    exit 1
  fi
fi
# Each step says what it does and roughly how long it takes on two cores (the first time; later
# runs skip what is there), and shows its own progress lines.
step() { echo "== [$(date -u +%H:%M:%S), ${SECONDS} s] $*"; }
[ -x .venv/bin/python ] || python3 -m venv .venv
if ! .venv/bin/python -c "import jupyterlab, jupyter_console, jupyter_client" 2>/dev/null; then
  step "installing JupyterLab into .venv (pip: about 1-2 minutes)"
  .venv/bin/pip install --disable-pip-version-check --progress-bar off \
    jupyterlab jupyter_console jupyter_client
fi

# libwayland (probed by Vulkan drivers) prints an error line into cells without it.
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
  XDG_RUNTIME_DIR="$(mktemp -d)"
  export XDG_RUNTIME_DIR
fi
step "building the kernel installer, strata-jupyter (cargo: about 5 minutes the first time)"
cargo build --locked -p strata-jupyter
step "installing the kernel (evcxr_jupyter: about 15 minutes if missing) and warming it (about 3 minutes the first time)"
cargo run --locked --quiet -p strata-jupyter -- install --python .venv/bin/python
# STRATA_NOTEBOOK_SETUP_ONLY=1 stops here (the notebook tests run the set-up this way).
if [ -n "${STRATA_NOTEBOOK_SETUP_ONLY:-}" ]; then step "set up; not starting JupyterLab"; exit 0; fi
step "starting JupyterLab on notebooks/"

args=(--notebook-dir=notebooks)
[ "$(id -u)" = 0 ] && args+=(--allow-root)
exec .venv/bin/jupyter lab "${args[@]}" "$@"
