"""The Python package on the CPU: cuZipNN's API, EntroPack's API, files, hostile input."""

import io
import json
import os
import struct
import subprocess
import sys
import time
import warnings
import zlib
from pathlib import Path

import pytest
import torch

import tensorzip as tz
from tensorzip import _core
from tensorzip import _tensorzip as _native

DTYPES = list(_core.SUPPORTED_DTYPES)
SHAPES = [(), (0,), (1,), (7,), (33, 5), (3, 0, 2), (257, 129), (2, 3, 5, 7)]


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-exact equality (NaNs included), dtype and shape."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(_core.as_bytes(a), _core.as_bytes(b))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip_every_dtype_and_shape(dtype, shape, gen):
    t = gen(dtype, shape, 1)
    for kw in ({}, {"min_compress_bytes": 0, "chunk_bytes": 1024}, {"min_compress_bytes": 0, "condition": False}):
        blob = tz.compress_tensor(t, **kw)
        assert blob.dtype == torch.uint8 and blob.dim() == 1 and blob.device.type == "cpu"
        out = tz.decompress_tensor(blob, device="cpu")
        assert same(out, t), (dtype, shape, kw)


def test_paired_exponents_by_default(gen, tmp_path):
    """bf16 weights are written as format version 2 by default (the blob's version field) and
    decode bit-exactly; `pair_exponents=False` writes version 1; `save_file` and `compress_file`
    write the same archive for the same option; other dtypes stay version 1 either way."""
    w = gen(torch.bfloat16, (512, 384), 4)
    v2 = tz.compress_tensor(w)
    v1 = tz.compress_tensor(w, pair_exponents=False)
    assert bytes(v1[4:6]) == b"\x01\x00" and bytes(v2[4:6]) == b"\x02\x00"
    assert torch.equal(v2, tz.compress_tensor(w, pair_exponents=True))
    assert same(tz.decompress_tensor(v2, device="cpu"), w)
    assert same(tz.decompress_tensor(v1, device="cpu"), w)
    f = gen(torch.float32, (512, 384), 5)
    assert bytes(tz.compress_tensor(f)[4:6]) == b"\x01\x00"
    plain = tmp_path / "plain.safetensors"
    for name, kw in (("v2", {}), ("v1", {"pair_exponents": False})):
        tz.save_file({"w": w, "f": f}, tmp_path / f"{name}-a.tz", **kw)
        back = tz.load_file(tmp_path / f"{name}-a.tz")
        assert same(back["w"], w) and same(back["f"], f)
        tz.decompress_file(tmp_path / f"{name}-a.tz", plain, overwrite=True)
        tz.compress_file(plain, tmp_path / f"{name}-b.tz", **kw)
        assert (tmp_path / f"{name}-b.tz").read_bytes() == (tmp_path / f"{name}-a.tz").read_bytes()
    assert (tmp_path / "v1-a.tz").read_bytes() != (tmp_path / "v2-a.tz").read_bytes()


def test_special_values_round_trip():
    vals = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-45, -1e-40, 3.4e38] * 5000)
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        t = vals.to(dtype)
        out = tz.decompress_tensor(tz.compress_tensor(t, min_compress_bytes=0), device="cpu")
        assert same(out, t)


def test_non_contiguous_and_offset_inputs(gen):
    t = gen(torch.float32, (300, 200), 2)
    for view in (t.t(), t[::3, 1::2], t[5:], t.as_strided((100, 100), (1, 300), 7)):
        out = tz.decompress_tensor(tz.compress_tensor(view, min_compress_bytes=0), device="cpu")
        assert same(out, view.contiguous())
    # A tensor whose data starts at an odd byte address.
    raw = torch.empty(4 * 5000 + 1, dtype=torch.uint8)[1:]
    raw.copy_(_core.as_bytes(gen(torch.float32, (5000,), 3)))
    blob = tz.compress_tensor(raw, min_compress_bytes=0)
    assert same(tz.decompress_tensor(blob, device="cpu"), raw)


def test_defaults_and_keywords_match_cuzipnn():
    import inspect

    sig = inspect.signature(tz.compress_tensor)
    want = {"chunk_bytes": 131072, "sub_chunk_bytes": 8192, "passthrough_threshold": 0.95, "min_compress_bytes": 65536, "pin_memory": False}
    for k, v in want.items():
        assert sig.parameters[k].default == v
        assert sig.parameters[k].kind == inspect.Parameter.KEYWORD_ONLY
    assert inspect.signature(tz.hash_tensor_with_crc32).parameters["checksum_chunk_bytes"].default == 16384
    assert inspect.signature(tz.compress_tensor_with_crc32).parameters["checksum_chunk_bytes"].default == 16384
    assert inspect.signature(tz.decompress_tensor).parameters["device"].default is None
    with pytest.raises(TypeError):
        tz.compress_tensor(torch.zeros(3), 131072)  # keyword-only


def test_small_tensors_are_stored():
    t = torch.arange(100, dtype=torch.float32)
    assert tz.blob_info(tz.compress_tensor(t))[0] == "stored"  # below min_compress_bytes
    assert tz.blob_info(tz.compress_tensor(t, min_compress_bytes=0))[0] in ("stored", "planes")


def test_crc32_equals_zlib(gen):
    t = gen(torch.bfloat16, (700, 300), 4)
    for piece in (1, 100, 16384, 1 << 20):
        blob, crc = tz.compress_tensor_with_crc32(t, checksum_chunk_bytes=piece, min_compress_bytes=0)
        assert crc.dtype == torch.uint32 and crc.device.type == "cpu"
        data = bytes(blob.numpy()) if hasattr(blob, "numpy") and _has_numpy() else _bytes(blob)
        want = [zlib.crc32(data[i : i + piece]) for i in range(0, len(data), piece)]
        assert [int(x) for x in crc.to(torch.int64)] == want
        assert torch.equal(tz.hash_tensor_with_crc32(blob, checksum_chunk_bytes=piece).to(torch.int64), crc.to(torch.int64))
        assert torch.equal(blob, tz.compress_tensor(t, min_compress_bytes=0))
    assert tz.hash_tensor_with_crc32(torch.empty(0)).numel() == 0
    for bad in (0, -1, 1 << 63, 1 << 64):
        for f in (tz.hash_tensor_with_crc32, tz.compress_tensor_with_crc32):
            with pytest.raises(ValueError, match="checksum_chunk_bytes"):
                f(t, checksum_chunk_bytes=bad)
    with pytest.raises(TypeError, match="checksum_chunk_bytes"):
        tz.compress_tensor_with_crc32(t, checksum_chunk_bytes=None)


def _has_numpy() -> bool:
    try:
        import numpy  # noqa: F401

        return True
    except ImportError:
        return False


def _bytes(t: torch.Tensor) -> bytes:
    import ctypes

    t = _core.as_bytes(t)
    return ctypes.string_at(t.data_ptr(), t.numel()) if t.numel() else b""


@pytest.mark.parametrize(
    "kw, exc, field",
    [
        ({"chunk_bytes": 100}, ValueError, "chunk_bytes"),
        ({"chunk_bytes": 0}, ValueError, "chunk_bytes"),
        ({"chunk_bytes": "8"}, TypeError, "chunk_bytes"),
        ({"passthrough_threshold": 0}, ValueError, "passthrough_threshold"),
        ({"passthrough_threshold": 1.5}, ValueError, "passthrough_threshold"),
        ({"min_compress_bytes": -1}, ValueError, "min_compress_bytes"),
        ({"sub_chunk_bytes": 0}, ValueError, "sub_chunk_bytes"),
        ({"block_units": 100}, ValueError, "block_units"),
        ({"max_tables": 0}, ValueError, "max_tables"),
        ({"condition": 1}, TypeError, "condition"),
        ({"pair_exponents": "yes"}, TypeError, "pair_exponents"),
    ],
)
def test_invalid_options_name_the_field(kw, exc, field):
    with pytest.raises(exc, match=field):
        tz.compress_tensor(torch.zeros(10), **kw)


def test_unsupported_inputs():
    with pytest.raises(TypeError, match="dtype"):
        tz.compress_tensor(torch.zeros(3, dtype=torch.complex128))
    with pytest.raises(TypeError):
        tz.compress_tensor([1, 2, 3])
    with pytest.raises(ValueError, match="1-D uint8"):
        tz.decompress_tensor(torch.zeros(3))


def test_decompress_tensors_on_the_cpu(gen):
    """The batch form decodes every blob of a list, in order, whatever its dtype and shape (0-d
    and empty included); an empty list gives []; a bad blob raises ValueError naming its index,
    a non-blob TypeError or ValueError as `decompress_tensor` does."""
    ts = [gen(dtype, shape, 10 + i) for i, (dtype, shape) in enumerate((d, s) for d in DTYPES for s in SHAPES)]
    blobs = [tz.compress_tensor(t, min_compress_bytes=0, chunk_bytes=4096) for t in ts]
    outs = tz.decompress_tensors(blobs, device="cpu")
    assert len(outs) == len(ts)
    for i, (o, t) in enumerate(zip(outs, ts)):
        assert o.device.type == "cpu" and same(o, t), i
    assert tz.decompress_tensors(tuple(blobs[:3]), device="cpu")[2].shape == ts[2].shape
    assert tz.decompress_tensors([], device="cpu") == []
    if not torch.cuda.is_available():
        assert all(same(o, t) for o, t in zip(tz.decompress_tensors(blobs[:5]), ts[:5]))
    bad = list(blobs[:4])
    bad[2] = bad[2][: bad[2].numel() // 2]
    with pytest.raises(ValueError, match="blob 2"):
        tz.decompress_tensors(bad, device="cpu")
    with pytest.raises(TypeError, match="sequence"):
        tz.decompress_tensors(blobs[0], device="cpu")
    with pytest.raises(ValueError, match="1-D uint8"):
        tz.decompress_tensors([blobs[0], torch.zeros(3)], device="cpu")
    with pytest.raises(TypeError):
        tz.decompress_tensors([blobs[0], b"not a tensor"], device="cpu")
    # Damage past the prefix, found while decoding (blobs decode concurrently): the error names
    # the damaged blob, whichever of the others decoded.
    w = gen(torch.bfloat16, (256, 1024), 9)
    good = tz.compress_tensor(w, chunk_bytes=16384)
    g = torch.Generator().manual_seed(1)
    named = 0
    for _ in range(40):
        d = good.clone()
        for _ in range(8):
            d[int(torch.randint(d.numel() // 2, d.numel(), (1,), generator=g))] ^= 0xFF
        try:
            out = tz.decompress_tensors([good, d, good], device="cpu")
            assert same(out[0], w) and same(out[2], w) and out[1].shape == w.shape
        except ValueError as e:
            assert str(e).startswith("blob 1: "), e
            named += 1
    assert named > 0
    # Outputs that overlap are refused by the native call before anything is written.
    o = torch.empty(w.numel() * 2, dtype=torch.uint8)
    job = (good.data_ptr(), good.numel(), o.data_ptr(), w.numel() * 2)
    with pytest.raises(ValueError, match="overlap"):
        _native.decompress_batch_into([job, (job[0], job[1], o.data_ptr() + 8, job[3] - 8)])


def test_prefix_len_asks_for_the_prefix_not_the_blob(gen):
    """What a reader of a GPU blob copies to the host (`_host_prefix`'s loop over `prefix_len`):
    from any first read, the exact header + tables + directory, never the payloads, also where
    the directory alone passes 64 KiB; junk raises ValueError."""
    t = gen(torch.bfloat16, (2048, 2048), 3)
    blob = tz.compress_tensor(t, chunk_bytes=1024)  # 8192 chunks: a directory past 64 KiB
    data = bytes(_bytes(blob))
    n = len(data)
    whole = _native.prefix_len(data, n)
    assert 1 << 16 < whole < n // 4
    for first in (0, 1, 27, 100, 4096, 1 << 16, whole - 1, whole, whole + 10):
        head = data[:first]
        need = _native.prefix_len(head, n)
        reads = 0
        while need > len(head):
            assert need < n // 2, (first, need)
            head = data[:need]
            need = _native.prefix_len(head, n)
            reads += 1
        assert need == whole and reads <= 3, (first, need, reads)
    for junk in (b"PK\x03\x04" * 100, bytes(range(256))):
        with pytest.raises(ValueError):
            _native.prefix_len(junk, len(junk) + 1000)


def test_hostile_blobs_raise_value_error(gen):
    t = gen(torch.bfloat16, (64, 1000), 5)
    blob = tz.compress_tensor(t, min_compress_bytes=0, chunk_bytes=4096)
    data = bytearray(_bytes(blob))
    # Not ours at all.
    for junk in (b"", b"TZ", b"PK\x03\x04" * 100, bytes(range(256)) * 10):
        with pytest.raises(ValueError):
            tz.decompress_tensor(torch.frombuffer(bytearray(junk) or bytearray(1), dtype=torch.uint8)[: len(junk)], device="cpu")
    # Every truncation of the prefix and a sample of the rest.
    for cut in list(range(0, 200)) + list(range(200, len(data), 997)):
        with pytest.raises(ValueError):
            tz.decompress_tensor(torch.frombuffer(bytearray(data[:cut]) or bytearray(1), dtype=torch.uint8)[:cut], device="cpu")
    # Bit flips: an error, or (where only a checksum could tell) some tensor of the right shape.
    g = torch.Generator().manual_seed(0)
    errors = 0
    for _ in range(300):
        d = bytearray(data)
        for _ in range(3):
            i = int(torch.randint(0, len(d), (1,), generator=g))
            d[i] ^= 1 << int(torch.randint(0, 8, (1,), generator=g))
        try:
            out = tz.decompress_tensor(torch.frombuffer(d, dtype=torch.uint8), device="cpu")
            assert out.numel() * out.element_size() < 1 << 40
        except ValueError:
            errors += 1
    assert errors > 100
    # An unknown version is refused by name.
    d = bytearray(data)
    d[4:6] = struct.pack("<H", 9)
    with pytest.raises(ValueError, match="version"):
        tz.decompress_tensor(torch.frombuffer(d, dtype=torch.uint8), device="cpu")


def test_blob_over_rust_bytes_is_writable_in_place(gen):
    """compress_tensor's blob is a tensor over bytes Rust allocated: writing into it must work and
    be seen by the decoder (a header byte broken in place is refused, restored it decodes)."""
    t = gen(torch.bfloat16, (64, 300), 7)
    blob = tz.compress_tensor(t, min_compress_bytes=0, chunk_bytes=4096)
    keep = blob.clone()
    blob[0:4] = 0  # the magic
    with pytest.raises(ValueError):
        tz.decompress_tensor(blob, device="cpu")
    blob.copy_(keep)
    assert same(tz.decompress_tensor(blob, device="cpu"), t)
    blob.zero_()
    assert int(blob.sum()) == 0 and int(keep.sum()) != 0


def test_tensors_without_host_memory_are_refused(gen):
    """Tensors whose bytes are not host memory tensorzip can read — on the meta device, a
    subclass without storage (data pointer 0), quantized, nested — are refused with an error
    naming the problem, through every entry point (they were read at address 0: a segfault)."""
    t = gen(torch.float32, (16, 8), 3)
    blob = tz.compress_tensor(t)
    meta_blob = blob.to("meta")
    for call in (
        lambda: tz.decompress_tensor(meta_blob, device="cpu"),
        lambda: tz.decompress_tensor(meta_blob),
        lambda: tz.blob_info(meta_blob),
        lambda: tz.compress_tensor(t.to("meta")),
        lambda: tz.hash_tensor_with_crc32(t.to("meta")),
        lambda: tz.compress(t.to("meta"), tz.TensorZipConfig()),
        lambda: tz.compress(t.to("meta"), tz.RawConfig()),
    ):
        with pytest.raises(ValueError, match="meta"):
            call()
    two_tensor = pytest.importorskip("torch.testing._internal.two_tensor")
    w = two_tensor.TwoTensor(t, t)
    for call in (
        lambda: tz.compress_tensor(w),
        lambda: tz.hash_tensor_with_crc32(w),
        lambda: tz.compress(w, tz.TensorZipConfig()),
        lambda: tz.decompress_tensor(two_tensor.TwoTensor(blob, blob), device="cpu"),
    ):
        with pytest.raises(TypeError, match="no memory of its own"):
            call()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch deprecates quantized tensors
        q = torch.quantize_per_tensor(t, 0.1, 3, torch.qint8)
    for config in (tz.TensorZipConfig(), tz.RawConfig()):
        with pytest.raises(TypeError, match="quantized"):
            tz.compress(q, config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the strided layout is a prototype
        nested = torch.nested.nested_tensor([t[:3], t[:5]], layout=torch.strided)
    with pytest.raises(TypeError, match="nested"):
        tz.compress_tensor(nested)


def test_out_of_range_options_name_the_field(gen):
    t = gen(torch.float32, (8, 8), 4)
    for call in (
        lambda: tz.compress_tensor(t, min_compress_bytes=2**64),
        lambda: tz.compress(t, tz.TensorZipConfig(min_compress_bytes=2**64)),
    ):
        with pytest.raises(ValueError, match="min_compress_bytes"):
            call()


def test_arguments_of_the_wrong_type_are_named(gen, tmp_path):
    t = gen(torch.float32, (8, 8), 6)
    with pytest.raises(TypeError, match="pin_memory"):
        tz.compress_tensor(t, pin_memory="no")
    tz.save_file({"w": t}, tmp_path / "m.tz")
    tz.decompress_file(tmp_path / "m.tz", tmp_path / "m.safetensors")
    with pytest.raises(TypeError, match="verify"):
        tz.compress_file(tmp_path / "m.safetensors", tmp_path / "n.tz", verify=1)
    with tz.safe_open(tmp_path / "m.tz") as f:
        for call in (lambda: f.get_tensor(3), lambda: f.get_slice(3)):
            with pytest.raises(TypeError, match="name is a str"):
                call()


def test_compressed_tensor_metadata_must_match_its_blob(gen):
    """A CompressedTensor's JSON is not under the blob's checksums: an edited dtype of the same
    size or a permuted shape is refused at decompress instead of reinterpreting the bytes."""
    t = gen(torch.float32, (32, 64), 5)
    state = tz.compress(t, tz.TensorZipConfig()).state_dict()
    key = next(iter(state))
    raw = bytes(state[key].numpy())
    (jlen,) = struct.unpack_from("<I", raw, 8)
    meta = json.loads(raw[12 : 12 + jlen])
    assert same(tz.decompress(tz.CompressedTensor.from_state_dict(state), tz.TensorZipConfig()), t)
    for edit in ({"dtype": "int32"}, {"shape": [64, 32]}, {"shape": [-1]}):
        j = json.dumps({**meta, **edit}, separators=(",", ":")).encode()
        bad = raw[:8] + struct.pack("<I", len(j)) + j + raw[12 + jlen :]
        with pytest.raises(ValueError, match="CompressedTensor"):
            c = tz.CompressedTensor.from_state_dict({key: torch.frombuffer(bytearray(bad), dtype=torch.uint8)})
            tz.decompress(c, tz.TensorZipConfig())


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    """Opening a FIFO blocks until a writer appears (it hung with the GIL held): inputs are
    opened non-blocking and refused as not regular files."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code = (
        "import sys, tensorzip as tz\n"
        "for call in (tz.load_file, tz.verify_file, tz.safe_open):\n"
        "    try:\n"
        "        call(sys.argv[1])\n"
        "    except OSError as e:\n"
        "        print('OSError', e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=120)
    lines = r.stdout.splitlines()
    assert len(lines) == 3 and all("not a regular file" in l for l in lines), (r.stdout, r.stderr)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")
def test_results_asked_on_cuda_without_cuda_fail_before_decoding(gen, tmp_path):
    """Without CUDA, a result asked for on a CUDA device raises torch's error at once: a reader is
    refused when opened (it used to open, and each get_tensor decoded on the CPU, then failed), and
    decompress_tensor before decoding."""
    t = gen(torch.float32, (64, 64), 3)
    path = tmp_path / "m.tz"
    tz.save_file({"t": t}, path)
    for dev in ("cuda", 0, torch.device("cuda", 1)):
        with pytest.raises(RuntimeError):
            tz.safe_open(path, device=dev)
        with pytest.raises(RuntimeError):
            tz.load_file(path, device=dev)
        with pytest.raises(RuntimeError):
            tz.decompress_tensor(tz.compress_tensor(t), device=dev)
    assert torch.equal(tz.load_file(path)["t"], t)


def test_decompress_default_device_without_cuda(gen):
    t = gen(torch.float16, (10, 10), 6)
    out = tz.decompress_tensor(tz.compress_tensor(t))
    assert out.device.type == ("cuda" if torch.cuda.is_available() else "cpu")


# --- EntroPack's API -------------------------------------------------------------------------------


def test_entropack_api_round_trip(gen, tmp_path):
    t = gen(torch.bfloat16, (256, 300), 7)
    cfg = tz.TensorZipConfig()
    c = tz.compress(t, cfg)
    assert c.shape == t.shape and c.dtype == t.dtype
    assert c.compress_method == "tensorzip" and c.lossless
    assert 0 < c.storage_nbytes() < t.numel() * 2
    assert c.actual_bpp == pytest.approx(8 * c.storage_nbytes() / t.numel())
    assert c.storage_nbytes(include_header=False) < c.storage_nbytes()
    assert same(tz.decompress(c, cfg), t)
    # .to(dtype=...) changes the output dtype without recompressing.
    c32 = c.to(dtype=torch.float32)
    assert c32.storage_nbytes() == c.storage_nbytes()
    assert torch.equal(tz.decompress(c32, cfg), t.float())
    # .to(device) keeps working on the CPU.
    assert same(tz.decompress(c.to("cpu"), cfg), t)
    # state_dict through torch.save / torch.load(weights_only=True).
    path = tmp_path / "ct.pt"
    torch.save(c.state_dict(), path)
    loaded = tz.CompressedTensor.from_state_dict(torch.load(path, weights_only=True))
    assert same(tz.decompress(loaded, cfg), t)
    buf = io.BytesIO()
    torch.save(c.state_dict(leaf="w"), buf)
    buf.seek(0)
    assert same(tz.decompress(tz.CompressedTensor.from_state_dict(torch.load(buf, weights_only=True), leaf="w"), cfg), t)
    with pytest.raises(ValueError, match="missing"):
        tz.CompressedTensor.from_state_dict({})


def test_entropack_raw_config_and_fallback(gen):
    t = gen(torch.int32, (50, 7), 8)
    c = tz.compress(t, tz.RawConfig())
    assert c.compress_method == "raw" and c.lossless
    assert same(tz.decompress(c, tz.RawConfig()), t)
    assert same(tz.decompress(c, tz.TensorZipConfig()), t)
    z = torch.randn(20, 3, dtype=torch.complex128)
    with pytest.warns(tz.CompressionFallbackWarning):
        c = tz.compress(z, tz.TensorZipConfig())
    assert c.compress_method == "raw" and c.header["requested"] == "tensorzip"
    assert torch.equal(tz.decompress(c, tz.TensorZipConfig()), z)


@pytest.mark.parametrize(
    "cfg, exc, field",
    [
        (lambda: tz.TensorZipConfig(chunk_bytes=7), ValueError, "chunk_bytes"),
        (lambda: tz.TensorZipConfig(passthrough_threshold=2.0), ValueError, "passthrough_threshold"),
        (lambda: tz.TensorZipConfig(block_units=33), ValueError, "block_units"),
        (lambda: tz.TensorZipConfig(max_tables="8"), TypeError, "max_tables"),
        (lambda: tz.TensorZipConfig(execution_backend="tpu"), ValueError, "execution_backend"),
        (lambda: tz.TensorZipConfig(execution_backend=3), TypeError, "execution_backend"),
    ],
)
def test_entropack_invalid_configs_name_the_field(cfg, exc, field):
    with pytest.raises(exc, match=field):
        tz.compress(torch.zeros(4), cfg())
    with pytest.raises(TypeError):
        tz.compress(torch.zeros(4), object())


def test_entropack_corrupted_state_is_rejected(gen):
    c = tz.compress(gen(torch.float32, (100, 100), 9), tz.TensorZipConfig())
    state = c.state_dict()["tensorzip_state"].clone()
    bad = state.clone()
    bad[:4] = 0
    with pytest.raises(ValueError, match="magic"):
        tz.CompressedTensor(bad)
    with pytest.raises(ValueError):
        tz.decompress(tz.CompressedTensor(state[: len(state) // 2]), tz.TensorZipConfig())


# --- Files ---------------------------------------------------------------------------------------


def _model(gen):
    return {
        "emb.weight": gen(torch.float32, (1000, 64), 10),
        "layer.0.w": gen(torch.bfloat16, (128, 256), 11),
        "layer.0.b": gen(torch.float16, (256,), 12),
        "step": torch.tensor(12345, dtype=torch.int64),
        "mask": gen(torch.bool, (33, 3), 13),
        "empty": torch.empty(0, 4),
    }


def test_save_load_file_round_trip(gen, tmp_path):
    tensors = _model(gen)
    path = tmp_path / "model.tz"
    tz.save_file(tensors, path, metadata={"format": "pt", "note": "hello"})
    assert path.exists() and not any(p.name.startswith(".model.tz") for p in tmp_path.iterdir())
    back = tz.load_file(path)
    assert set(back) == set(tensors)
    for k, v in tensors.items():
        assert same(back[k], v), k
    with tz.safe_open(path, framework="pt") as f:
        assert f.keys() == sorted(tensors)
        assert f.metadata() == {"format": "pt", "note": "hello"}
        assert same(f.get_tensor("layer.0.w"), tensors["layer.0.w"])
        sl = f.get_slice("emb.weight")
        assert sl.get_shape() == [1000, 64] and sl.get_dtype() == "F32"
        assert same(sl[10:20], tensors["emb.weight"][10:20])
        with pytest.raises(KeyError):
            f.get_tensor("nope")


def test_saved_file_is_the_cli_archive_of_a_safetensors_file(gen, tmp_path):
    """`tensorzip decompress` turns save_file's output into a valid .safetensors file holding the
    same tensors (the command line and the package share one on-disk format)."""
    cli = Path(__file__).resolve().parents[3] / "target" / "release" / "tensorzip"
    if not cli.exists():
        pytest.skip(f"{cli} not built (scripts/test.sh builds it first)")
    tensors = _model(gen)
    path = tmp_path / "m.safetensors.tz"
    tz.save_file(tensors, path)
    subprocess.run([str(cli), "verify", str(path)], check=True, capture_output=True)
    subprocess.run([str(cli), "decompress", str(path)], check=True, capture_output=True)
    raw = (tmp_path / "m.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    for k, v in tensors.items():
        begin, end = header[k]["data_offsets"]
        assert raw[8 + n + begin : 8 + n + end] == _bytes(v.contiguous()), k
        assert header[k]["shape"] == list(v.shape)
    # And the CLI's archive of that file loads back with load_file.
    os.remove(path)
    subprocess.run([str(cli), "compress", str(tmp_path / "m.safetensors"), "-o", str(path)], check=True, capture_output=True)
    back = tz.load_file(path)
    for k, v in tensors.items():
        assert same(back[k], v), k


def test_compress_and_decompress_file(gen, tmp_path):
    """A .safetensors file to an archive and back without loading its tensors: decompress_file
    restores the file byte for byte, and compress_file of that file writes the very archive
    save_file wrote (the same coder, the same segments); bad input raises errors naming the file
    and leaves no output."""
    tensors = _model(gen)
    saved = tmp_path / "m.safetensors.tz"
    tz.save_file(tensors, saved, metadata={"k": "v"})
    n = tz.decompress_file(saved)  # default output: the name without .tz
    restored = tmp_path / "m.safetensors"
    assert restored.stat().st_size == n
    raw = restored.read_bytes()
    (hn,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + hn])
    assert header["__metadata__"] == {"k": "v"}
    for k, v in tensors.items():
        begin, end = header[k]["data_offsets"]
        assert raw[8 + hn + begin : 8 + hn + end] == _bytes(v.contiguous()), k
    again = tmp_path / "again.tz"
    size, archive = tz.compress_file(restored, again)
    assert (size, archive) == (len(raw), again.stat().st_size)
    assert again.read_bytes() == saved.read_bytes()
    # verify=True decodes the archive before keeping it: the same archive.
    assert tz.compress_file(restored, tmp_path / "v.tz", verify=True) == (size, archive)
    assert (tmp_path / "v.tz").read_bytes() == saved.read_bytes()
    os.remove(tmp_path / "v.tz")
    # bytes and PathLike names, the default output name, non-default options.
    os.remove(saved)
    tz.compress_file(bytes(restored), max_tables=2, condition=False)
    back = tz.load_file(saved)
    assert all(same(back[k], v) for k, v in tensors.items())
    os.remove(restored)
    tz.decompress_file(saved, bytes(tmp_path / "r2.safetensors"))
    assert (tmp_path / "r2.safetensors").read_bytes() == raw
    # Bad input: errors name the file; nothing is left at the output.
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file at all")
    with pytest.raises(ValueError, match="junk.safetensors"):
        tz.compress_file(tmp_path / "junk.safetensors", tmp_path / "junk.tz")
    with pytest.raises(ValueError, match="already"):
        tz.compress_file(saved, tmp_path / "twice.tz")
    bad = bytearray(saved.read_bytes())
    bad[len(bad) // 2] ^= 0x10
    (tmp_path / "bad.tz").write_bytes(bad)
    with pytest.raises(ValueError, match="bad.tz"):
        tz.decompress_file(tmp_path / "bad.tz", tmp_path / "bad.safetensors")
    with pytest.raises(ValueError, match="does not end in .tz"):
        tz.decompress_file(tmp_path / "r2.safetensors")
    with pytest.raises(ValueError, match="is the input file"):
        tz.compress_file(tmp_path / "r2.safetensors", tmp_path / "r2.safetensors", overwrite=True)
    with pytest.raises(IsADirectoryError):
        tz.decompress_file(saved, tmp_path)
    with pytest.raises(OSError):
        tz.compress_file(tmp_path / "missing.safetensors")
    with pytest.raises(ValueError, match="max_tables"):
        tz.compress_file(tmp_path / "r2.safetensors", tmp_path / "x.tz", max_tables=0)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["again.tz", "bad.tz", "junk.safetensors", "m.safetensors.tz", "r2.safetensors"], left


def test_damaged_files_raise_value_error_naming_the_file(gen, tmp_path):
    path = tmp_path / "d.tz"
    tz.save_file(_model(gen), path)
    data = bytearray(path.read_bytes())
    for i in (0, 40, len(data) // 2, len(data) - 3):
        d = bytearray(data)
        d[i] ^= 0x10
        bad = tmp_path / f"bad{i}.tz"
        bad.write_bytes(d)
        with pytest.raises(ValueError, match=str(bad.name)):
            tz.load_file(bad)
    trunc = tmp_path / "t.tz"
    trunc.write_bytes(data[: len(data) // 3])
    with pytest.raises(ValueError, match="t.tz"):
        tz.load_file(trunc)
    with pytest.raises(OSError):
        tz.load_file(tmp_path / "missing.tz")
    with pytest.raises(IsADirectoryError, match="is a directory"):
        tz.load_file(tmp_path)
    # A plain safetensors file, and a single blob, given where an archive is expected: the error
    # says what the file is.
    st = tmp_path / "plain.safetensors"
    head = json.dumps({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}}).encode()
    st.write_bytes(struct.pack("<Q", len(head)) + head + torch.ones(3).numpy().tobytes())
    with pytest.raises(ValueError, match="plain.safetensors: not a tensorzip archive .*it is a safetensors file"):
        tz.load_file(st)
    blob = tmp_path / "one.blob"
    blob.write_bytes(bytes(tz.compress_tensor(torch.ones(3)).numpy()))
    with pytest.raises(ValueError, match="single tensorzip blob"):
        tz.safe_open(blob)


def test_paths_as_bytes_and_a_closed_reader(gen, tmp_path):
    """File names may be str, bytes or os.PathLike (as `open` takes them); a reader used after its
    `with` block raises ValueError saying it is closed."""
    m = _model(gen)
    path = tmp_path / "b.tz"
    tz.save_file(m, bytes(path))
    back = tz.load_file(bytes(path))
    assert all(torch.equal(back[k], v) for k, v in m.items())
    with tz.safe_open(bytes(path)) as f:
        name = f.keys()[0]
        assert torch.equal(f.get_tensor(name), m[name])
    for use in (lambda: f.get_tensor(name), f.keys, f.metadata, lambda: f.get_slice(name)[0]):
        with pytest.raises(ValueError, match="closed"):
            use()


def test_tensors_with_odd_strides_on_dimensions_of_one_compress(gen, tmp_path):
    """Torch calls a tensor contiguous whatever the stride of a dimension of size 1
    (`x[:, 3][2:3]` has stride 301); such tensors compress, decompress and save like any other
    (their flat byte view once raised RuntimeError)."""
    odd = {
        "a": gen(torch.float16, (5, 301), 31)[:, 3][2:3],
        "b": gen(torch.bfloat16, (301,), 32)[None, 2],
        "c": gen(torch.float32, (7, 9), 33).t()[2:3, 1:2],
        "d": gen(torch.bool, (4, 6), 34)[:, 1][None, 3],
    }
    for name, t in odd.items():
        assert t.is_contiguous() and t.numel() == 1 and max(t.stride()) > 1, name
        back = tz.decompress_tensor(tz.compress_tensor(t), device="cpu")
        assert torch.equal(_core.as_bytes(back), _core.as_bytes(t.clone())), name
    path = tmp_path / "odd.tz"
    tz.save_file(odd, path)
    back = tz.load_file(path)
    for name, t in odd.items():
        assert same(back[name], t), name


def test_conjugate_and_negative_views_are_stored_as_their_values(gen, tmp_path):
    """A conjugate view (`x.conj()`) or a negative view keeps its values' sign in a flag beside
    unchanged memory; what is stored is the values (the raw memory would be `x`)."""
    x = gen(torch.complex64, (6, 5), 41)
    views = {"conj": x.conj(), "conj_t": x.conj().t(), "neg": torch._neg_view(gen(torch.float32, (9,), 42))}
    for name, v in views.items():
        want = v.resolve_conj().resolve_neg()
        back = tz.decompress_tensor(tz.compress_tensor(v), device="cpu")
        assert torch.equal(back.reshape(v.shape), want), name
    path = tmp_path / "views.tz"
    tz.save_file(views, path)
    back = tz.load_file(path)
    for name, v in views.items():
        assert torch.equal(back[name], v.resolve_conj().resolve_neg()), name


def test_slices_decode_only_their_rows_and_index_as_torch(gen, tmp_path):
    """`get_slice(name)[index]` equals `tensor[index]` for every kind of index (errors included),
    and asks the decoder for the rows from the first to the last the index reads (`_rows_of`;
    the range decoder's touching only the chunks that hold them is the core's to test)."""
    from tensorzip._files import _rows_of

    assert _rows_of(5, [1000, 64]) == (5, 6, (0,))
    assert _rows_of(-1, [1000, 64]) == (999, 1000, (0,))
    assert _rows_of((slice(3, 900, 7), 2), [1000, 64]) == (3, 900, (slice(0, 897, 7), 2))
    assert _rows_of(slice(50, 10), [1000]) == (0, 0, (slice(0, 0),))
    assert _rows_of(slice(990, 2000), [1000]) == (990, 1000, (slice(0, 10, 1),))
    for whole in (1000, [1, 4], None, ..., True, (), slice(None, None, -1)):
        assert _rows_of(whole, [1000, 64]) is None, whole
    assert _rows_of(0, []) is None
    tensors = {
        "w": gen(torch.float32, (1000, 64), 21),
        "h": gen(torch.bfloat16, (37, 5, 3), 22),
        "v": gen(torch.float16, (301,), 23),
        "m": gen(torch.bool, (50, 7), 24),
        "z": torch.empty(0, 4),
        "s": torch.tensor(2.5),
    }
    path = tmp_path / "s.tz"
    tz.save_file(tensors, path, chunk_bytes=4096)
    indices = [
        0, 5, -1, -1000, 999, slice(None), slice(10, 20), slice(-7, None), slice(3, 900, 7),
        slice(50, 10), slice(None, None, 3), (slice(2, 9), slice(1, 4)), (7, 3), (slice(4, 6), ...),
        (slice(1, 3), None), (..., 1), (None, 2), (-2,), (), [1, 4], slice(990, 2000),
    ]
    with tz.safe_open(path, framework="pt") as f:
        for name, t in tensors.items():
            sl = f.get_slice(name)
            for idx in indices:
                try:
                    want = t[idx]
                except (IndexError, TypeError, ValueError) as e:
                    with pytest.raises(type(e)):
                        sl[idx]
                    continue
                got = sl[idx]
                assert got.shape == want.shape and same(got, want), (name, idx)
        with pytest.raises(IndexError):
            f.get_slice("w")[1000]


def test_batch_decode_checks_its_arguments(gen, tmp_path):
    """The native call behind `load_file` on the CPU refuses what the torch layer must never pass:
    a count mismatch, overlapping buffers, a buffer of the wrong size, an unknown name; a tensor
    named twice, into two buffers, is decoded twice."""
    tensors = _model(gen)
    path = tmp_path / "b.tz"
    tz.save_file(tensors, path)
    f = tz.safe_open(path)
    w = torch.empty(128, 256, dtype=torch.bfloat16)
    ptr, n = w.data_ptr(), w.numel() * 2
    with pytest.raises(ValueError, match="one output per tensor"):
        f._file.decode_many_into(["layer.0.w"], [])
    with pytest.raises(ValueError, match="overlap"):
        f._file.decode_many_into(["layer.0.w", "layer.0.w"], [(ptr, n), (ptr + 2, n)])
    w2 = torch.empty_like(w)
    f._file.decode_many_into(["layer.0.w", "layer.0.w"], [(ptr, n), (w2.data_ptr(), n)])
    assert same(w, tensors["layer.0.w"]) and same(w2, tensors["layer.0.w"])
    with pytest.raises(ValueError, match="b.tz"):
        f._file.decode_many_into(["layer.0.w"], [(ptr, n - 2)])
    with pytest.raises(KeyError):
        f._file.decode_many_into(["nope"], [(ptr, n)])
    f._file.decode_many_into(["layer.0.w"], [(ptr, n)])
    assert same(w, tensors["layer.0.w"])


def test_save_file_rejects_bad_arguments(tmp_path):
    with pytest.raises(TypeError):
        tz.save_file({"a": [1, 2]}, tmp_path / "x.tz")
    with pytest.raises(TypeError):
        tz.save_file({"a": torch.zeros(2)}, tmp_path / "x.tz", metadata={"a": 1})
    with pytest.raises(ValueError, match="chunk_bytes"):
        tz.save_file({"a": torch.zeros(2)}, tmp_path / "x.tz", chunk_bytes=3)
    # The header's reserved key (once saved, and then the file did not load).
    with pytest.raises(ValueError, match="reserved"):
        tz.save_file({"__metadata__": torch.zeros(2)}, tmp_path / "x.tz")
    assert not (tmp_path / "x.tz").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tz.save_file({}, tmp_path / "empty.tz")
    assert tz.load_file(tmp_path / "empty.tz") == {}
    # Not onto a directory, nor onto anything but a regular file (the rename would replace a
    # device or a pipe — /dev/null when run as root — instead of writing into it).
    with pytest.raises(IsADirectoryError):
        tz.save_file({"a": torch.zeros(2)}, tmp_path)
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "pipe")
        with pytest.raises(OSError, match="not a regular file"):
            tz.save_file({"a": torch.zeros(2)}, tmp_path / "pipe")
        assert (tmp_path / "pipe").is_fifo()
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_load_dir_reads_a_sharded_model_and_checks_its_index(gen, tmp_path):
    tensors = _model(gen)
    keys = sorted(tensors)
    half = len(keys) // 2
    shards = {"model-00001-of-00002.safetensors": keys[:half], "model-00002-of-00002.safetensors": keys[half:]}
    d = tmp_path / "model-tz"
    (d / "text_encoder").mkdir(parents=True)
    for shard, names in shards.items():
        tz.save_file({k: tensors[k] for k in names}, d / (shard + ".tz"))
    # Another component in a sub-folder and a hidden file are not read.
    tz.save_file({"other": tensors[keys[0]]}, d / "text_encoder" / "model.safetensors.tz")
    (d / ".x.safetensors.tz").write_bytes(b"junk")
    index = {"metadata": {}, "weight_map": {k: s for s, names in shards.items() for k in names}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    back = tz.load_dir(d)
    assert sorted(back) == keys
    for k in keys:
        assert same(back[k], tensors[k]), k
    # An index naming another shard, a tensor no index names, a name in two archives.
    wrong = dict(index["weight_map"], **{keys[0]: "model-00002-of-00002.safetensors"})
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wrong}))
    with pytest.raises(ValueError, match=f"tensor {keys[0]!r} of shard model-00002-of-00002.safetensors is in model-00001"):
        tz.load_dir(d)
    partial = {k: v for k, v in index["weight_map"].items() if k != keys[-1]}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": partial}))
    with pytest.raises(ValueError, match=f"1 tensors no index names, e.g. {keys[-1]!r}"):
        tz.load_dir(d)
    (d / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a safetensors index"):
        tz.load_dir(d)
    (d / "model.safetensors.index.json").unlink()
    tz.save_file({keys[0]: tensors[keys[0]]}, d / "extra.safetensors.tz")
    with pytest.raises(ValueError, match=f"model-00001-of-00002.safetensors.tz: tensor {keys[0]!r} is also in extra.safetensors.tz"):
        tz.load_dir(d)
    with pytest.raises(ValueError, match="no .safetensors.tz archive"):
        tz.load_dir(tmp_path)
    with pytest.raises(ValueError, match="not a directory"):
        tz.load_dir(d / "extra.safetensors.tz")


def test_load_dir_of_a_directory_the_cli_compressed(gen, tmp_path):
    """`tensorzip compress DIR -o OUT` then `load_dir(OUT)`: the shards' tensors, the index checked."""
    cli = Path(__file__).resolve().parents[3] / "target" / "release" / "tensorzip"
    if not cli.exists():
        pytest.skip(f"{cli} not built (scripts/test.sh builds it first)")
    tensors = _model(gen)
    keys = sorted(tensors)
    src = tmp_path / "model"
    src.mkdir()
    for i, names in enumerate((keys[:2], keys[2:])):
        tz.save_file({k: tensors[k] for k in names}, tmp_path / f"s{i}.tz")
        tz.decompress_file(tmp_path / f"s{i}.tz", src / f"s{i}.safetensors")
    index = {"weight_map": {k: f"s{0 if k in keys[:2] else 1}.safetensors" for k in keys}}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    (src / "config.json").write_text("{}")
    subprocess.run([str(cli), "compress", str(src), "-o", str(tmp_path / "out")], check=True, capture_output=True)
    back = tz.load_dir(tmp_path / "out")
    assert sorted(back) == keys and all(same(back[k], tensors[k]) for k in keys)
    # save_dir's shards restore to a Hugging Face layout: the index names the restored files.
    tz.save_dir(tensors, tmp_path / "sd", max_shard_bytes=200_000)
    subprocess.run([str(cli), "decompress", str(tmp_path / "sd"), "-o", str(tmp_path / "hf")], check=True, capture_output=True)
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == sorted(p.name for p in (tmp_path / "hf").glob("*.safetensors"))
    assert len(index["weight_map"]) == len(keys)


def test_saves_keep_what_is_there(gen, tmp_path):
    """What a save or a file-to-file call must not lose: an existing output is refused by the
    file-to-file calls without overwrite=True (as the command line without --force), a replaced
    file keeps its permissions, a save whose header no reader would take is refused before the
    old file is touched, and save_dir leaves an uncompressed checkpoint's index alone. Errors
    of the file system come as the OSError subclass of their errno, naming the file."""
    t = gen(torch.float32, (16, 16), 1)
    tz.save_file({"w": t}, tmp_path / "m.safetensors.tz", metadata={})
    # Empty metadata reads back empty, not absent (as safetensors).
    with tz.safe_open(tmp_path / "m.safetensors.tz") as f:
        assert f.metadata() == {}
    tz.decompress_file(tmp_path / "m.safetensors.tz")
    restored = (tmp_path / "m.safetensors").read_bytes()
    (tmp_path / "m.safetensors").write_bytes(b"edited")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        tz.decompress_file(tmp_path / "m.safetensors.tz")
    assert (tmp_path / "m.safetensors").read_bytes() == b"edited"
    assert tz.decompress_file(tmp_path / "m.safetensors.tz", overwrite=True) == len(restored)
    assert (tmp_path / "m.safetensors").read_bytes() == restored
    (tmp_path / "other.tz").write_bytes(b"unrelated")
    with pytest.raises(FileExistsError):
        tz.compress_file(tmp_path / "m.safetensors", tmp_path / "other.tz")
    assert (tmp_path / "other.tz").read_bytes() == b"unrelated"
    tz.compress_file(tmp_path / "m.safetensors", tmp_path / "other.tz", overwrite=True)
    assert (tmp_path / "other.tz").read_bytes() == (tmp_path / "m.safetensors.tz").read_bytes()
    with pytest.raises(TypeError, match="overwrite"):
        tz.decompress_file(tmp_path / "m.safetensors.tz", overwrite="yes")
    # A private file replaced by a save stays private.
    os.chmod(tmp_path / "other.tz", 0o600)
    tz.save_file({"w": t}, tmp_path / "other.tz")
    assert (tmp_path / "other.tz").stat().st_mode & 0o777 == 0o600
    # A header past the format's 100 MB: refused, and the file there is the one saved before.
    before = (tmp_path / "other.tz").read_bytes()
    with pytest.raises(ValueError, match="header would be"):
        tz.save_file({"w": t}, tmp_path / "other.tz", metadata={"note": "x" * 100_000_100})
    assert (tmp_path / "other.tz").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors", "m.safetensors.tz", "other.tz"]
    # A file-to-file call's output takes its input's permissions (as the command line's).
    tz.decompress_file(tmp_path / "other.tz", tmp_path / "private.safetensors")
    assert (tmp_path / "private.safetensors").stat().st_mode & 0o777 == 0o600
    tz.compress_file(tmp_path / "private.safetensors", tmp_path / "private.tz")
    assert (tmp_path / "private.tz").stat().st_mode & 0o777 == 0o600
    # Never set-ID bits (a user's setuid file compressed by root came out setuid root).
    os.chmod(tmp_path / "private.safetensors", 0o6755)
    tz.compress_file(tmp_path / "private.safetensors", tmp_path / "private.tz", overwrite=True)
    assert (tmp_path / "private.tz").stat().st_mode & 0o7777 == 0o755
    os.chmod(tmp_path / "private.tz", 0o4700)
    tz.save_file({"w": t}, tmp_path / "private.tz")
    assert (tmp_path / "private.tz").stat().st_mode & 0o7777 == 0o700
    # Run as root, an input named through a link gives at most 0600 (as the command line's).
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        os.chmod(tmp_path / "private.safetensors", 0o644)
        os.symlink(tmp_path / "private.safetensors", tmp_path / "link.safetensors")
        tz.compress_file(tmp_path / "link.safetensors", tmp_path / "linked.tz")
        assert (tmp_path / "linked.tz").stat().st_mode & 0o7777 == 0o600
        tz.compress_file(tmp_path / "private.safetensors", tmp_path / "direct.tz")
        assert (tmp_path / "direct.tz").stat().st_mode & 0o7777 == 0o644
        for n in ("link.safetensors", "linked.tz", "direct.tz"):
            os.remove(tmp_path / n)
    os.remove(tmp_path / "private.safetensors")
    os.remove(tmp_path / "private.tz")
    # The errno's subclass, with the file's name.
    with pytest.raises(FileNotFoundError) as e:
        tz.load_file(tmp_path / "missing.tz")
    assert e.value.filename == str(tmp_path / "missing.tz")
    # save_dir into a directory holding an uncompressed sharded checkpoint: refused, nothing
    # written or removed.
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model-00001-of-00001.safetensors").write_bytes(restored)
    index = json.dumps({"metadata": {}, "weight_map": {"w": "model-00001-of-00001.safetensors"}})
    (ckpt / "model.safetensors.index.json").write_text(index)
    with pytest.raises(ValueError, match="uncompressed checkpoint"):
        tz.save_dir({"w": t}, ckpt)
    assert sorted(p.name for p in ckpt.iterdir()) == ["model-00001-of-00001.safetensors", "model.safetensors.index.json"]
    assert (ckpt / "model.safetensors.index.json").read_text() == index
    # A compressed save's own index is replaced by the next save (its shards are .tz files).
    out = tmp_path / "out"
    tz.save_dir({"a": t, "b": t.clone()}, out, max_shard_bytes=t.numel() * 4)
    assert (out / "model.safetensors.index.json").exists()
    tz.save_dir({"a": t}, out)
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors.tz"]
    # Run as root: no save_dir where another user could swap the staging directory for a link
    # (a directory of theirs, or one anyone may write), nothing written there; a sticky one (as
    # /tmp) is fine; through a link, the save lands at the resolved path.
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 4321, 4322)
        for where in (theirs, theirs / "sub"):
            with pytest.raises(PermissionError, match="owned by another user"):
                tz.save_dir({"a": t}, where)
        assert list(theirs.iterdir()) == []
        shared = tmp_path / "shared"
        shared.mkdir()
        os.chmod(shared, 0o777)
        with pytest.raises(PermissionError, match="writable by other users"):
            tz.save_dir({"a": t}, shared)
        assert list(shared.iterdir()) == []
        os.chmod(shared, 0o1777)
        assert tz.save_dir({"a": t}, shared) == ["model.safetensors.tz"]
        mine = tmp_path / "mine"
        mine.mkdir()
        os.symlink(mine, tmp_path / "link")
        tz.save_dir({"a": t}, tmp_path / "link")
        assert sorted(p.name for p in mine.iterdir()) == ["model.safetensors.tz"]


def test_save_dir_shards_like_hugging_face_and_load_dir_reads_it(gen, tmp_path):
    tensors = _model(gen)
    d = tmp_path / "ckpt"
    # 256 KB emb.weight alone; the rest together.
    files = tz.save_dir(tensors, d, {"format": "pt"}, max_shard_bytes=200_000, chunk_bytes=65536)
    assert files == [
        "model-00001-of-00002.safetensors.tz",
        "model-00002-of-00002.safetensors.tz",
        "model.safetensors.index.json",
    ]
    index = json.loads((d / "model.safetensors.index.json").read_text())
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    assert index["metadata"] == {"total_size": total}
    assert index["weight_map"]["emb.weight"] == "model-00001-of-00002.safetensors"
    assert index["weight_map"]["step"] == "model-00002-of-00002.safetensors"
    with tz.safe_open(d / files[0]) as f:
        assert f.metadata() == {"format": "pt"} and f.keys() == ["emb.weight"]
    back = tz.load_dir(d)
    assert sorted(back) == sorted(tensors) and all(same(back[k], v) for k, v in tensors.items())
    # Saved again in one shard: the old shards and index go, so load_dir reads this save alone —
    # also a shard of a save of 100,000 shards or more (six-digit numbers; they stayed and
    # load_dir merged their tensors into the new save's).
    (d / "notes.txt").write_text("kept")
    (d / "model-000001-of-100001.safetensors.tz").write_bytes((d / files[0]).read_bytes())
    assert tz.save_dir(tensors, d) == ["model.safetensors.tz"]
    assert sorted(p.name for p in d.iterdir()) == ["model.safetensors.tz", "notes.txt"]
    assert all(same(tz.load_dir(d)[k], v) for k, v in tensors.items())
    # A save that fails on its last shard (after the first was written) leaves the previous save
    # as it was: no new shard, no index, no temporary file.
    with pytest.raises(TypeError, match="not a tensor|torch.Tensor"):
        tz.save_dir({**tensors, "zz": "not a tensor"}, d, max_shard_bytes=200_000, chunk_bytes=65536)
    assert sorted(p.name for p in d.iterdir()) == ["model.safetensors.tz", "notes.txt"]
    assert all(same(tz.load_dir(d)[k], v) for k, v in tensors.items())
    with pytest.raises(ValueError, match="max_shard_bytes"):
        tz.save_dir(tensors, d, max_shard_bytes=0)
    with pytest.raises(ValueError, match="block_units"):
        tz.save_dir(tensors, tmp_path / "bad", block_units=3)
    assert not (tmp_path / "bad").exists()


def test_an_archive_truncated_while_open_raises_instead_of_crashing(tmp_path):
    """Another process truncates an archive a reader has mapped (a checkpoint saved again in
    place): reading past the new end raised SIGBUS, which ended the interpreter ("Bus error").
    Now the read gives an OSError naming the file, and the process goes on. Run in a child
    process, so that a regression kills the child, not the test session."""
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import os, torch, tensorzip as tz
        p = {str(tmp_path / "m.tz")!r}
        torch.manual_seed(0)
        tz.save_file({{"a": torch.randn(512, 1024), "b": torch.randn(512, 1024)}}, p)
        with tz.safe_open(p) as f:
            os.truncate(p, 4096)
            for name in ("b", "a"):
                try:
                    f.get_tensor(name)
                    print("no error", name)
                except OSError as e:
                    print("OSError", e)
            try:
                f.get_slice("a")[0:2]
                print("no error slice")
            except OSError as e:
                print("OSError", e)
        print("alive")
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr)
    lines = r.stdout.splitlines()
    assert lines[-1] == "alive", r.stdout
    assert len(lines) == 4 and all(l.startswith("OSError") and "truncated or changed while it was read" in l and "m.tz" in l for l in lines[:3]), r.stdout


def test_an_archive_rewritten_in_place_while_open(tmp_path):
    """Another process rewrites an archive a reader has open with another archive of the same
    length (here: one tensor's recorded CRC changed and the index sealed again, or a byte of a
    blob changed). The reader keeps the index it opened (it sized its tensors from it): where
    the modification time moved it raises OSError naming the file; where the time reads as
    before (a rewrite within the file system's timestamp granularity) it decodes with its own
    index, so unchanged blobs give the tensors it opened and a changed blob fails its checksum."""
    p = tmp_path / "m.tz"
    torch.manual_seed(0)
    tensors = {"a": torch.randn(64, 64), "b": torch.randn(64, 64)}
    tz.save_file(tensors, p)
    original = p.read_bytes()
    data = bytearray(original)
    (index_at,) = struct.unpack_from("<Q", data, 24)
    at = index_at + 4
    for _ in range(2):  # past the header's and the first tensor's entries
        (n_crc,) = struct.unpack_from("<I", data, at + 37)
        at += 41 + 4 * n_crc
    (b_blob_at,) = struct.unpack_from("<Q", data, at + 17)
    data[at + 33] ^= 1  # the second tensor's orig_crc
    struct.pack_into("<I", data, len(data) - 4, zlib.crc32(bytes(data[index_at:-4])))
    st = os.stat(p)

    def rewrite(new: bytes, keep_time: bool) -> None:
        with open(p, "r+b") as w:
            w.write(new)
        if keep_time:
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))

    # The time reads as before: the reader's own index decodes the unchanged blobs.
    with tz.safe_open(p) as f:
        rewrite(bytes(data), True)
        assert same(f.get_tensor("a"), tensors["a"]) and same(f.get_tensor("b"), tensors["b"])
        assert same(f.get_slice("b")[0:2], tensors["b"][0:2])
        broken = bytearray(data)
        broken[b_blob_at + 200] ^= 0x10
        rewrite(bytes(broken), True)
        assert same(f.get_tensor("a"), tensors["a"])
        with pytest.raises(ValueError, match="m.tz"):
            f.get_tensor("b")
    # A rewrite that moves the modification time is refused before anything is returned.
    p.write_bytes(original)
    st = os.stat(p)
    with tz.safe_open(p) as f:
        assert same(f.get_tensor("a"), tensors["a"])
        time.sleep(0.05)
        rewrite(bytes(data), False)
        for read in (lambda: f.get_tensor("a"), lambda: f.get_slice("b")[0:2], lambda: f.get_slice("b").get_shape()):
            with pytest.raises(OSError, match="truncated or changed while it was read") as e:
                read()
            assert "m.tz" in str(e.value)


def test_release_gpu_memory_without_a_gpu_engine():
    """Nothing to give back where the GPU engine was never used (or cannot run): no error, no
    engine made; a device that is not CUDA is refused."""
    tz.release_gpu_memory()
    tz.release_gpu_memory("cuda")  # no CUDA here: nothing to give back, no error
    with pytest.raises(ValueError, match="not a CUDA device"):
        tz.release_gpu_memory("cpu")


def test_verify_file(gen, tmp_path):
    """verify_file checks and decodes an archive without writing anything; with `against` it
    compares the restore with the original and names the first differing byte."""
    tensors = _model(gen)
    tz.save_file(tensors, tmp_path / "m.tz")
    n = tz.decompress_file(tmp_path / "m.tz", tmp_path / "m.safetensors")
    assert tz.verify_file(tmp_path / "m.tz") == n
    assert tz.verify_file(tmp_path / "m.tz", against=tmp_path / "m.safetensors") == n
    raw = bytearray((tmp_path / "m.safetensors").read_bytes())
    raw[-5] ^= 1
    (tmp_path / "other.safetensors").write_bytes(raw)
    with pytest.raises(ValueError, match=f"m.tz: differs from .*other.safetensors at byte {len(raw) - 5}"):
        tz.verify_file(tmp_path / "m.tz", tmp_path / "other.safetensors")
    (tmp_path / "longer.safetensors").write_bytes((tmp_path / "m.safetensors").read_bytes() + b"x")
    with pytest.raises(ValueError, match=f"restores {n} bytes but .*longer.safetensors has {n + 1}"):
        tz.verify_file(tmp_path / "m.tz", tmp_path / "longer.safetensors")
    bad = bytearray((tmp_path / "m.tz").read_bytes())
    bad[len(bad) // 2] ^= 0x10
    (tmp_path / "bad.tz").write_bytes(bad)
    with pytest.raises(ValueError, match="bad.tz"):
        tz.verify_file(tmp_path / "bad.tz")
    with pytest.raises(OSError):
        tz.verify_file(tmp_path / "missing.tz")


def test_threads_saving_one_path_leave_one_whole_archive(gen, tmp_path):
    """Several threads saving to one path at once: each writes its own temporary file (they once
    shared `.NAME.tmpPID` and could interleave into a corrupt archive), so the file left is one of
    theirs, whole."""
    import threading

    path = tmp_path / "shared.tz"
    versions = [{"w": gen(torch.float32, (256, 256), 100 + i)} for i in range(4)]
    errors: list[BaseException] = []

    def save(v):
        try:
            tz.save_file(v, path)
        except BaseException as e:  # a thread's exception would otherwise only be a warning
            errors.append(e)

    for _ in range(3):
        threads = [threading.Thread(target=save, args=(v,)) for v in versions]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        back = tz.load_file(path)
        assert any(same(back["w"], v["w"]) for v in versions)
        assert tz.verify_file(path) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared.tz"]


def test_the_command_line_from_the_package(gen, tmp_path):
    """`python -m tensorzip` (and the `tensorzip` script a pip install adds) is the Rust command
    line: the same archive as save_file's, the same exit statuses."""
    import sys

    tensors = _model(gen)
    tz.save_file(tensors, tmp_path / "m.tz")
    tz.decompress_file(tmp_path / "m.tz", tmp_path / "m.safetensors")
    run = lambda *a: subprocess.run([sys.executable, "-m", "tensorzip", *a], capture_output=True, text=True, timeout=300)
    r = run("compress", str(tmp_path / "m.safetensors"), "-o", str(tmp_path / "cli.tz"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "cli.tz").read_bytes() == (tmp_path / "m.tz").read_bytes()
    r = run("verify", str(tmp_path / "cli.tz"), "--against", str(tmp_path / "m.safetensors"))
    assert r.returncode == 0 and "identical to the original" in r.stderr, r.stderr
    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"tensorzip {tz.__version__}"
    r = run("decompress", str(tmp_path / "missing.tz"))
    assert r.returncode == 1 and r.stderr.startswith("tensorzip: error: ") and "missing.tz" in r.stderr
    assert run("no-such-command").returncode == 2


def test_without_torch_only_the_command_line_runs():
    """With torch missing, `import tensorzip` still works, the command line runs, and the torch
    layer's names raise ImportError saying what to install (a child process with torch hidden)."""
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # as if it were not installed
        import tensorzip
        try:
            tensorzip.compress_tensor
            print("no error")
        except ImportError as e:
            print("ImportError:", e)
        try:
            tensorzip.no_such_name
        except AttributeError:
            print("AttributeError")
        print(hasattr(tensorzip, "__wrapped__"))
        from tensorzip.__main__ import main
        sys.argv = ["tensorzip", "--version"]
        main()
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    lines = r.stdout.splitlines()
    assert r.returncode == 0, r.stderr
    assert lines[0].startswith("ImportError: tensorzip.compress_tensor needs PyTorch"), r.stdout
    assert lines[1:] == ["AttributeError", "False", f"tensorzip {tz.__version__}"], r.stdout


def test_tensors_of_more_dimensions_than_a_blob_holds(tmp_path):
    """A blob holds at most 64 dimensions. A file may have more (valid safetensors): save_file and
    load_file keep such a tensor as its bytes (they refused it); compress() falls back to raw with
    its warning and gives it back (it warned, then raised); a bare blob still refuses it."""
    t = torch.arange(6, dtype=torch.float32).reshape([1] * 64 + [3, 2])
    path = tmp_path / "deep.tz"
    tz.save_file({"deep": t, "flat": torch.ones(4)}, path)
    back = tz.load_file(path)
    assert back["deep"].shape == t.shape and torch.equal(back["deep"], t)
    for dtype in (torch.bfloat16, torch.uint8):  # uint8's bytes were refused at decompress
        with pytest.warns(tz.CompressionFallbackWarning, match="64 dimensions"):
            c = tz.compress(t.to(dtype), tz.TensorZipConfig())
        assert torch.equal(tz.decompress(c, tz.TensorZipConfig()), t.to(dtype))
    with pytest.raises(ValueError, match="64 dimensions"):
        tz.compress_tensor(t)


def test_save_file_refuses_a_meta_tensor_with_its_own_error(tmp_path):
    with pytest.raises(ValueError, match="'m' on meta"):
        tz.save_file({"m": torch.empty(3, device="meta")}, tmp_path / "m.tz")
    assert not any(tmp_path.iterdir())


def test_zero_size_shapes_torch_cannot_make_raise_valueerror(tmp_path):
    """A valid blob of a zero-size tensor whose other dimensions overflow torch's strides
    ([0, 2^62, 4]: the format bounds each dimension, not the product of the ones after a 0) raises
    ValueError like other bad input, not torch's RuntimeError; one torch can make decodes."""
    import struct

    def stored(shape):
        head = b"TZBL" + struct.pack("<HBBBBHII", 1, 0, 1, len(shape), 0, 0, 0, 0)
        return torch.frombuffer(bytearray(head + struct.pack(f"<{len(shape)}Q", *shape)), dtype=torch.uint8)

    with pytest.raises(ValueError, match="strides overflow"):
        tz.decompress_tensor(stored([0, 1 << 62, 4]), device="cpu")
    # The same shape in a file: load_file and get_slice alike.
    tmp = tmp_path
    hdr = json.dumps({"z": {"dtype": "U8", "shape": [0, 1 << 62, 4], "data_offsets": [0, 0]}}).encode()
    (tmp / "z.safetensors").write_bytes(struct.pack("<Q", len(hdr)) + hdr)
    tz.compress_file(tmp / "z.safetensors")
    with pytest.raises(ValueError, match="strides overflow"):
        tz.load_file(tmp / "z.safetensors.tz")
    with tz.safe_open(tmp / "z.safetensors.tz") as f, pytest.raises(ValueError, match="strides overflow"):
        f.get_slice("z")[0:0]
    assert tz.decompress_tensor(stored([4, 1 << 40, 0]), device="cpu").shape == (4, 1 << 40, 0)


@pytest.mark.skipif(not hasattr(torch, "float4_e2m1fn_x2"), reason="this torch has no float4_e2m1fn_x2")
def test_f4_tensors_as_safetensors_holds_them(tmp_path):
    """F4 (two 4-bit values a byte) is torch's float4_e2m1fn_x2, whose last dimension counts bytes
    while the safetensors header counts values: saved with the header's shape, loaded (whole or
    sliced) with torch's — as safetensors.torch does; load_file refused F4 before."""
    x = torch.randint(0, 256, (6, 5), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    f4 = x.view(torch.float4_e2m1fn_x2)
    path = tmp_path / "f4.tz"
    tz.save_file({"w": f4, "b": torch.ones(3)}, path)
    tz.decompress_file(path, tmp_path / "f4.safetensors")
    raw = (tmp_path / "f4.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    assert header["w"]["dtype"] == "F4" and header["w"]["shape"] == [6, 10]
    back = tz.load_file(path)["w"]
    assert back.dtype == torch.float4_e2m1fn_x2 and back.shape == (6, 5)
    assert torch.equal(back.view(torch.uint8), x)
    with tz.safe_open(path) as f:
        s = f.get_slice("w")
        assert s.get_shape() == [6, 10] and s.get_dtype() == "F4"
        assert torch.equal(s[2:5].view(torch.uint8), x[2:5])
        # An index into the last dimension would count bytes where get_shape counts values.
        for index in ((slice(0, 2), slice(0, 4)), Ellipsis, (None, 1)):
            with pytest.raises(ValueError, match="leading dimensions only"):
                s[index]
    # A file whose F4 tensor ends in half a byte is not safetensors (its reader's rule, which
    # compress_file applies).
    hdr = json.dumps({"w": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}).encode()
    (tmp_path / "odd.safetensors").write_bytes(struct.pack("<Q", len(hdr)) + hdr + b"\x12\x34")
    with pytest.raises(ValueError, match="not a safetensors file"):
        tz.compress_file(tmp_path / "odd.safetensors")
    with pytest.raises(ValueError, match="0-d"):
        tz.save_file({"z": torch.zeros((), dtype=torch.uint8).view(torch.float4_e2m1fn_x2)}, tmp_path / "z.tz")


def test_slices_of_tensors_kept_as_bytes(tmp_path):
    """get_slice of a tensor the archive keeps as bytes (more than 64 dimensions) reads the right
    rows: ranges go to the bindings in bytes, not in elements of the header's dtype (a slice
    raised a size error)."""
    t = torch.arange(24, dtype=torch.float32).reshape([1] * 63 + [4, 3, 2])
    path = tmp_path / "deep.tz"
    tz.save_file({"deep": t}, path)
    with tz.safe_open(path) as f:
        assert torch.equal(f.get_slice("deep")[0:1], t[0:1])


def test_save_model_stores_tied_weights_once_and_load_model_reties(tmp_path):
    """save_model: a head tied to the embedding is stored once (its name mapped in the metadata,
    as safetensors.torch.save_model does); load_model fills a model whose tied names come in
    either order; strict loading names what is missing or unexpected."""

    class Tied(torch.nn.Module):
        def __init__(self, head_first: bool):
            super().__init__()
            if head_first:
                self.head = torch.nn.Linear(8, 50, bias=False)
            self.emb = torch.nn.Embedding(50, 8)
            self.mid = torch.nn.Linear(8, 8)
            if not head_first:
                self.head = torch.nn.Linear(8, 50, bias=False)
            self.head.weight = self.emb.weight

    torch.manual_seed(0)
    m = Tied(False)
    path = tmp_path / "m.tz"
    tz.save_model(m, path, {"format": "pt"})
    with tz.safe_open(path) as f:
        assert f.keys() == ["emb.weight", "mid.bias", "mid.weight"]
        assert f.metadata() == {"format": "pt", "head.weight": "emb.weight"}
    once = path.stat().st_size
    tz.save_file(m.state_dict(), tmp_path / "twice.tz")
    assert (tmp_path / "twice.tz").stat().st_size > once + 50 * 8 * 4 // 2  # the head again
    for head_first in (False, True):
        back = Tied(head_first)
        assert tz.load_model(back, path) == ([], [])
        assert back.head.weight is back.emb.weight
        assert all(torch.equal(back.state_dict()[k], v) for k, v in m.state_dict().items())
    with pytest.raises(RuntimeError, match=r"missing \['bias', 'weight'\]"):
        tz.load_model(torch.nn.Linear(3, 3), path)
    assert tz.load_model(torch.nn.Linear(3, 3), path, strict=False)[0] == ["weight", "bias"]
    with pytest.raises(TypeError, match="torch.nn.Module"):
        tz.save_model({"a": torch.ones(1)}, path)
