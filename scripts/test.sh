#!/usr/bin/env bash
# Every test of the project: formatting, lints, and all test suites (unit, integration, property,
# corruption, CLI). CI runs exactly this (.ci/run). GPU tests are skipped with a visible reason on
# machines without CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-rust.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --release -- -D warnings
cargo test --workspace --release
