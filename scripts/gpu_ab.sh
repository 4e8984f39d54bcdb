#!/usr/bin/env bash
# A/B timing of decoder (or, with AB_ENCODER=1, encoder) kernel variants on the GPU machine, with the binaries of gpu-bin/ (built by
# scripts/gpu_build.sh) and the kernel sources given as files (the built-in one is `builtin`):
#   scripts/gpu_ab.sh ROUNDS "BENCH ARGS" builtin /path/to/variant.cu ...
# e.g. scripts/gpu_ab.sh 3 "synth bf16 8 5" builtin gpu-ab/decode.cu
# A variant `env:NAME=VALUE` runs the built-in kernels with that environment variable set (a
# development switch of the host side, e.g. env:TENSORZIP_DEV_DECODE_LAYOUT=one or
# env:TENSORZIP_DEV_ENC_BLOCK=225280,11).
# Variants alternate within each round (the machine is shared: compare within a round). Every run
# also checks that the decoded bytes equal the original (gpu_bench asserts it). A variant file is
# compiled with kernels/smem.cuh in front, as the built-in source is: it must not define those
# accessors itself (copies of decode.cu from before commit 167574c do). The engine compiles a source
# in units (one per unit size and transform, `-DTZ_UNIT=k`); a copy from before f9cefc7, without
# the TZ_UNIT guards, compiles all its kernels in every unit: slower to build, the same kernels.
set -uo pipefail
cd "$(dirname "$0")/.."
export TENSORZIP_CACHE_DIR=${TENSORZIP_CACHE_DIR:-/tmp/tensorzip-cache}
chmod +x gpu-bin/* 2>/dev/null
rounds=$1
args=$2
rc=0
shift 2
for ((r = 1; r <= rounds; r++)); do
    for v in "$@"; do
        if [[ $v == builtin ]]; then
            line=$(./gpu-bin/gpu_bench $args)
        elif [[ $v == env:* ]]; then
            line=$(env "${v#env:}" ./gpu-bin/gpu_bench $args)
        else
            if [[ ${AB_ENCODER:-0} == 1 ]]; then
                line=$(TENSORZIP_DEV_TZ_ENCODE_SRC=$v ./gpu-bin/gpu_bench $args)
            else
                line=$(TENSORZIP_DEV_TZ_DECODE_SRC=$v ./gpu-bin/gpu_bench $args)
            fi
        fi
        [[ -n $line ]] || { line="FAILED (see stderr)"; rc=1; }
        echo "round $r variant $v: $line"
    done
done
exit $rc
