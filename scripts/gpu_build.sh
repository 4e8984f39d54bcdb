#!/usr/bin/env bash
# Builds, on this (CPU) machine, what scripts/gpu_run.sh runs on the GPU machine, which has no Rust
# toolchain: the GPU test binary, the GPU benchmark and the CLI, into gpu-bin/ (ignored by git;
# carry it with the device run), then the wheels gpu-py/ and gpu-wheels/ (not with `bins`). The
# kernels themselves are compiled on the device by NVRTC.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p gpu-bin
# The test executable cargo builds for `cargo test --release -p tensorzip-cuda ARGS`, whose target is
# named $1, stripped into gpu-bin/$2 (the release profile keeps debug info: ~6 MiB instead of ~35
# leaves the 64 MiB a device call carries for data, e.g. a model's archive).
test_exe() {
    local target=$1 out=$2
    shift 2
    local exe
    # Compiler errors print as rendered text (the filter below passes them through), cargo's
    # own messages go to stderr: a failed build says why.
    exe=$(cargo test --release -p tensorzip-cuda "$@" --no-run --message-format=json-diagnostic-rendered-ansi |
        TARGET=$target python3 -c 'import json,os,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == os.environ["TARGET"] and m.get("executable"):
        print(m["executable"])
    elif m.get("reason") == "compiler-message" and m["message"].get("level") == "error":
        sys.stderr.write(m["message"].get("rendered") or "")')
    strip -o "gpu-bin/$out" "$exe"
}
test_exe gpu gpu-tests --test gpu
# The engine crate's unit tests, whose GPU ones (the encoder's placement checks) are ignored in CI.
test_exe tensorzip_cuda gpu-unit --lib
cargo build --release -p tensorzip-cuda --example gpu_bench
strip -o gpu-bin/gpu_bench target/release/examples/gpu_bench
cargo build --release -p tensorzip-cli
strip -o gpu-bin/tensorzip target/release/tensorzip
# The format-revision probe, whose PLANES_OUT mode writes what `scripts/gpu_run.sh pairs` times.
cargo build --release -p tensorzip --example pairprobe
strip -o gpu-bin/pairprobe target/release/examples/pairprobe
ls -la gpu-bin
# `scripts/gpu_build.sh bins`: the binaries only (a device call that runs no Python).
[[ ${1:-} == bins ]] && exit 0
# The Python package's abi3 wheel and pytest's wheels, for scripts/gpu_run.sh python.
mkdir -p gpu-py
rm -f gpu-py/tensorzip-*.whl
source scripts/ensure-python.sh
(cd bindings/python && CARGO_TARGET_DIR="$(pwd)/../../target/py" maturin build --release --quiet -o ../../gpu-py)
if ! ls gpu-py/pytest-*.whl >/dev/null 2>&1; then
    "$PY" -m pip download -q --no-deps --only-binary=:all: -d gpu-py pytest pluggy iniconfig packaging pygments ||
        echo "pytest wheels not downloadable: scripts/gpu_run.sh python needs pytest on the device"
fi
# safetensors, the baseline of `scripts/gpu_run.sh load` (the GPU machine has no package index).
if ! ls gpu-py/safetensors-*.whl >/dev/null 2>&1; then
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux2014_x86_64 -d gpu-py safetensors ||
        echo "safetensors wheel not downloadable: scripts/gpu_run.sh load compares with the plain reader only"
fi
ls -la gpu-py
# The anchors' wheels (cuZipNN needs nvCOMP), for scripts/gpu_run.sh bench.
anchors=../shared/anchor-wheels
if [[ -d $anchors ]]; then
    mkdir -p gpu-wheels
    cp "$anchors"/cuzipnn-*.whl "$anchors"/entropack-*.whl "$anchors"/nvidia_libnvcomp_cu13-*.whl gpu-wheels/
fi
# EntroPack's DFloat11 encoder imports dahuffman (pure Python; not among the anchor wheels).
if [[ -d gpu-wheels && ! -f gpu-wheels/dahuffman-0.4.2-py3-none-any.whl ]]; then
    "$PY" -m pip download -q --no-deps -d gpu-wheels dahuffman==0.4.2 ||
        echo "dahuffman not downloadable: the DFloat11 anchor will report its encoder failure"
fi
