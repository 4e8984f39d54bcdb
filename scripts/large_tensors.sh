#!/usr/bin/env bash
# Tensors past 2^31 elements and 2^32 bytes, end to end, with the command line's peak memory:
#   scripts/large_tensors.sh [--gpu] [DIR]
# Writes three safetensors files into DIR (default /tmp/tz-large; ~12 GB, plus ~8 GB of archives
# and restored files, removed as it goes): a 2.28 GB bf16 tensor (between 2^31 and 2^32 bytes),
# a 4.83 GB bf16 tensor (2.4 G elements) beside a small fp32 one, and a 5.24 GB fp32 tensor. For
# each: `tensorzip compress`, `verify`, `decompress` and a byte comparison with the original, the
# peak resident memory of each command against the issue-2 bound (the file's size + 64 MiB), and
# `tensorzip.load_file` / `get_slice` against safetensors' reader. With --gpu (on the GPU machine,
# after scripts/gpu_build.sh, gpu-bin/ and gpu-py/ carried; `scripts/gpu_run.sh large` runs it),
# also: `gpu_bench file` (GPU-encoded blobs equal to the CPU's, GPU-decoded bytes equal), the
# `--gpu` commands (archive identical to the CPU's) and `load_file(device="cuda")`. Needs ~24 GiB
# of memory; on the 2-core CPU VM it takes ~5 minutes. Not part of the test suite (size, time).
# Exit status non-zero if any check fails; memory above the bound is reported, not failed (the
# GPU commands carry the CUDA driver's and the staging buffers' ~200 MiB, docs/BENCHMARKS.md).
set -uo pipefail
cd "$(dirname "$0")/.."
gpu=0
if [[ ${1:-} == --gpu ]]; then
    gpu=1
    shift
fi
dir=${1:-/tmp/tz-large}
mkdir -p "$dir"
rc=0
if [[ $gpu == 1 ]]; then
    chmod +x gpu-bin/* 2>/dev/null
    export TENSORZIP_CACHE_DIR=${TENSORZIP_CACHE_DIR:-/tmp/tensorzip-cache}
    T=gpu-bin/tensorzip
    site=/tmp/tz-large-site
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" \
        gpu-py/tensorzip-*.whl gpu-py/safetensors-*.whl || exit 1
    export PYTHONPATH=$site
    PY=python3
else
    cargo build --release -q -p tensorzip-cli || exit 1
    T=target/release/tensorzip
    TENSORZIP_NEED_TORCH=1 source scripts/ensure-python.sh
    (cd bindings/python && maturin develop --release --quiet) || exit 1
    "$PY" -c "import safetensors" 2>/dev/null || "$PY" -m pip install -q safetensors || exit 1
fi
echo "== writing the files into $dir"
GPU=$gpu DIR=$dir "$PY" - <<'PY' || exit 1
import json, os, struct, time, torch
dev = "cuda" if os.environ["GPU"] == "1" else "cpu"
d = os.environ["DIR"]
g = torch.Generator(device=dev).manual_seed(3)

def weights(r, c, dtype):
    # The benchmark's synthetic weights (randn * 0.02 * a per-row scale), made 4096 rows at a
    # time so that the CPU never holds more than one fp32 copy of a slab.
    out = torch.empty(r, c, dtype=dtype)
    for i in range(0, r, 4096):
        n = min(4096, r - i)
        s = torch.exp(0.3 * torch.randn(n, 1, device=dev, generator=g))
        out[i:i + n] = (torch.randn(n, c, device=dev, generator=g) * 0.02 * s).to(dtype).cpu()
    return out

def write(name, tensors):
    # Written by hand (header, then the bytes) so that nothing holds a second copy of the data.
    hdr, off = {}, 0
    for k, (dt, x) in tensors.items():
        n = x.numel() * x.element_size()
        hdr[k] = {"dtype": dt, "shape": list(x.shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(d, name), "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, x in tensors.values():
            b = x.view(torch.uint8).reshape(-1).numpy()
            for i in range(0, b.size, 1 << 28):
                f.write(b[i:i + (1 << 28)].tobytes())

t = time.time()
write("bf16-2g.safetensors", {"w": ("BF16", weights(69632, 16384, torch.bfloat16))})
write("bf16-4g.safetensors", {"a": ("F32", torch.randn(1000, generator=g, device=dev).cpu()),
                              "w": ("BF16", weights(147456, 16384, torch.bfloat16))})
write("f32-5g.safetensors", {"w": ("F32", weights(40000, 32768, torch.float32)),
                             "z": ("F32", torch.randn(1000, generator=g, device=dev).cpu())})
print(f"written in {time.time() - t:.1f} s", flush=True)
PY
# Runs a command; prints its wall time and peak resident memory, and fails if it fails.
measure() {
    "$PY" - "$@" <<'PY'
import resource, subprocess, sys, time
t = time.time()
r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(f"{time.time() - t:.2f} s, peak {rss:.0f} MiB", end="")
if r.returncode:
    print(f" FAILED ({r.returncode}): {r.stderr.strip()}")
    sys.exit(1)
PY
}
# `step LABEL CMD...`: one line of the report; a failure sets rc.
step() {
    local label=$1 out
    shift
    out=$(measure "$@") || rc=1
    echo "  $label: $out"
}
for name in bf16-2g bf16-4g f32-5g; do
    f=$dir/$name.safetensors
    mib=$(( $(stat -c %s "$f") >> 20 ))
    echo "== $name: $mib MiB (memory bound $((mib + 64)) MiB)"
    modes=cpu
    [[ $gpu == 1 ]] && modes="cpu gpu"
    for m in $modes; do
        flag=""
        [[ $m == gpu ]] && flag=--gpu
        a=$dir/$name.$m.tz
        step "compress${flag:+ $flag}" $T compress "$f" -o "$a" -f $flag
        step "verify${flag:+ $flag}" $T verify "$a" $flag
        step "decompress${flag:+ $flag}" $T decompress "$a" -o "$dir/back" -f $flag
        cmp "$f" "$dir/back" && echo "  restored file identical" || { echo "  RESTORED FILE DIFFERS"; rc=1; }
        rm -f "$dir/back"
    done
    if [[ $gpu == 1 ]]; then
        cmp "$dir/$name.cpu.tz" "$dir/$name.gpu.tz" && echo "  --gpu archive identical to the CPU's" ||
            { echo "  --gpu ARCHIVE DIFFERS"; rc=1; }
        ./gpu-bin/gpu_bench file "$f" none 2 > "$dir/bench.json" || rc=1
        J=$dir/bench.json "$PY" - <<'PY' || rc=1
import json, os, sys
r = json.loads(open(os.environ["J"]).readline())
ok = r["encode_equal_cpu"]
print(f"  gpu_bench: decode kernel {r['decode_kernel_gbps']:.0f} GB/s, encode "
      f"{r['encode_resident_gbps']:.0f} GB/s, GPU blobs {'equal' if ok else 'DIFFER FROM'} the CPU's")
sys.exit(0 if ok else 1)
PY
    fi
    for dev in cpu $([[ $gpu == 1 ]] && echo cuda); do
        DEV=$dev F=$f A=$dir/$name.cpu.tz "$PY" - <<'PY' || rc=1
import os, sys, torch, tensorzip
from safetensors import safe_open
dev, f, a = os.environ["DEV"], os.environ["F"], os.environ["A"]
got = tensorzip.load_file(a, device=dev)
ok = True
with safe_open(f, "pt") as ref, tensorzip.safe_open(a, "pt", device=dev) as z:
    for k in ref.keys():
        x = ref.get_tensor(k)
        ok &= torch.equal(got[k].view(torch.uint8).cpu(), x.view(torch.uint8))
        if x.dim() == 2:
            ok &= torch.equal(z.get_slice(k)[-7:, 3:].view(torch.uint8).cpu(), x[-7:, 3:].view(torch.uint8))
print(f"  load_file / get_slice on {dev}: {'equal' if ok else 'DIFFERENT'}")
sys.exit(0 if ok else 1)
PY
    done
    rm -f "$dir/$name".* "$dir/bench.json"
done
exit $rc
