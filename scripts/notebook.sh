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
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check jupyterlab jupyter_console jupyter_client

# libwayland (probed by Vulkan drivers) prints an error line into cells without it.
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
  XDG_RUNTIME_DIR="$(mktemp -d)"
  export XDG_RUNTIME_DIR
fi
cargo run --locked --quiet -p strata-jupyter -- install --python .venv/bin/python

args=(--notebook-dir=notebooks)
[ "$(id -u)" = 0 ] && args+=(--allow-root)
exec .venv/bin/jupyter lab "${args[@]}" "$@"
