#!/usr/bin/env bash
# Builds every crate (release) and runs the main job: the built-in sample model is written as a
# .safetensors file, compressed, verified, restored and compared byte for byte; ratio and speed are
# printed. Needs only a Rust toolchain (cargo); installs nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace
./target/release/tensorzip demo
