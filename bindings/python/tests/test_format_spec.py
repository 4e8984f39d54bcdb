"""docs/FORMAT.md is complete: an independent decoder written from it alone
(scripts/spec_decoder.py) reproduces every byte the real encoder writes.

CPU only. Small tensors: the spec decoder is pure Python.
"""

import collections
import importlib.util
import json
import pathlib
import struct
import subprocess
import sys
import zlib

import pytest
import torch

import tensorzip as tz

ROOT = pathlib.Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("spec_decoder", ROOT / "scripts" / "spec_decoder.py")
sd = importlib.util.module_from_spec(_spec)
sys.modules["spec_decoder"] = sd
_spec.loader.exec_module(sd)

DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.uint16, torch.int16, torch.uint32, torch.int32,
    torch.uint64, torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
    torch.complex64,
]
# Section 1's codes, by torch dtype.
CODES = {dt: i for i, dt in enumerate(DTYPES)}

# What the matrix below covered (modes, selectors, ...); checked by the last test of the matrix.
COVERAGE = collections.Counter()


def raw_bytes(t: torch.Tensor) -> bytes:
    t = t.contiguous()
    if t.dtype == torch.complex64:
        t = torch.view_as_real(t)
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def blob_bytes(t: torch.Tensor, **opts) -> bytes:
    return tz.compress_tensor(t, **opts).numpy().tobytes()


def make(dtype, shape, dist, seed):
    g = torch.Generator().manual_seed(seed)
    n = 1
    for d in shape:
        n *= d
    isz = torch.empty((), dtype=dtype).element_size()
    if n == 0:
        return torch.empty(shape, dtype=dtype)
    if dist == "random":  # every bit pattern, NaNs included
        return torch.randint(0, 256, (n * isz,), dtype=torch.uint8, generator=g).view(dtype).reshape(shape)
    if dist == "zero":
        return torch.zeros(shape, dtype=dtype)
    if dist == "const":
        b = torch.randint(0, 256, (isz,), dtype=torch.uint8, generator=g)
        return b.repeat(n).view(dtype).reshape(shape)
    if dist in ("normal", "special", "mixed"):
        if dtype.is_floating_point or dtype.is_complex:
            x = torch.randn(n, generator=g, dtype=torch.float64) * 0.02
            if dist == "special":  # NaN, infinities, signed zeros, subnormals of every width
                vals = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 5e-324, 1e-40, 6e-8, 1e-300]
                idx = torch.randint(0, n, (max(1, n // 4),), generator=g).tolist()
                for j, i in enumerate(idx):
                    x[i] = vals[j % len(vals)]
            if dtype.is_complex:
                t = torch.complex(x.float(), x.flip(0).float())
            else:
                t = x.to(dtype)
        elif dtype == torch.bool:
            t = torch.rand(n, generator=g) < 0.1
        else:
            lo = 0 if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64) else -20
            t = torch.randint(lo, 40, (n,), generator=g).to(dtype)
        if dist == "mixed":  # a third constant, a third random bytes: raw, const and coded blocks
            t = t.clone()
            t[n // 3: 2 * n // 3] = t[0]
            k = n - 2 * n // 3
            t[2 * n // 3:] = torch.randint(0, 256, (k * isz,), dtype=torch.uint8, generator=g).view(dtype)
        return t.reshape(shape)
    raise ValueError(dist)


def check_blob(t: torch.Tensor, **opts) -> bytes:
    blob = blob_bytes(t, **opts)
    code, shape, raw = sd.decode_blob(blob)
    assert code == CODES[t.dtype]
    assert shape == tuple(t.shape)
    assert raw == raw_bytes(t)
    info = sd.parse_blob(blob)
    COVERAGE[("scheme", info.header.scheme)] += 1
    if info.header.scheme == 1:
        for p, pt in enumerate(info.planes):
            if pt.cond_table is not None:
                COVERAGE["conditional table"] += 1
        for c in sd.chunk_summary(blob):
            for mode, _ in c["modes"]:
                COVERAGE[sd.MODE_NAMES[mode]] += 1
            for sel in c["selectors"].values():
                for s in set(sel):
                    COVERAGE["sel255" if s == 255 else "sel254" if s == 254 else "table"] += 1
            COVERAGE["stream" if c["rans_len"] else "no stream"] += 1
    return blob


# --- blobs -----------------------------------------------------------------------------------

SHAPES = [(), (0,), (3, 0), (1,), (33,), (31, 33), (2, 1100)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_shape_and_distribution(dtype):
    for si, shape in enumerate(SHAPES):
        for di, dist in enumerate(["normal", "random", "zero", "const", "special", "mixed"]):
            t = make(dtype, shape, dist, 100 * si + di)
            check_blob(t, min_compress_bytes=0)
            # many chunks and blocks, chunk sizes not a multiple of the lanes or the block
            check_blob(t, min_compress_bytes=0, chunk_bytes=520, block_units=32)


OPTIONS = [
    dict(chunk_bytes=4096),
    dict(chunk_bytes=4096, condition=False),
    dict(chunk_bytes=4096, max_tables=1),
    dict(chunk_bytes=4096, max_tables=64, block_units=64),
    dict(block_units=32),
    dict(block_units=65536),
    dict(passthrough_threshold=0.5),
    dict(passthrough_threshold=0.01),
    dict(passthrough_threshold=1.0),
    dict(min_compress_bytes=1 << 20),  # stored
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16, torch.float64,
                                   torch.complex64, torch.int32, torch.uint8], ids=str)
@pytest.mark.parametrize("dist", ["normal", "mixed", "special"])
def test_encoder_options(dtype, dist):
    isz = torch.empty((), dtype=dtype).element_size()
    # chunk size +-1 unit around 4096 bytes, and a size not a multiple of 32
    for n in (4096 // isz - 1, 4096 // isz + 1, 12289 // isz):
        t = make(dtype, (n,), dist, n)
        for opts in OPTIONS:
            check_blob(t, **{"min_compress_bytes": 0, **opts})


def test_weights_like_a_model():
    # Normal weights * 0.02, large enough for several tables and conditioned planes.
    g = torch.Generator().manual_seed(7)
    w = torch.randn(96, 512, generator=g) * 0.02
    w[:, :7] *= 40  # outlier columns
    for dtype in (torch.bfloat16, torch.float32, torch.float16):
        check_blob(w.to(dtype), min_compress_bytes=0, chunk_bytes=16384, block_units=256)
        check_blob(w.to(dtype), min_compress_bytes=0)


def test_real_model_slices():
    data = ROOT / "bench-data"
    files = sorted(data.glob("minilm-*.safetensors")) if data.is_dir() else []
    if not files:
        pytest.skip("no bench-data/minilm-*.safetensors")
    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I64": torch.int64}
    for f in files:
        with open(f, "rb") as fh:
            (hl,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(hl))
            names = sorted(k for k in header if k != "__metadata__")
            names = names[:4] + [k for k in names if k.endswith("layer.0.attention.self.query.weight")]
            for name in names:
                meta = header[name]
                dt = dtypes[meta["dtype"]]
                a, b = meta["data_offsets"]
                b = min(b, a + 24576)
                b -= (b - a) % torch.empty((), dtype=dt).element_size()
                fh.seek(8 + hl + a)
                t = torch.frombuffer(bytearray(fh.read(b - a)), dtype=dt)
                check_blob(t, min_compress_bytes=0, chunk_bytes=8192, block_units=512)
                check_blob(t, min_compress_bytes=0)


def test_matrix_covered_every_coding():
    # Runs after the tests above (file order): the matrix must have exercised every plane mode,
    # every kind of selector, conditional tables, streams and stored blobs.
    if not COVERAGE:
        pytest.skip("run with the rest of the file")
    for key in [("scheme", 0), ("scheme", 1), "raw", "const", "blocks", "cond", "sel254", "sel255",
                "table", "stream", "no stream", "conditional table"]:
        assert COVERAGE[key] > 0, (key, dict(COVERAGE))


def test_fp16_conditioned_by_the_cli(tmp_path):
    # fp16 conditioning is only reachable through `--condition-fp16` (Python: condition=True is Auto).
    # The low byte is uniform overall (no block table pays), but where the high byte is 0x2C
    # (1/16 of the units) it is below 16, which a conditional table codes in ~4 bits.
    g = torch.Generator().manual_seed(3)
    n = 32768
    hi = torch.randint(0x20, 0x30, (n,), generator=g)
    hi[hi == 0x2C] = 0x2D
    hi[torch.rand(n, generator=g) < 1 / 16] = 0x2C
    lo = torch.where(hi == 0x2C, torch.randint(0, 16, (n,), generator=g),
                     torch.randint(16, 256, (n,), generator=g))
    w = (hi * 256 + lo).to(torch.int16).view(torch.float16)
    src = tmp_path / "h.safetensors"
    hdr = json.dumps({"w": {"dtype": "F16", "shape": [n], "data_offsets": [0, 2 * n]}}).encode()
    original = struct.pack("<Q", len(hdr)) + hdr + raw_bytes(w)
    src.write_bytes(original)
    out = tmp_path / "h.tz"
    subprocess.run([sys.executable, "-m", "tensorzip", "compress", str(src), "-o", str(out),
                    "--condition-fp16"], check=True, capture_output=True)
    data = out.read_bytes()
    assert sd.restore_archive(data) == original
    _, _, entries = sd.parse_archive(data)
    e = entries[1]
    info = sd.parse_blob(data[e.blob_offset:e.blob_offset + e.blob_len])
    assert info.planes[0].cond_table is not None


# --- archives --------------------------------------------------------------------------------

def test_save_file_archive_restores_byte_for_byte(tmp_path):
    g = torch.Generator().manual_seed(11)
    tensors = {
        "w.bf16": (torch.randn(64, 300, generator=g) * 0.02).bfloat16(),
        "w.f32": torch.randn(700, generator=g) * 0.02,
        "ids": torch.arange(1000, dtype=torch.int64),
        "empty": torch.empty(0, 5),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "mask": torch.rand(77, generator=g) < 0.5,
        "f8": torch.randn(500, generator=g).to(torch.float8_e4m3fn),
        "f8b": torch.randn(500, generator=g).to(torch.float8_e5m2),
        "fnuz": torch.randn(300, generator=g).to(torch.float8_e4m3fnuz),
        "c": torch.randn(40, 3, dtype=torch.complex64, generator=g),
        "h": (torch.randn(2000, generator=g) * 0.02).half(),
        "u16": torch.randint(0, 60000, (333,), generator=g).to(torch.uint16),
    }
    path = tmp_path / "a.tz"
    tz.save_file(tensors, path, metadata={"format": "pt", "note": "x" * 40}, min_compress_bytes=0,
                 chunk_bytes=4096)
    data = path.read_bytes()
    restored = sd.restore_archive(data)
    back = tmp_path / "a.safetensors"
    subprocess.run([sys.executable, "-m", "tensorzip", "decompress", str(path), "-o", str(back)],
                   check=True, capture_output=True)
    assert restored == back.read_bytes()
    # and the tensors' bytes are those given
    (hl,) = struct.unpack("<Q", restored[:8])
    header = json.loads(restored[8:8 + hl])
    for name, t in tensors.items():
        a, b = header[name]["data_offsets"]
        assert restored[8 + hl + a:8 + hl + b] == raw_bytes(t), name


def _safetensors(specs, metadata=None, pad=0):
    header = {} if metadata is None else {"__metadata__": metadata}
    body = b""
    for name, dtype, shape, data in specs:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(body), len(body) + len(data)]}
        body += data
    j = json.dumps(header).encode() + b" " * pad
    return struct.pack("<Q", len(j)) + j + body


@pytest.mark.parametrize("args", [
    [],
    ["--checksum-chunk-bytes", "4096"],
    ["--checksum-chunk-bytes", "1"],
    ["--chunk-bytes", "4096", "--block-units", "32", "--max-tables", "16"],
    ["--no-condition", "--min-compress-bytes", "0", "--passthrough-threshold", "0.3"],
    ["--no-pair-exponents"],
    ["--no-condition", "--chunk-bytes", "2048", "--block-units", "64"],
], ids=lambda a: " ".join(a) or "default")
def test_cli_archive_restores_byte_for_byte(tmp_path, args):
    g = torch.Generator().manual_seed(5)
    w = torch.randn(5000, generator=g) * 0.02
    original = _safetensors([
        ("w", "F32", [50, 100], raw_bytes(w)),
        ("b", "BF16", [5000], raw_bytes(w.bfloat16())),
        ("e8", "F8_E8M0", [300], raw_bytes(torch.randint(0, 256, (300,), dtype=torch.uint8, generator=g))),
        ("f4", "F4", [100], bytes(50)),
        ("i", "I32", [4000], raw_bytes(torch.arange(4000, dtype=torch.int32))),
        ("z", "F64", [0], b""),
    ], metadata={"format": "pt", "k": "v"}, pad=13)
    src = tmp_path / "m.safetensors"
    src.write_bytes(original)
    out = tmp_path / "m.tz"
    subprocess.run([sys.executable, "-m", "tensorzip", "compress", str(src), "-o", str(out), *args],
                   check=True, capture_output=True)
    data = out.read_bytes()
    assert sd.restore_archive(data) == original
    _, piece, entries = sd.parse_archive(data)
    want_piece = int(args[args.index("--checksum-chunk-bytes") + 1]) if "--checksum-chunk-bytes" in args else 0
    assert piece == want_piece
    assert entries[0].kind == 0 and all(e.kind == 1 for e in entries[1:])


def test_paired_exponent_blobs_decode_from_the_spec(tmp_path):
    """Version 2 (FORMAT.md section 12): bf16 tensors whose exponents are paired — escapes (rare
    exponents), odd lengths (a last block of odd length), blocks of one exponent (selector 254),
    several chunks, tensors that do not pair (too small, or not paying for their tables) —
    written by the command line (version 2 by default), decoded by the spec decoder to the original
    bytes."""
    g = torch.Generator().manual_seed(11)
    specs = []
    for i, n in enumerate([80_001, 9_999, 65_536, 3]):
        w = torch.randn(n, generator=g) * 0.02 * torch.exp(0.3 * torch.randn(1, generator=g))
        b = w.bfloat16()
        if n > 1000:
            b[::997] *= 1e6         # exponents far from the rest: escaped pairs
            b[1000:1400] = 0.5      # one exponent: a block of constant pairs
        specs.append((f"t{i}", "BF16", [n], raw_bytes(b)))
    original = _safetensors(specs)
    src = tmp_path / "p.safetensors"
    src.write_bytes(original)
    for extra in ([], ["--chunk-bytes", "4096", "--block-units", "64"]):
        out = tmp_path / "p.tz"
        subprocess.run([sys.executable, "-m", "tensorzip", "compress", str(src), "-o", str(out), "-f",
                        *extra], check=True, capture_output=True)
        data = out.read_bytes()
        assert sd.restore_archive(data) == original
        _, _, entries = sd.parse_archive(data)
        versions = [data[e.blob_offset + 4] for e in entries[1:]]
        # The odd-length tensor pairs; the others may not (section 12, step 6: pairing must
        # cost at most 1/32 of the exponent plane).
        assert versions[0] == 2, versions


# --- checksums and corruption ------------------------------------------------------------------

def test_crc32_is_zlibs():
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 256, (5000,), dtype=torch.uint8, generator=g).numpy().tobytes()
    for n in (0, 1, 7, 4096, 5000):
        assert sd.crc32(data[:n]) == zlib.crc32(data[:n])
    assert sd.crc32_pieces(data, 1024) == [zlib.crc32(data[i:i + 1024]) for i in range(0, 5000, 1024)]
    assert sd.crc32_pieces(b"", 16) == []


def test_compress_tensor_with_crc32_pieces():
    t = (torch.randn(20000) * 0.02).bfloat16()
    blob, crcs = tz.compress_tensor_with_crc32(t)
    data = blob.numpy().tobytes()
    assert list(crcs) == sd.crc32_pieces(data, 16384)


def _corrupt_blob_cases():
    t = (torch.randn(3000, generator=torch.Generator().manual_seed(2)) * 0.02).bfloat16()
    blob = blob_bytes(t, min_compress_bytes=0, chunk_bytes=1024, block_units=64)
    stored = blob_bytes(t, min_compress_bytes=1 << 20)
    assert sd.decode_blob(blob)[2] == raw_bytes(t) == sd.decode_blob(stored)[2]
    cases = {}
    for name, off, val in [("magic", 0, 0x55), ("version", 4, 2), ("scheme", 6, 2), ("dtype", 7, 18),
                           ("rank", 8, 65), ("flags", 9, 1), ("reserved", 10, 1), ("chunk_units", 15, 0xFF),
                           ("block_units", 16, 48), ("table K", 28, 65)]:
        b = bytearray(blob)
        b[off] = val
        cases["planes " + name] = bytes(b)
    b = bytearray(stored)
    b[12] = 1
    cases["stored chunk_units"] = bytes(b)
    for cut in (3, 19, 27, 29, len(blob) // 2, len(blob) - 1):
        cases[f"planes truncated at {cut}"] = blob[:cut]
    cases["planes extra byte"] = blob + b"\0"
    cases["stored truncated"] = stored[:-1]
    cases["stored extra byte"] = stored + b"\0"
    return cases


@pytest.mark.parametrize("name,blob", list(_corrupt_blob_cases().items()), ids=lambda x: x if isinstance(x, str) else "")
def test_corrupt_blob_is_rejected(name, blob):
    with pytest.raises(ValueError):
        sd.decode_blob(blob)
    # the real decoder agrees
    with pytest.raises(ValueError):
        tz.decompress_tensor(torch.frombuffer(bytearray(blob), dtype=torch.uint8), device="cpu")


def test_corrupt_archive_is_rejected(tmp_path):
    path = tmp_path / "a.tz"
    tz.save_file({"w": (torch.randn(3000) * 0.02).bfloat16(), "i": torch.arange(50)}, path)
    data = path.read_bytes()
    assert sd.restore_archive(data)
    (index_offset,) = struct.unpack_from("<Q", data, 24)
    for off in (0, 4, 6, 12, 20, 40, index_offset, index_offset + 5, len(data) - 1):
        b = bytearray(data)
        b[off] ^= 0x10
        with pytest.raises(ValueError):
            sd.restore_archive(bytes(b))
    for cut in (10, 31, index_offset, len(data) - 1):
        with pytest.raises(ValueError):
            sd.restore_archive(data[:cut])
    with pytest.raises(ValueError):
        sd.restore_archive(data + b"\0")


def test_spec_decoder_command_line(tmp_path):
    tensors = {"w": (torch.randn(2000) * 0.02).bfloat16(), "i": torch.arange(40, dtype=torch.int32)}
    path = tmp_path / "a.tz"
    tz.save_file(tensors, path, metadata={"k": "v"})
    out = tmp_path / "a.safetensors"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "spec_decoder.py"), str(path), str(out)], check=True)
    back = tmp_path / "b.safetensors"
    subprocess.run([sys.executable, "-m", "tensorzip", "decompress", str(path), "-o", str(back)],
                   check=True, capture_output=True)
    assert out.read_bytes() == back.read_bytes()
    bad = tmp_path / "bad.tz"
    bad.write_bytes(path.read_bytes()[:-1])
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "spec_decoder.py"), str(bad), str(tmp_path / "x")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "error" in r.stderr
