#!/usr/bin/env bash
# The device call that measured the table search by a cluster per plane before it was merged
# (run 2026-12-07 08:3x on an H100; docs/BENCHMARKS.md, "The table search by a cluster of 4 blocks
# per plane, merged"), kept to repeat such a check for a later search kernel. Set-up on this
# machine, then carry gpu-bin and gpu-ab:
#   scripts/gpu_build.sh bins                         # the binaries under test
#   scripts/gpu_build_old.sh REV                      # gpu-bin/gpu_bench_old: the base to compare with
#   git show ed2bcef:crates/tensorzip-cuda/kernels/search.cu > gpu-ab/search_base.cu
#   cp crates/tensorzip-cuda/kernels/search.cu gpu-ab/search_q.cu
#   scripts/search_trace.py make gpu-ab/trace_q.cu
# then run it from the repository root: the working tree's kernel ("q") against the first cluster
# kernel (ed2bcef's, as a source file) by ncu, the encode against the base binary, a step trace at
# 4 blocks, memcheck and racecheck of the search tests.
set -uo pipefail
cd "$(dirname "$0")/.."
export TENSORZIP_CACHE_DIR=/tmp/tensorzip-cache
chmod +x gpu-bin/* 2>/dev/null
V=$PWD/gpu-ab/search_q.cu
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== unit: search, variant q"
TENSORZIP_DEV_TZ_SEARCH_SRC=$V timeout 120 ./gpu-bin/gpu-unit --include-ignored --test-threads=1 search 2>&1 | grep -E "test result|FAILED|panicked" | head -8
echo "== GPU suite and unit tests (the binaries under test: variant q as embedded)"
scripts/gpu_run.sh tests 2>&1 | grep -E "test result|FAILED|panicked|identical|byte for byte|error" | head -30
echo "== ncu tz_search"
for v in "base 4" "q 4" "q 8"; do
    set -- $v
    if [[ $1 == q ]]; then src=$V; else src=$PWD/gpu-ab/search_base.cu; fi
    echo "$v: $(env ${src:+TENSORZIP_DEV_TZ_SEARCH_SRC=$src} TENSORZIP_DEV_SEARCH_CLUSTER=$2 timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum \
        --print-units base -k regex:tz_search --csv ./gpu-bin/gpu_bench synth bf16 8 2 2>&1 | grep '"tz_search' | awk -F'","' '{print $NF}' | tr -d '"' | tr '\n' ' ')"
done
echo "== A/B encode"
for r in 1; do
    echo "round $r old: $(./gpu-bin/gpu_bench_old synth bf16 8 5 2>&1 | tail -1 | grep -o '"encode_equal_cpu":[a-z]*,"encode_resident_gbps":[0-9.]*')"
    for c in 4 8; do
        echo "round $r q C=$c: $(TENSORZIP_DEV_TZ_SEARCH_SRC=$V TENSORZIP_DEV_SEARCH_CLUSTER=$c ./gpu-bin/gpu_bench synth bf16 8 5 2>&1 | tail -1 | grep -o '"encode_equal_cpu":[a-z]*,"encode_resident_gbps":[0-9.]*')"
    done
done
echo "== trace (variant q, C=4 and C=1)"
for c in 4; do
    TENSORZIP_DEV_TZ_SEARCH_SRC=$PWD/gpu-ab/trace_q.cu TENSORZIP_DEV_SEARCH_CLUSTER=$c timeout 60 ./gpu-bin/gpu_bench synth bf16 8 2 > /tmp/trace$c.txt 2>&1
    echo "C=$c"; python3 scripts/search_trace.py summary /tmp/trace$c.txt 2>&1 | head -40
done
echo "== memcheck + racecheck (variant q, quick cases: as launched and C=3)"
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
TENSORZIP_DEV_TZ_SEARCH_SRC=$V TENSORZIP_TEST_QUICK=1 timeout 70 "$san" --tool memcheck --error-exitcode 3 ./gpu-bin/gpu-unit --include-ignored --test-threads=1 search 2>&1 | grep -E "ERROR SUMMARY|test result|FAILED" | head
TENSORZIP_DEV_TZ_SEARCH_SRC=$V TENSORZIP_TEST_QUICK=1 timeout 280 "$san" --tool racecheck --racecheck-report all --error-exitcode 3 ./gpu-bin/gpu-unit --include-ignored --test-threads=1 gpu_table_search_equals_the_cores 2>&1 | grep -E "RACECHECK SUMMARY|test result|FAILED|hazard" | head
