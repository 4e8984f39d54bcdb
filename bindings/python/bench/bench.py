"""Benchmarks of the Python package (numbers go to docs/BENCHMARKS.md).

    python bench/bench.py cpu [CLI]    # Python API vs the Rust engine alone, 64 MiB tensors, this machine
    python bench/bench.py gpu          # compress_tensor / decompress_tensor on CUDA vs cuZipNN 0.1.0
    python bench/bench.py load [ST...] # a whole file onto the GPU: tensorzip.load_file vs safetensors

cpu: the same tensors (64 MiB bf16 and fp32 of randn * 0.02 * exp(0.3 * randn(rows, 1))) are written
to a .safetensors file and measured by `tensorzip bench` (the Rust engine alone, same options,
median of 3) and by `compress_tensor` / `decompress_tensor(device="cpu")` from Python (median of 3),
in 5 alternating rounds; the ratio reported is the median of the rounds' ratios.

gpu: for bf16 and fp32 tensors of 256 MiB and 1 GiB on the GPU, the same API calls as cuZipNN's
README: `compress_tensor(t)` (CUDA tensor -> CPU blob) and `decompress_tensor(blob, device="cuda")`
(CPU blob -> CUDA tensor), for tensorzip and cuZipNN 0.1.0, median of 5 after a warm-up, with
torch.cuda.synchronize() around each call; plus the blob sizes. One JSON line per measurement and a
table at the end.

load: a model file loaded onto the GPU, `tensorzip.load_file(archive, device="cuda")` against
`safetensors.torch.load_file(file, device="cuda")` (if the package is importable) and a plain
reader (the file mapped, each tensor `torch.frombuffer(...).to("cuda")`), on synthetic 1 GiB bf16
(8 x 8192 x 8192) and fp32 (4 x 8192 x 8192) models and on each safetensors file named (e.g.
all-MiniLM-L6-v2): the archive is written by `tensorzip.save_file`, both files are read once before
timing (page cache warm: this measures the host-to-GPU path, not the disk), every tensor is checked
against the original bits, median of 5 after a warm-up; throughput = original bytes / second.
With TZ_LABEL set, the tensorzip rows carry that label (to compare two builds in one run).
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import warnings

import torch

import tensorzip as tz


SAFETENSORS_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                      "U8": torch.uint8, "BOOL": torch.bool}


def weights(rows: int, cols: int, dtype: torch.dtype, seed: int, device="cpu") -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(rows, cols, generator=g, device=device) * 0.02
    x *= torch.exp(0.3 * torch.randn(rows, 1, generator=g, device=device))
    return x.to(dtype)


def median_time(fn, runs: int = 5, sync: bool = False) -> float:
    fn()
    ts = []
    for _ in range(runs):
        if sync:
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def write_safetensors(path: str, tensors: dict[str, torch.Tensor]) -> None:
    header, off, blobs = {}, 0, []
    st = {v: k for k, v in SAFETENSORS_DTYPES.items()}
    for k, v in tensors.items():
        u = v.contiguous().view(torch.uint8).reshape(-1)
        b = ctypes.string_at(u.data_ptr(), u.numel())
        header[k] = {"dtype": st[v.dtype], "shape": list(v.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    j = json.dumps(header).encode()
    j += b" " * (-len(j) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(j)) + j)
        for b in blobs:
            f.write(b)


def cpu(cli: str, rounds: int = 5) -> None:
    rows = []
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        cols = 8192
        r = (64 << 20) // (cols * torch.tensor([], dtype=dtype).element_size())
        t = weights(r, cols, dtype, 1)
        nbytes = t.numel() * t.element_size()
        kw = {"chunk_bytes": 256 * 1024, "min_compress_bytes": 1024}
        blob = tz.compress_tensor(t, **kw)
        per_round = []
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, f"{name}.safetensors")
            write_safetensors(path, {"w": t})
            # Rounds alternate the two so that the machine's drifts hit both alike.
            for _ in range(rounds):
                out = subprocess.run([cli, "bench", path, "--runs", "3"], check=True, capture_output=True, text=True).stdout
                rust = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
                tc = median_time(lambda: tz.compress_tensor(t, **kw), runs=3)
                td = median_time(lambda: tz.decompress_tensor(blob, device="cpu"), runs=3)
                per_round.append((nbytes / tc / 1e9, rust["compress_gbps"], nbytes / td / 1e9, rust["decompress_e2e_gbps"]))
        med = lambda i: statistics.median(x[i] for x in per_round)
        ratio = lambda i, j: statistics.median(x[i] / x[j] for x in per_round)
        row = {
            "dtype": name, "bytes": nbytes, "ratio": blob.numel() / nbytes, "rounds": rounds,
            "python_compress_gbps": med(0), "rust_compress_gbps": med(1), "compress_python_over_rust": ratio(0, 1),
            "python_decompress_gbps": med(2), "rust_decompress_e2e_gbps": med(3), "decompress_python_over_rust": ratio(2, 3),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    print("| dtype | Python compress GB/s | Rust compress GB/s | Python / Rust | Python decompress GB/s | Rust decompress (fresh output) GB/s | Python / Rust |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['dtype']} | {r['python_compress_gbps']:.3f} | {r['rust_compress_gbps']:.3f} | "
            f"{r['compress_python_over_rust']:.3f} | {r['python_decompress_gbps']:.3f} | "
            f"{r['rust_decompress_e2e_gbps']:.3f} | {r['decompress_python_over_rust']:.3f} |"
        )


def gpu() -> None:
    import cuzipnn

    rows = []
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        for size in (256 << 20, 1 << 30):
            cols = 8192
            r = size // (cols * torch.tensor([], dtype=dtype).element_size())
            t = weights(r, cols, dtype, 2, device="cuda")
            for tool, mod in (("tensorzip", tz), ("cuzipnn 0.1.0", cuzipnn)):
                blob = mod.compress_tensor(t)
                out = mod.decompress_tensor(blob, device="cuda")
                assert torch.equal(out.view(torch.uint8), t.view(torch.uint8)), tool
                del out
                tc = median_time(lambda: mod.compress_tensor(t), sync=True)
                td = median_time(lambda: mod.decompress_tensor(blob, device="cuda"), sync=True)
                row = {"tool": tool, "dtype": name, "bytes": size, "ratio": blob.numel() / size,
                       "compress_gbps": size / tc / 1e9, "decompress_gbps": size / td / 1e9}
                print(json.dumps(row), flush=True)
                rows.append(row)
                del blob
                torch.cuda.empty_cache()
            del t
    print("| dtype | size | tool | ratio | compress_tensor GB/s | decompress_tensor(device=cuda) GB/s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['dtype']} | {r['bytes'] >> 20} MiB | {r['tool']} | {100 * r['ratio']:.2f}% | {r['compress_gbps']:.1f} | {r['decompress_gbps']:.1f} |")
    for i in range(0, len(rows), 2):
        a, b = rows[i], rows[i + 1]
        print(f"{a['dtype']} {a['bytes'] >> 20} MiB: tensorzip / cuZipNN = compress {a['compress_gbps'] / b['compress_gbps']:.2f}x, "
              f"decompress {a['decompress_gbps'] / b['decompress_gbps']:.2f}x, blob {a['ratio'] / b['ratio']:.3f}x")


def safetensors_index(data) -> list[tuple[str, torch.dtype, list[int], int, int]]:
    """The tensors of a safetensors file's bytes (anything sliceable: bytes, a map): name, dtype,
    shape and the byte range in `data`."""
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    return [(k, SAFETENSORS_DTYPES[v["dtype"]], v["shape"], 8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1])
            for k, v in header.items() if k != "__metadata__"]


def read_safetensors(path: str) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, read with the standard library and torch only."""
    with open(path, "rb") as f:
        data = f.read()
    out = {}
    for k, dtype, shape, a, b in safetensors_index(data):
        raw = torch.frombuffer(bytearray(data[a:b]), dtype=torch.uint8) if b > a else torch.empty(0, dtype=torch.uint8)
        out[k] = raw.view(dtype).reshape(shape)
    return out


def plain_load_cuda(path: str) -> dict[str, torch.Tensor]:
    """What a reader without a codec does: the file mapped, each tensor copied to the GPU."""
    import mmap

    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    with warnings.catch_warnings():
        # The map is read-only; nothing here writes to it.
        warnings.simplefilter("ignore", UserWarning)
        buf = torch.frombuffer(mm, dtype=torch.uint8)
    return {k: buf[a:b].view(dtype).reshape(shape).to("cuda") for k, dtype, shape, a, b in safetensors_index(mm)}


def load(files: list[str]) -> None:
    try:
        import safetensors.torch as st
    except ImportError:
        st = None
        print("safetensors not importable: only the plain reader as the baseline", flush=True)
    label = os.environ.get("TZ_LABEL", "tensorzip")
    models = []
    for dtype, name, n in ((torch.bfloat16, "bf16", 8), (torch.float32, "fp32", 4)):
        models.append((f"synthetic {name} {n}x8192x8192",
                       {f"w{i}": weights(8192, 8192, dtype, i + 1) for i in range(n)}))
    for f in files:
        models.append((os.path.basename(f), read_safetensors(f)))
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name, tensors in models:
            size = sum(t.numel() * t.element_size() for t in tensors.values())
            sp, zp = os.path.join(d, "m.safetensors"), os.path.join(d, "m.tz")
            write_safetensors(sp, tensors)
            tz.save_file(tensors, zp)
            for path in (sp, zp):
                with open(path, "rb") as fh:
                    while fh.read(64 << 20):
                        pass
            tools = [(label, lambda: tz.load_file(zp, device="cuda"))]
            if st is not None:
                tools.append(("safetensors", lambda: st.load_file(sp, device="cuda")))
            tools.append(("plain reader", lambda: plain_load_cuda(sp)))
            for tool, fn in tools:
                got = fn()
                for k, t in tensors.items():
                    assert torch.equal(got[k].cpu().view(torch.uint8), t.view(torch.uint8)), (tool, k)
                del got
                t_load = median_time(fn, sync=True)
                row = {"tool": tool, "model": name, "bytes": size, "file_bytes": os.path.getsize(zp if tool == label else sp),
                       "load_gbps": size / t_load / 1e9, "load_ms": t_load * 1e3}
                print(json.dumps(row), flush=True)
                rows.append(row)
                torch.cuda.empty_cache()
            os.remove(sp)
            os.remove(zp)
    print("| model | tool | file / original | load onto the GPU GB/s | ms |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['tool']} | {100 * r['file_bytes'] / r['bytes']:.2f}% | {r['load_gbps']:.2f} | {r['load_ms']:.1f} |")


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "cpu":
        cpu(sys.argv[2] if len(sys.argv) > 2 else "target/release/tensorzip")
    elif what == "gpu":
        gpu()
    elif what == "load":
        load(sys.argv[2:])
    else:
        print(__doc__)
        sys.exit(2)
