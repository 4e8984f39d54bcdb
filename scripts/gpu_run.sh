#!/usr/bin/env bash
# Runs on the GPU machine (after scripts/gpu_build.sh here, with gpu-bin/ carried):
#   scripts/gpu_run.sh tests      GPU tests (CPU blob -> GPU decode bit-exact, corruption)
#   scripts/gpu_run.sh sanitize   the same under compute-sanitizer memcheck (fewer cases)
#   scripts/gpu_run.sh bench      decode throughput, synthetic bf16/fp32 (JSON lines)
#   scripts/gpu_run.sh all        all three
# Kernel cubins are cached in $TENSORZIP_CACHE_DIR (default: under $OUT when set, so one run
# compiles once).
set -uo pipefail
cd "$(dirname "$0")/.."
export TENSORZIP_CACHE_DIR=${TENSORZIP_CACHE_DIR:-/tmp/tensorzip-cache}
what=${1:-all}
rc=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
if [[ $what == tests || $what == all ]]; then
    echo "== GPU tests"
    ./gpu-bin/gpu-tests --include-ignored --test-threads=1 || rc=1
fi
if [[ $what == sanitize || $what == all ]]; then
    echo "== compute-sanitizer memcheck"
    san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    if [[ -n $san ]]; then
        TENSORZIP_TEST_QUICK=1 "$san" --tool memcheck --error-exitcode 3 ./gpu-bin/gpu-tests --include-ignored --test-threads=1 || rc=1
    else
        echo "compute-sanitizer not found"; rc=1
    fi
fi
if [[ $what == bench || $what == all ]]; then
    echo "== decode benchmark"
    for dt in bf16 fp32; do
        ./gpu-bin/gpu_bench synth "$dt" 8 10 || rc=1
        NO_COND=1 ./gpu-bin/gpu_bench synth "$dt" 8 10 || rc=1
    done
fi
exit $rc
