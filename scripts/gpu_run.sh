#!/usr/bin/env bash
# Runs on the GPU machine, after scripts/gpu_build.sh on this one, with gpu-bin/ carried (and, for
# the anchors, gpu-wheels/: the anchor wheels copied by gpu_build.sh):
#   scripts/gpu_run.sh tests      GPU tests (CPU blob -> GPU decode bit-exact, GPU encode == CPU encode,
#                                 CRC-32 == zlib, CPU == GPU on corrupted blobs), the CLI's --gpu on
#                                 a file and on a model directory, and the engine crate's
#                                 unit tests (the encoder's placement refusing forged chunk reports,
#                                 the GPU table search equal to the core's)
#   scripts/gpu_run.sh sanitize   the same under compute-sanitizer memcheck (fewer cases), and the
#                                 GPU table search test under racecheck
#   scripts/gpu_run.sh bench      1 GiB synthetic bf16 and fp32 (made by torch on the GPU): tensorzip
#                                 (and, on bf16, format version 2) and the anchors on the same bytes;
#                                 a markdown table at the end
#   scripts/gpu_run.sh model F    whole-model batch decode of the safetensors file F (and its bf16
#                                 and fp16 casts), or of the tensorzip archive F.tz as it is
#   scripts/gpu_run.sh python     the Python package's tests (GPU ones included), its benchmark
#                                 against cuZipNN and its batch decode (carry gpu-py/, gpu-wheels/)
#   scripts/gpu_run.sh load [F..] whole files loaded onto the GPU: tensorzip.load_file against
#                                 safetensors and a plain reader, synthetic 1 GiB models and the
#                                 safetensors files F (carry gpu-py/)
#   scripts/gpu_run.sh profile [ARGS]
#                                 ncu source counters of one decode launch of `gpu_bench ARGS`
#                                 (default `synth bf16 2 1`: 2048 chunks, the one-warp kernel; with
#                                 PROFILE_KERNEL=tz_encode, one encode launch) and the kernels' SASS
#                                 with source lines, into $OUT (or /tmp/gpu-profile);
#                                 `scripts/ncu_lines.py` on this machine attributes them to source
#   scripts/gpu_run.sh large      tensors past 2^31 elements and 2^32 bytes through the CLI (CPU and
#                                 --gpu, archives compared, peak memory), gpu_bench and load_file
#                                 (carry gpu-py/; scripts/large_tensors.sh --gpu, ~20 GB of /tmp)
#   scripts/gpu_run.sh pairs      a format revision's probe (docs/DESIGN.md, "A measured candidate:
#                                 exponents two units a symbol"): the decode kernel on gpu_bench's
#                                 1 GiB synthetic bf16 and fp32, on their exponent planes alone and
#                                 on their rank planes alone (u8 tensors written by gpu-bin/pairprobe)
#   scripts/gpu_run.sh v2         format version 2 (paired bf16 exponents) on the GPU: the decode tests
#                                 (version 1's too), `verify --gpu` and `decompress --gpu` of an archive
#                                 written by default (version 2), the version 2 tests under memcheck
#                                 (quick mode), then the decode
#                                 kernel alternating version 1 and version 2 blobs of the same
#                                 tensors (gpu_bench, PAIRS=0 / PAIRS=1) on the 1 GiB synthetic bf16 and, where
#                                 carried, bench-data/minilm-bf16.safetensors as a whole model; with
#                                 gpu-bin/gpu_bench_old carried (a build before a decoder change:
#                                 scripts/gpu_build_old.sh REV),
#                                 its figures (its default version) alternate with them; with
#                                 gpu-bin/decode_prev.cu carried (an earlier decode.cu), the same
#                                 binary with that kernel source (TENSORZIP_DEV_TZ_DECODE_SRC) too;
#                                 with V2_NOCOND=1, both versions without the conditioned plane too
#   scripts/gpu_run.sh v2enc      format version 2 written by the GPU: the paired encode test (GPU
#                                 blobs == CPU blobs) with the device's pair model and with the host's
#                                 (TENSORZIP_DEV_HOST_SEARCH=1), under memcheck (quick mode), the CLI's
#                                 `compress --gpu` (version 2) against the CPU's archive, then
#                                 the encoder's speed, version 1 and version 2 alternating, three
#                                 rounds (gpu_bench synth bf16, and bench-data/minilm-bf16 where carried)
#   scripts/gpu_run.sh all        tests, sanitize and bench
# Kernel cubins are cached in $TENSORZIP_CACHE_DIR (default /tmp/tensorzip-cache).
set -uo pipefail
cd "$(dirname "$0")/.."
export TENSORZIP_CACHE_DIR=${TENSORZIP_CACHE_DIR:-/tmp/tensorzip-cache}
what=${1:-all}
rc=0
chmod +x gpu-bin/* 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
if [[ $what == tests || $what == all ]]; then
    echo "== GPU tests"
    ./gpu-bin/gpu-tests --include-ignored --test-threads=1 || rc=1
    ./gpu-bin/gpu-unit --include-ignored --test-threads=1 || rc=1
    # A model directory (two shards, index, config; made here with the standard library).
    md=/tmp/tz-model-dir
    rm -rf "$md" "$md.gpu" "$md.cpu" "$md.back"
    python3 scripts/make_model_dir.py "$md" || rc=1
    # The command line: an archive written by `compress --gpu` equals the CPU's, byte for byte
    # (gpu-data/sample.safetensors where carried, else the directory's first shard).
    sample=gpu-data/sample.safetensors
    [[ -f $sample ]] || sample=$md/model-00001-of-00002.safetensors
    ./gpu-bin/tensorzip compress "$sample" -o /tmp/tz-gpu.tz -f --gpu &&
        ./gpu-bin/tensorzip compress "$sample" -o /tmp/tz-cpu.tz -f &&
        cmp /tmp/tz-gpu.tz /tmp/tz-cpu.tz && ./gpu-bin/tensorzip verify /tmp/tz-gpu.tz --gpu &&
        echo "compress --gpu ($sample): archive identical to the CPU's" || rc=1
    # The same written as format version 1 (the default pairs bf16 exponents: version 2).
    ./gpu-bin/tensorzip compress "$sample" -o /tmp/tz-gpu1.tz -f --gpu --no-pair-exponents &&
        ./gpu-bin/tensorzip compress "$sample" -o /tmp/tz-cpu1.tz -f --no-pair-exponents &&
        cmp /tmp/tz-gpu1.tz /tmp/tz-cpu1.tz && ./gpu-bin/tensorzip verify /tmp/tz-gpu1.tz --gpu &&
        echo "compress --gpu --no-pair-exponents ($sample): archive identical to the CPU's" || rc=1
    # The directory through one GPU engine shared by the command's files: the --gpu mirror
    # equals the CPU's file for file, verifies against the original on the GPU, and
    # decompresses on the GPU to the original.
    [[ -d $md ]] &&
        ./gpu-bin/tensorzip compress "$md" -o "$md.gpu" --gpu &&
        ./gpu-bin/tensorzip compress "$md" -o "$md.cpu" &&
        diff -r "$md.gpu" "$md.cpu" &&
        ./gpu-bin/tensorzip verify "$md.gpu" --against "$md" --gpu &&
        ./gpu-bin/tensorzip decompress "$md.gpu" -o "$md.back" --gpu &&
        diff -r "$md" "$md.back" &&
        echo "model directory --gpu: archives identical to the CPU's, restored byte for byte" || rc=1
fi
if [[ $what == sanitize || $what == all ]]; then
    echo "== compute-sanitizer memcheck"
    san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    if [[ -n $san ]]; then
        TENSORZIP_TEST_QUICK=1 "$san" --tool memcheck --error-exitcode 3 ./gpu-bin/gpu-tests \
            --include-ignored --test-threads=1 gpu_rejects_corrupted gpu_decodes_cpu_blobs gpu_encodes gpu_crc gpu_copies gpu_reads || rc=1
        "$san" --tool memcheck --error-exitcode 3 ./gpu-bin/gpu-unit --include-ignored --test-threads=1 placement search || rc=1
        # The table search's warps share their block's shared memory without a barrier between
        # the trial's candidate and the bank copy (a187e34): racecheck on the GPU search test,
        # its quick case list (the full one takes more than a device call under the tool).
        echo "== compute-sanitizer racecheck (table search)"
        TENSORZIP_TEST_QUICK=1 "$san" --tool racecheck --racecheck-report all --error-exitcode 3 ./gpu-bin/gpu-unit \
            --include-ignored --test-threads=1 gpu_table_search_equals_the_cores || rc=1
    else
        echo "compute-sanitizer not found"; rc=1
    fi
fi
results=${OUT:-/tmp}/gpu-results.jsonl
if [[ $what == bench || $what == all ]]; then
    : >"$results" # this run's rows only (a warm machine's /tmp keeps the last run's)
    echo "== benchmark (results in $results)"
    data=/tmp/tzbench
    python3 scripts/gpu_anchors.py gen "$data" || rc=1
    for f in "$data"/synth-bf16.safetensors "$data"/synth-f32.safetensors; do
        ./gpu-bin/gpu_bench file "$f" none 10 | tee -a "$results" || rc=1
        NO_COND=1 ./gpu-bin/gpu_bench file "$f" none 10 | tee -a "$results" || rc=1
    done
    # Format version 1 (bf16 exponents unpaired, `--no-pair-exponents`; the default pairs them).
    PAIRS=0 ./gpu-bin/gpu_bench file "$data"/synth-bf16.safetensors none 10 | tee -a "$results" || rc=1
    PAIRS=0 NO_COND=1 ./gpu-bin/gpu_bench file "$data"/synth-bf16.safetensors none 10 | tee -a "$results" || rc=1
    if ls gpu-wheels/*.whl >/dev/null 2>&1; then
        # A fresh target each time: pip leaves an existing package in a --target directory as
        # it was (a warm machine would test the last run's wheels).
        rm -rf /tmp/site
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site gpu-wheels/*.whl || rc=1
        PYTHONPATH=/tmp/site python3 scripts/gpu_anchors.py run "$data"/synth-bf16.safetensors \
            "$data"/synth-f32.safetensors | tee -a "$results" || rc=1
    else
        echo "gpu-wheels/ not carried: no anchors"
    fi
fi
if [[ $what == python ]]; then
    echo "== Python package"
    site=/tmp/tz-site
    rm -rf "$site" # see above: pip would keep the last run's package
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" gpu-py/*.whl || rc=1
    if ls gpu-wheels/cuzipnn-*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" \
            gpu-wheels/cuzipnn-*.whl gpu-wheels/nvidia_libnvcomp_cu13-*.whl || rc=1
    fi
    # On this machine a GPU test that skips is a failure (conftest.py: TENSORZIP_REQUIRE_GPU).
    TENSORZIP_REQUIRE_GPU=1 PYTHONPATH=$site python3 -m pytest bindings/python/tests -q -rs -p no:cacheprovider || rc=1
    PYTHONPATH=$site python3 bindings/python/bench/bench.py gpu || rc=1
    PYTHONPATH=$site python3 bindings/python/bench/batch_decode.py || rc=1
fi
if [[ $what == load ]]; then
    echo "== loading whole files onto the GPU"
    site=/tmp/tz-load-site
    rm -rf "$site"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" gpu-py/*.whl || rc=1
    shift
    PYTHONPATH=$site python3 bindings/python/bench/bench.py load "$@" || rc=1
fi
if [[ $what == large ]]; then
    echo "== large tensors"
    scripts/large_tensors.sh --gpu /tmp/tz-large || rc=1
fi
if [[ $what == model ]]; then
    f=$2
    casts="none bf16 f16"
    if [[ $f == *.tz ]]; then
        # A tensorzip archive (small enough to carry, e.g. the MiniLM bf16 cast): restored to its
        # safetensors file by the CPU engine, then measured as it is.
        ./gpu-bin/tensorzip decompress "$f" -o /tmp/gpu-run-model.safetensors -f || rc=1
        f=/tmp/gpu-run-model.safetensors
        casts=none
    fi
    for cast in $casts; do
        ./gpu-bin/gpu_bench file "$f" "$cast" 20 | tee -a "$results" || rc=1
    done
fi
if [[ $what == profile ]]; then
    shift
    args=${*:-synth bf16 2 1}
    out=${OUT:-/tmp/gpu-profile}
    mkdir -p "$out"
    cuda=$(dirname "$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)")
    # The second launch of the kernel (the first one compiles and warms up); replayed per section.
    kernel=${PROFILE_KERNEL:-tz_decode}
    if [[ $kernel == tz_decode* ]]; then export BENCH_DECODE_ONLY=1; else unset BENCH_DECODE_ONLY; fi
    "$cuda/ncu" --clock-control none -k regex:"$kernel" --launch-skip 1 --launch-count 1 \
        --section SourceCounters --section WarpStateStats --section LaunchStats --section Occupancy \
        -o /tmp/gpu-profile-rep -f ./gpu-bin/gpu_bench $args > "$out/ncu.log" 2>&1 || rc=1
    "$cuda/ncu" -i /tmp/gpu-profile-rep.ncu-rep --page source --csv --print-source sass > "$out/sass.csv" || rc=1
    "$cuda/ncu" -i /tmp/gpu-profile-rep.ncu-rep --page details --csv > "$out/details.csv" || rc=1
    # The cubins of this run that hold the profiled kernel's name (cached by source, architecture
    # and driver), disassembled with their line table: NVRTC compiles with -lineinfo. Only those:
    # a device call returns a limited number of files, and all of them (one per compile unit of
    # each source) made it drop some (2026-12-04).
    for c in "$TENSORZIP_CACHE_DIR"/tz_*.cubin; do
        if grep -q "$kernel" "$c"; then
            "$cuda/nvdisasm" -g -c "$c" > "$out/$(basename "$c" .cubin).sass.txt" || rc=1
        fi
    done
    ls -la "$out"
fi
if [[ $what == pairs ]]; then
    echo "== pairs: the decode kernel on whole tensors, their exponent planes, their rank planes"
    for dt in bf16 fp32; do
        d=/tmp/tz-pairs-$dt
        mkdir -p "$d"
        PLANES_OUT=$d ./gpu-bin/pairprobe "synth-$dt" || rc=1
        for f in full exp ranks; do
            echo "-- synthetic $dt, $f"
            BENCH_DECODE_ONLY=1 ./gpu-bin/gpu_bench file "$d/$f.safetensors" none 10 || rc=1
        done
        rm -rf "$d"
    done
fi
if [[ $what == v2 ]]; then
    echo "== format version 2: decode tests (and version 1's, the kernels having changed)"
    ./gpu-bin/gpu-tests --include-ignored --test-threads=1 gpu_decodes gpu_rejects_corrupted gpu_batch || rc=1
    ./gpu-bin/gpu-unit --include-ignored --test-threads=1 plan || rc=1
    # The command line: an archive of paired exponents (written on the CPU) decompressed and
    # verified on the GPU.
    f=bench-data/minilm-bf16.safetensors
    [[ -f $f ]] || f=/tmp/tz-model-dir/model-00001-of-00002.safetensors
    [[ -f $f ]] || python3 scripts/make_model_dir.py /tmp/tz-model-dir
    ./gpu-bin/tensorzip compress "$f" -o /tmp/tz-v2.tz -f &&
        ./gpu-bin/tensorzip verify /tmp/tz-v2.tz --gpu &&
        ./gpu-bin/tensorzip decompress /tmp/tz-v2.tz -o /tmp/tz-v2.safetensors -f --gpu &&
        cmp "$f" /tmp/tz-v2.safetensors &&
        echo "CLI: $f compressed (version 2), verified and decompressed with --gpu: identical" || rc=1
    san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    if [[ -n $san ]]; then
        echo "== format version 2: compute-sanitizer memcheck (quick mode)"
        TENSORZIP_TEST_QUICK=1 "$san" --tool memcheck --error-exitcode 3 ./gpu-bin/gpu-tests \
            --include-ignored --test-threads=1 paired gpu_rejects_corrupted || rc=1
    fi
    echo "== format version 2: decode kernel, version 1 and version 2 blobs alternating (BENCH_DECODE_ONLY)"
    sets=("synth bf16 8 5")
    [[ -f bench-data/minilm-bf16.safetensors ]] && sets+=("file bench-data/minilm-bf16.safetensors none 10")
    # fp32 (version 1 only): the 4-byte kernels were compiled anew with the change.
    [[ -x gpu-bin/gpu_bench_old || -f gpu-bin/decode_prev.cu ]] && sets+=("synth fp32 4 5")
    # Version 1 and (not for fp32) version 2 blobs of `$args`, in round `$r`, labelled `v1$1` and
    # `v2$1`, with the environment `${@:2}`.
    versions() {
        local tag=$1
        shift
        echo "round $r v1$tag $args: $(env "$@" PAIRS=0 BENCH_DECODE_ONLY=1 ./gpu-bin/gpu_bench $args)"
        [[ $args == *fp32* ]] || echo "round $r v2$tag $args: $(env "$@" PAIRS=1 BENCH_DECODE_ONLY=1 ./gpu-bin/gpu_bench $args)"
    }
    for args in "${sets[@]}"; do
        for r in 1 2 3; do
            # The earlier build writes its own default: version 1 before aa4847e, version 2 after
            # (its JSON's `paired_blobs` says which; `PAIRS` meant the opposite before aa4847e).
            [[ -x gpu-bin/gpu_bench_old ]] &&
                echo "round $r old $args: $(BENCH_DECODE_ONLY=1 ./gpu-bin/gpu_bench_old $args)"
            versions ""
            [[ -f gpu-bin/decode_prev.cu ]] && versions -prev-src TENSORZIP_DEV_TZ_DECODE_SRC=gpu-bin/decode_prev.cu
            # With V2_NOCOND=1, both versions written without the conditioned plane too: what
            # conditioning costs each (bf16 sets).
            [[ ${V2_NOCOND:-} == 1 && $args != *fp32* ]] && versions -nocond NO_COND=1
        done
    done
fi
if [[ $what == v2enc ]]; then
    echo "== format version 2 encoded on the GPU: blobs equal to the CPU's (device and host pair model)"
    ./gpu-bin/gpu-tests --include-ignored --test-threads=1 gpu_encodes_the_cpu_engines_bytes_with_paired || rc=1
    TENSORZIP_DEV_HOST_SEARCH=1 TENSORZIP_TEST_QUICK=1 ./gpu-bin/gpu-tests --include-ignored \
        gpu_encodes_the_cpu_engines_bytes_with_paired || rc=1
    ./gpu-bin/gpu-unit pair_outputs || rc=1
    f=bench-data/minilm-bf16.safetensors
    [[ -f $f ]] || f=$(ls /tmp/tz-model/*.safetensors 2>/dev/null | head -1)
    if [[ -n $f ]]; then
        ./gpu-bin/tensorzip compress "$f" -o /tmp/tz-g2.tz -f --gpu &&
            ./gpu-bin/tensorzip compress "$f" -o /tmp/tz-c2.tz -f &&
            cmp /tmp/tz-g2.tz /tmp/tz-c2.tz && ./gpu-bin/tensorzip verify /tmp/tz-g2.tz --gpu &&
            echo "CLI: $f compress --gpu (version 2): archive identical to the CPU's" || rc=1
    fi
    san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    if [[ -n $san ]]; then
        echo "== compute-sanitizer memcheck (quick mode): the paired encode test"
        TENSORZIP_TEST_QUICK=1 "$san" --tool memcheck --error-exitcode 3 ./gpu-bin/gpu-tests \
            --include-ignored --test-threads=1 gpu_encodes_the_cpu_engines_bytes_with_paired || rc=1
    fi
    echo "== encode, version 1 and version 2 alternating (device-resident GB/s; blobs equal to the CPU's)"
    sets=("synth bf16 8 5")
    [[ -f bench-data/minilm-bf16.safetensors ]] && sets+=("file bench-data/minilm-bf16.safetensors none 10")
    pick='import sys,json; d=json.loads(sys.stdin.read().splitlines()[-1]); print(round(d["encode_resident_gbps"],1), "equal" if d["encode_equal_cpu"] else "DIFFERENT", "ratio", round(d["ratio"],5))'
    for args in "${sets[@]}"; do
        for r in 1 2 3; do
            echo "round $r v1 $args: $(PAIRS=0 ./gpu-bin/gpu_bench $args | python3 -c "$pick")"
            echo "round $r v2 $args: $(PAIRS=1 ./gpu-bin/gpu_bench $args | python3 -c "$pick")"
        done
    done
fi
[[ -f $results ]] && python3 scripts/gpu_anchors.py table "$results"
exit $rc
