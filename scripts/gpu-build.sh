#!/usr/bin/env bash
# Builds what the GPU machine runs (it has no Rust toolchain): the release test binaries and
# the CUDA benchmark, stripped, into .gpu/bin (git-ignored; carry it with the device tool).
# Then, there: `bash scripts/gpu-run.sh [tests|sanitize|bench|all]`.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu && mkdir -p .gpu/bin
cargo build --release --example bench_cuda
cp target/release/examples/bench_cuda .gpu/bin/
# One executable per integration-test file of tests/ (cargo prints each path).
cargo test --release -p strata-tests --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])
' | while read -r name exe; do cp "$exe" ".gpu/bin/test-$name"; done
strip .gpu/bin/*
du -sh .gpu/bin
ls .gpu/bin
