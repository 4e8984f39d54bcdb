#!/usr/bin/env bash
# Builds the GPU benchmark of an earlier commit, for same-call A/B runs on the GPU machine:
#   scripts/gpu_build_old.sh REV [NAME]     -> gpu-bin/NAME (default gpu_bench_old)
# e.g. `scripts/gpu_build_old.sh HEAD` before building the working tree's gpu-bin/ with
# scripts/gpu_build.sh, then `./gpu-bin/gpu_bench_old ...` against `./gpu-bin/gpu_bench ...` (binaries before
# aa4847e write version 1 unless `PAIRS` is set; later ones write version 2 unless `PAIRS=0`:
# pass `PAIRS=0` or `PAIRS=1` to both)
# in one device call (gpu-ab scripts; `scripts/gpu_run.sh v2` picks gpu_bench_old up too).
#
# REV is checked out in a worktree of its own and built into a target directory of its own
# (target/rev-build, kept between runs, so only what changed is rebuilt). Building another
# checkout into the main target directory went wrong on 2026-12-06: a later
# `scripts/gpu_build.sh bins` of the working tree left binaries without its edited kernels (cargo
# took them for fresh), and a whole A/B call compared a binary with itself. The script prints the
# binary's checksum and whether each kernel source of REV differs from the working tree's, so a
# mix-up shows; after scripts/gpu_build.sh, `grep -c SOME_NEW_IDENTIFIER gpu-bin/*` tells which
# binaries hold an edit (the sources are embedded as text).
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: scripts/gpu_build_old.sh REV [NAME]}
name=${2:-gpu_bench_old}
commit=$(git rev-parse --verify "$rev^{commit}")
wt=$(mktemp -d /tmp/tz-rev-XXXXXX)
cleanup() { git worktree remove --force "$wt" 2>/dev/null || rm -rf "$wt"; }
trap cleanup EXIT
git worktree add --detach -q "$wt" "$commit"
CARGO_TARGET_DIR="$PWD/target/rev-build" cargo build --release -p tensorzip-cuda --example gpu_bench \
    --manifest-path "$wt/Cargo.toml"
mkdir -p gpu-bin
strip -o "gpu-bin/$name" target/rev-build/release/examples/gpu_bench
echo "gpu-bin/$name: gpu_bench of $commit ($(md5sum < "gpu-bin/$name" | cut -c1-12))"
for k in encode decode search; do
    f=crates/tensorzip-cuda/kernels/$k.cu
    if git show "$commit:$f" | cmp -s - "$f"; then
        echo "  $f: the same as the working tree's"
    else
        echo "  $f: differs from the working tree's"
    fi
done
