#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit/property/doc tests on every backend present.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
