#!/usr/bin/env bash
# Every test of the project: formatting, lints, and all test suites (unit, integration, property,
# corruption, CLI; the Python package's pytest suite with real torch; the CUDA kernels compiled). CI runs exactly this
# (.ci/run). GPU tests are skipped with a visible reason on machines without CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-rust.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --release -- -D warnings
# The libraries' documentation builds without warnings (broken or private intra-doc links).
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -p tensorzip -p tensorzip-cuda
# The crates and the command line compile without warnings for macOS (Unix, not Linux) and Windows
# (not Unix) too: Linux-only paths (madvise, the SIGBUS guard, /proc) must stay behind their cfgs.
# A check only (no linker for those targets here); skipped where rustup cannot add the targets.
for target in x86_64-apple-darwin x86_64-pc-windows-msvc; do
    if rustup target add "$target" >/dev/null 2>&1; then
        cargo clippy --target "$target" -p tensorzip -p tensorzip-cli -p tensorzip-cuda --all-targets -- -D warnings
    else
        echo "SKIPPED: cross-target check for $target (rustup could not add it)"
    fi
done
cargo test --workspace --release
# The fuzz targets and their seed generator live in their own workspace (fuzzing itself needs
# nightly and cargo-fuzz: docs/FUZZING.md); they must keep compiling against the library (the seed
# generator once stopped compiling unnoticed), formatted and lint-free as the workspace is (a lint
# in `roundtrip` went unseen until 2026-12-07). libfuzzer-sys builds libFuzzer, which needs a C++
# compiler.
if command -v c++ >/dev/null 2>&1; then
    cargo fmt --manifest-path fuzz/Cargo.toml -- --check
    cargo clippy --manifest-path fuzz/Cargo.toml --all-targets -- -D warnings
    # And the seed generator must run: its assertions (each seed of the kind it claims, the paired
    # ones version 2) failed unnoticed from the pair model change of 2026-12-06 09:xx to 22:2x.
    seeds=$(mktemp -d)
    cargo run --quiet --manifest-path fuzz/Cargo.toml --example seeds -- "$seeds"
    rm -rf "$seeds"
else
    echo "SKIPPED: compile check of fuzz/ (no C++ compiler for libfuzzer-sys)"
fi
# The Python package: its own cargo workspace (an extension module), built into .venv by maturin.
TENSORZIP_NEED_TORCH=1 source scripts/ensure-python.sh
export CARGO_TARGET_DIR="$(pwd)/target/py"
cargo fmt --manifest-path bindings/python/Cargo.toml -- --check
cargo clippy --manifest-path bindings/python/Cargo.toml --release -- -D warnings
(cd bindings/python && maturin develop --release --quiet)
# The CLI (target/release/tensorzip, built above) takes part in the file-format tests.
(cd bindings/python && "$PY" -m pytest tests -q -rs)
# The torch layer's annotations agree with the code (mypy, default strictness).
"$PY" -m pip install -q "mypy>=2.4,<2.5"
"$PY" -m mypy --ignore-missing-imports bindings/python/py_src/tensorzip
# The CUDA kernels compile: every unit of every .cu source, for sm_90, with NVRTC as the engine
# compiles them at run time (no GPU needed; NVRTC from its PyPI wheel). CI has no GPU, so this is
# the only place a kernel that no longer compiles is caught before a device run.
"$PY" -m pip install -q "nvidia-cuda-nvrtc==13.*"
"$PY" scripts/nvrtc_check.py
# The table search's clock64 trace (scripts/search_trace.py, a development tool) still finds its
# anchors in search.cu, and its timed copy compiles.
trace_cu=$(mktemp --suffix=.cu)
"$PY" scripts/search_trace.py make "$trace_cu"
"$PY" scripts/nvrtc_check.py "$trace_cu"
rm -f "$trace_cu"
