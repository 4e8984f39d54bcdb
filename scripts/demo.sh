#!/usr/bin/env bash
# Builds everything (every crate, release, and the Python package's abi3 wheel into dist/) and runs
# the main job: the built-in sample model is written as a .safetensors file, compressed, verified,
# restored and compared byte for byte; ratio and speed are printed. Installs what it needs: a Rust
# toolchain (rustup) and, in .venv, maturin.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-rust.sh
cargo build --release --workspace
source scripts/ensure-python.sh
(cd bindings/python && CARGO_TARGET_DIR="$(pwd)/../../target/py" maturin build --release --quiet -o ../../dist)
cargo run --release --quiet -p tensorzip-cli -- demo
