#!/usr/bin/env bash
# Side-by-side CPU benchmark of tensorzip against ZipNN 0.5.4 (same run, same tensors).
#
#   scripts/bench_cpu.sh [--runs N] [--threads 1,all] [--datasets minilm-f32,...]
#
# Sets up .venv (numpy, zipnn==0.5.4) if missing, fetches/prepares bench-data/ if missing (a dataset
# that needs the network is skipped with a message when there is none), builds tensorzip in release
# and runs scripts/bench_cpu.py. Needs python3 (with venv and pip) and cargo. Arguments go to
# `bench_cpu.py run`. CARGO_TARGET_DIR is honoured (default: target/).
#
# Note: zipnn 0.5.4 depends on torch, so the first venv setup downloads several GB.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
COMMAND="scripts/bench_cpu.sh${*:+ $*}"
[ -n "${CARGO_TARGET_DIR:-}" ] && COMMAND="CARGO_TARGET_DIR=$CARGO_TARGET_DIR $COMMAND"

VENV="$ROOT/.venv"
PY="$VENV/bin/python"
if [ ! -x "$PY" ] || ! "$PY" -c 'import numpy, zipnn' >/dev/null 2>&1; then
    echo "[setup] creating $VENV with numpy and zipnn==0.5.4 (zipnn pulls in torch: large download)"
    [ -x "$PY" ] || python3 -m venv "$VENV"
    if ! "$PY" -m pip install --disable-pip-version-check -q numpy zipnn==0.5.4; then
        # No index reachable: try the source archive kept in shared/ (needs a C compiler; torch,
        # safetensors and numpy must then be installable from somewhere too).
        SDIST="$ROOT/shared/anchor-wheels/zipnn-0.5.4.tar.gz"
        [ -f "$SDIST" ] || SDIST="$ROOT/../shared/anchor-wheels/zipnn-0.5.4.tar.gz"
        if [ -f "$SDIST" ]; then
            "$PY" -m pip install --disable-pip-version-check -q numpy "$SDIST"
        else
            echo "[setup] could not install zipnn==0.5.4" >&2
            exit 1
        fi
    fi
fi
"$PY" -c 'import zipnn, numpy' 2>/dev/null || { echo "[setup] zipnn import failed" >&2; exit 1; }

"$PY" scripts/bench_cpu.py prepare

TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
echo "[build] cargo build --release -p tensorzip-cli (target dir: $TARGET)"
CARGO_TARGET_DIR="$TARGET" cargo build --release -p tensorzip-cli

BENCH_CPU_COMMAND="$COMMAND" exec "$PY" scripts/bench_cpu.py run --tensorzip "$TARGET/release/tensorzip" "$@"
