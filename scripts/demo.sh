#!/usr/bin/env bash
# Builds every crate (release) and runs the main job: the built-in sample model is written as a
# .safetensors file, compressed, verified, restored and compared byte for byte; ratio and speed are
# printed. Needs a Rust toolchain, which it installs (rustup) if there is none.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-rust.sh
cargo build --release --workspace
cargo run --release --quiet -p tensorzip-cli -- demo
