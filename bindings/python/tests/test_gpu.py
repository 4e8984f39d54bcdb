"""The Python package on the GPU (run on the device machine: scripts/gpu_run.sh python).

CPU blob <-> GPU decode both ways, GPU blob == CPU blob, non-default streams, pinned blobs,
state_dict round trips, corrupted blobs rejected, whole files decoded on the GPU."""

import zlib

import pytest
import torch

import tensorzip as tz
from tensorzip import _core, _files

pytestmark = pytest.mark.gpu

DTYPES = list(_core.SUPPORTED_DTYPES)
SHAPES = [(), (0,), (1,), (33, 5), (257, 129), (1000, 1000)]


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_core.as_bytes(a.cpu()), _core.as_bytes(b.cpu()))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gpu_and_cpu_blobs_are_identical_and_cross_decode(dtype, shape, gen):
    t = gen(dtype, shape, 1)
    for kw in ({}, {"min_compress_bytes": 0, "chunk_bytes": 4096}):
        cpu_blob = tz.compress_tensor(t, **kw)
        gpu_blob = tz.compress_tensor(t.cuda(), **kw)
        assert gpu_blob.device.type == "cpu" and gpu_blob.dtype == torch.uint8
        assert torch.equal(cpu_blob, gpu_blob), (dtype, shape, kw)
        out = tz.decompress_tensor(cpu_blob, device="cuda")
        assert out.is_cuda and same(out, t)
        assert same(tz.decompress_tensor(gpu_blob.cuda()), t)  # blob on the GPU: decoded there
        assert same(tz.decompress_tensor(gpu_blob, device="cpu"), t)


def test_decompress_tensors_in_one_launch(gen):
    """Many blobs of every dtype and odd shape, some on the host (pageable and pinned), some on the
    GPU, decoded by one batch call: every tensor bit-exact on the target device; the default device
    is the first CUDA blob's; a blob whose prefix is bad raises ValueError naming its index before
    anything is decoded, one whose payload is corrupted is caught on the GPU, and the engine keeps
    working after both."""
    ts, blobs = [], []
    for i in range(120):
        dtype = DTYPES[i % len(DTYPES)]
        shape = SHAPES[i % len(SHAPES)] if i % 7 else (3 + i, 17)
        t = gen(dtype, shape, 100 + i)
        b = tz.compress_tensor(t, min_compress_bytes=0, chunk_bytes=[4096, 131072][i % 2])
        b = [b, b.cuda(), b.pin_memory()][i % 3]
        ts.append(t)
        blobs.append(b)
    outs = tz.decompress_tensors(blobs, device="cuda")
    assert len(outs) == len(ts)
    for i, (o, t) in enumerate(zip(outs, ts)):
        assert o.is_cuda and same(o, t), i
    default = tz.decompress_tensors([blobs[0], blobs[1]])
    assert all(o.device == blobs[1].device for o in default)
    assert tz.decompress_tensors([], device="cuda") == []
    bad = [b.cuda() for b in blobs[:6]]
    bad[4] = bad[4][:40]
    with pytest.raises(ValueError, match="blob 4"):
        tz.decompress_tensors(bad, device="cuda")
    # A flipped payload byte of a large coded tensor: the GPU decoder reports it (or, where only
    # a checksum could tell, decodes something of the right shape).
    big = gen(torch.bfloat16, (512, 1024), 7)
    raw = tz.compress_tensor(big)
    flipped = raw.clone()
    flipped[raw.numel() - 1000] ^= 0x5A
    try:
        out = tz.decompress_tensors([blobs[1], flipped.cuda()], device="cuda")
        assert out[1].shape == big.shape
    except ValueError as e:
        assert "GPU" in str(e) or "chunk" in str(e)
    again = tz.decompress_tensors([raw.cuda(), blobs[1]], device="cuda")
    assert same(again[0], big) and same(again[1], ts[1])


def test_decompress_tensors_of_gpu_blobs_reads_their_prefixes_natively(gen):
    """A batch wholly on the GPU takes the native path (prefixes read back by gathering launches
    and parsed in one call, `gpu_read_layouts`): every dtype and odd shape bit-exact, equal to the
    mixed batch's path, on a non-default stream too; a blob whose prefix is longer than the first
    read beside small ones; bad blobs — empty, random bytes, truncated inside a long directory —
    raise ValueError naming the first bad index (`decompress_tensor`, the same path for one GPU
    blob, names none), and nothing after them breaks the engine."""
    ts, blobs = [], []
    for i, (dtype, shape) in enumerate((d, s) for d in DTYPES for s in SHAPES):
        t = gen(dtype, shape, 300 + i)
        ts.append(t)
        blobs.append(tz.compress_tensor(t, min_compress_bytes=0, chunk_bytes=[4096, 131072][i % 2]).cuda())
    long_t = gen(torch.bfloat16, (2048, 2048), 5)
    long_blob = tz.compress_tensor(long_t, chunk_bytes=1024).cuda()
    ts.append(long_t)
    blobs.append(long_blob)
    outs = tz.decompress_tensors(blobs)
    assert len(outs) == len(ts)
    for i, (o, t) in enumerate(zip(outs, ts)):
        assert o.is_cuda and same(o, t), i
    mixed = tz.decompress_tensors([blobs[0].cpu()] + blobs[1:], device="cuda")
    assert all(same(a, b) for a, b in zip(mixed, outs))
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        on_side = tz.decompress_tensors(blobs[:8])
    side.synchronize()
    assert all(same(o, t) for o, t in zip(on_side, ts[:8]))
    empty = torch.empty(0, dtype=torch.uint8, device="cuda")
    noise = torch.randint(0, 256, (5000,), dtype=torch.uint8, device="cuda")
    cut = long_blob[: 100_000]
    for k, bad in ((0, empty), (2, noise), (3, cut)):
        batch = blobs[:5]
        batch[k] = bad
        if k == 3:
            batch[4] = noise  # a later bad blob: the first one is named
        with pytest.raises(ValueError, match=f"blob {k}"):
            tz.decompress_tensors(batch)
    again = tz.decompress_tensors([blobs[-1], blobs[3]])
    assert same(again[0], long_t) and same(again[1], ts[3])
    # `decompress_tensor` of a GPU blob takes the same path: its errors name no index.
    for bad in (empty, noise, cut):
        with pytest.raises(ValueError) as e:
            tz.decompress_tensor(bad)
        assert not str(e.value).startswith("blob"), e.value
    # So does `blob_info` of a GPU blob: what the CPU copy tells, and the CPU copy's error.
    for b in blobs:
        assert tz.blob_info(b) == tz.blob_info(b.cpu())
    for bad in (empty, noise, cut):
        with pytest.raises(ValueError) as e:
            tz.blob_info(bad)
        with pytest.raises(ValueError) as on_cpu:
            tz.blob_info(bad.cpu())
        assert str(e.value) == str(on_cpu.value)
    assert same(tz.decompress_tensor(long_blob), long_t)


def test_gpu_blobs_whose_prefix_passes_the_first_read(gen):
    """A GPU blob whose directory alone passes the first 64 KiB read (8192 chunks of 1 KiB): its
    prefix is read to its exact length (not the whole blob) and it decodes, alone, in a batch with
    small ones (whose first read is 4 KiB) and through `blob_info`."""
    t = gen(torch.bfloat16, (2048, 2048), 3)
    blob = tz.compress_tensor(t, chunk_bytes=1024).cuda()
    from tensorzip import _codec

    pre = _codec._host_prefix(blob)
    assert 1 << 16 < pre.numel() < blob.numel() // 4
    assert same(tz.decompress_tensor(blob), t)
    small = gen(torch.float16, (300, 7), 4)
    outs = tz.decompress_tensors([tz.compress_tensor(small).cuda(), blob], device="cuda")
    assert same(outs[0], small) and same(outs[1], t)
    assert tz.blob_info(blob)[2] == tuple(t.shape)


def test_gpu_writes_the_cpus_paired_blobs(gen):
    """On a CUDA tensor the GPU encoder writes the CPU engine's format version 2 blob (the
    default) and version 1 blob (`pair_exponents=False`), byte for byte, and each engine decodes
    it."""
    for seed, shape in ((7, (512, 384)), (8, (3000, 1024)), (9, (33,))):
        t = gen(torch.bfloat16, shape, seed)
        for kw in ({}, {"pair_exponents": True, "min_compress_bytes": 0, "condition": False},
                   {"pair_exponents": False}):
            cpu_blob = tz.compress_tensor(t, **kw)
            gpu_blob = tz.compress_tensor(t.cuda(), **kw)
            assert torch.equal(cpu_blob, gpu_blob), (shape, kw)
            assert same(tz.decompress_tensor(gpu_blob, device="cuda"), t)
            assert same(tz.decompress_tensor(gpu_blob, device="cpu"), t)
            if shape == (512, 384) and len(kw) <= 1:
                # The weights pair by default (version 2), not with pair_exponents=False.
                assert bytes(gpu_blob[4:6]) == (b"\x01\x00" if kw else b"\x02\x00")


def test_non_default_stream(gen):
    t = gen(torch.bfloat16, (2048, 1024), 2)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = t.cuda(non_blocking=False) * 1  # produced on s
        blob = tz.compress_tensor(x)
        out = tz.decompress_tensor(blob, device="cuda")
        ok = torch.equal(out.view(torch.uint8), x.view(torch.uint8))  # ordered on s, no host sync
    s.synchronize()
    assert ok
    assert torch.equal(blob, tz.compress_tensor(t))


def test_pinned_blobs(gen):
    t = gen(torch.float32, (512, 512), 3).cuda()
    blob = tz.compress_tensor(t, pin_memory=True)
    assert blob.is_pinned()
    assert same(tz.decompress_tensor(blob, device="cuda"), t)


def test_unaligned_and_non_contiguous_cuda_tensors(gen):
    t = gen(torch.float32, (300, 200), 4)
    raw = torch.empty(t.numel() * 4 + 1, dtype=torch.uint8, device="cuda")[1:]
    raw.copy_(_core.as_bytes(t).cuda())
    assert torch.equal(tz.compress_tensor(raw, min_compress_bytes=0), tz.compress_tensor(_core.as_bytes(t), min_compress_bytes=0))
    tc = t.cuda()
    assert torch.equal(tz.compress_tensor(tc.t()), tz.compress_tensor(t.t()))


def test_gpu_crc32(gen):
    t = gen(torch.bfloat16, (1000, 700), 5).cuda()
    blob, crc = tz.compress_tensor_with_crc32(t, checksum_chunk_bytes=4096)
    assert torch.equal(crc.to(torch.int64), tz.hash_tensor_with_crc32(blob, checksum_chunk_bytes=4096).to(torch.int64))
    assert torch.equal(crc.to(torch.int64), tz.hash_tensor_with_crc32(blob.cuda(), checksum_chunk_bytes=4096).to(torch.int64))
    assert torch.equal(tz.hash_tensor_with_crc32(t).to(torch.int64), tz.hash_tensor_with_crc32(t.cpu()).to(torch.int64))
    # Equal to zlib's, as uint32 CPU tensors, from both GPU calls (they are written into the
    # result tensor by the bindings since 2026-12-05, not passed as a list), 1-byte pieces too.
    data = bytes(blob.numpy())
    for piece in (1, 4096):
        want = [zlib.crc32(data[i : i + piece]) for i in range(0, len(data), piece)]
        for crc in (
            tz.compress_tensor_with_crc32(t, checksum_chunk_bytes=piece)[1],
            tz.hash_tensor_with_crc32(blob.cuda(), checksum_chunk_bytes=piece),
        ):
            assert crc.dtype == torch.uint32 and crc.device.type == "cpu"
            assert crc.to(torch.int64).tolist() == want


def test_corrupted_blobs_rejected_on_the_gpu(gen):
    t = gen(torch.bfloat16, (64, 1000), 6)
    blob = tz.compress_tensor(t, min_compress_bytes=0, chunk_bytes=4096)
    g = torch.Generator().manual_seed(1)
    errors = 0
    for _ in range(200):
        b = blob.clone()
        for _ in range(2):
            i = int(torch.randint(0, b.numel(), (1,), generator=g))
            b[i] ^= 1 << int(torch.randint(0, 8, (1,), generator=g))
        try:
            cpu = tz.decompress_tensor(b, device="cpu")
        except ValueError:
            cpu = None
        try:
            gpu = tz.decompress_tensor(b.cuda())
        except ValueError:
            gpu = None
        assert (cpu is None) == (gpu is None)
        if cpu is None:
            errors += 1
        else:
            assert same(cpu, gpu)
    assert errors > 50
    for cut in (0, 10, 30, blob.numel() // 2, blob.numel() - 1):
        with pytest.raises(ValueError):
            tz.decompress_tensor(blob[:cut].cuda())
    assert same(tz.decompress_tensor(blob.cuda()), t)  # the engine still works


def test_state_dict_round_trip_on_cuda(gen, tmp_path):
    t = gen(torch.bfloat16, (300, 300), 7).cuda()
    cfg = tz.TensorZipConfig()
    c = tz.compress(t, cfg)
    assert c.device.type == "cuda"
    path = tmp_path / "c.pt"
    torch.save(c.state_dict(), path)
    loaded = tz.CompressedTensor.from_state_dict(torch.load(path, map_location="cuda", weights_only=True))
    out = tz.decompress(loaded, cfg)
    assert out.is_cuda and same(out, t)
    assert same(tz.decompress(c.to("cpu"), cfg), t.cpu())
    assert torch.equal(c.state_dict()["tensorzip_state"].cpu(), tz.compress(t.cpu(), cfg).state_dict()["tensorzip_state"])


def test_load_file_on_the_gpu(gen, tmp_path):
    tensors = {
        "a": gen(torch.float32, (1000, 64), 8),
        "b": gen(torch.bfloat16, (128, 256), 9),
        "c": torch.tensor(7, dtype=torch.int64),
        "d": torch.empty(0, 3),
    }
    path = tmp_path / "m.tz"
    tz.save_file(tensors, path)
    back = tz.load_file(path, device="cuda")
    for k, v in tensors.items():
        assert back[k].is_cuda and same(back[k], v), k
    with tz.safe_open(path, framework="pt", device="cuda") as f:
        assert same(f.get_tensor("b"), tensors["b"])
    # Damage anywhere — archive header, index, a blob's header or payload (whose checksum the
    # upload takes on the way), the end — and a truncated file: ValueError naming the file, and
    # nothing decoded from damaged bytes is returned.
    data = bytearray(path.read_bytes())
    for i in (0, 40, len(data) // 3, len(data) // 2, len(data) - 3):
        d = bytearray(data)
        d[i] ^= 4
        bad = tmp_path / f"bad{i}.tz"
        bad.write_bytes(d)
        with pytest.raises(ValueError, match=bad.name):
            tz.load_file(bad, device="cuda")
    trunc = tmp_path / "t.tz"
    trunc.write_bytes(data[: len(data) // 3])
    with pytest.raises(ValueError, match="t.tz"):
        tz.load_file(trunc, device="cuda")


def test_save_file_of_cuda_tensors_encodes_on_the_gpu(gen, tmp_path):
    """save_file of tensors on one GPU encodes them there (never copied to the host) and writes the
    file save_file writes for the same tensors on the CPU, byte for byte: every dtype, empty and
    0-d tensors, a non-contiguous one, an unaligned view, and a 48 MiB one (its blob written from
    the staging buffers); metadata and options kept. Mixed devices go through the CPU."""
    named = [d for d in DTYPES if d in _files._ST_NAMES]
    tensors = {f"t{i}_{str(d)[6:]}": gen(d, (257, 129), i) for i, d in enumerate(named)}
    tensors["big"] = gen(torch.bfloat16, (3072, 8192), 99)
    tensors["empty"] = torch.empty(0, 7)
    tensors["scalar"] = torch.tensor(3.5, dtype=torch.float64)
    tensors["strided"] = gen(torch.float32, (64, 96), 5).t()
    tensors["view"] = gen(torch.float16, (1001,), 6)[1:]
    meta = {"format": "pt", "step": "1200"}
    for kw in ({}, {"chunk_bytes": 4096, "min_compress_bytes": 0, "condition": False}):
        cpu, gpu = tmp_path / "cpu.tz", tmp_path / "gpu.tz"
        tz.save_file({k: v.cpu() for k, v in tensors.items()}, cpu, meta, **kw)
        tz.save_file({k: v.cuda() for k, v in tensors.items()}, gpu, meta, **kw)
        assert cpu.read_bytes() == gpu.read_bytes(), kw
        back = tz.load_file(gpu, device="cuda")
        for k, v in tensors.items():
            assert same(back[k], v), k
    mixed = {"a": tensors["big"].cuda(), "b": tensors["strided"].cpu()}
    tz.save_file(mixed, tmp_path / "mixed.tz")
    tz.save_file({k: v.cpu() for k, v in mixed.items()}, tmp_path / "mixed_cpu.tz")
    assert (tmp_path / "mixed.tz").read_bytes() == (tmp_path / "mixed_cpu.tz").read_bytes()
    # A file that cannot be written: an OSError naming it, nothing left behind.
    with pytest.raises(OSError):
        tz.save_file({"a": tensors["big"].cuda()}, tmp_path / "no" / "such" / "dir.tz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu.tz", "gpu.tz", "mixed.tz", "mixed_cpu.tz"]


def test_engine_memory_is_given_back(tmp_path):
    """The engine keeps freed device memory in the pool for its next call, where torch cannot use
    it: file-level calls trim it to 64 MiB when they end, and release_gpu_memory gives the rest
    back (measured as the device's free memory; torch allocates nothing in between)."""
    slack = 64 << 20  # the pool keeps whole granules of its own above what it is asked to keep
    torch.manual_seed(0)
    x = torch.randn(64 << 20, device="cuda")  # 256 MiB
    torch.cuda.synchronize()
    free = lambda: torch.cuda.mem_get_info()[0]  # noqa: E731
    blob = tz.compress_tensor(x)  # a tensor-level call: its working set stays reserved
    before = free()
    tz.release_gpu_memory()
    assert free() - before > (128 << 20), "a 256 MiB encode's buffers were not given back"
    for call in (lambda: tz.save_file({"x": x}, tmp_path / "x.tz"), lambda: tz.load_file(tmp_path / "x.tz", device="cuda")):
        out = call()
        before = free()
        tz.release_gpu_memory(x.device)
        assert free() - before <= (64 << 20) + slack, "a file-level call left more than 64 MiB reserved"
        del out
    # A safe_open reader keeps its buffers between get_tensor calls and trims when it closes.
    with tz.safe_open(tmp_path / "x.tz", device="cuda") as f:
        y = f.get_tensor("x")
        y2 = f.get_tensor("x")
    before = free()
    tz.release_gpu_memory(x.device)
    assert free() - before <= (64 << 20) + slack, "a closed safe_open reader left more than 64 MiB reserved"
    assert same(y, x) and same(y2, x)
    assert same(tz.decompress_tensor(blob), x.cpu())
    tz.release_gpu_memory(0)
    with pytest.raises(ValueError, match="not a CUDA device"):
        tz.release_gpu_memory("cpu")


def test_slices_with_a_cuda_reader_index_as_torch(gen, tmp_path):
    """`get_slice(name)[index]` with a CUDA reader (the whole tensor decoded on the GPU, then
    indexed) equals torch's indexing of the tensor, errors included, and is on the GPU."""
    tensors = {
        "w": gen(torch.float32, (1000, 64), 21),
        "h": gen(torch.bfloat16, (37, 5, 3), 22),
        "c": gen(torch.complex64, (300, 7), 23),
        "s": torch.arange(50, dtype=torch.uint8).reshape(10, 5),
    }
    path = tmp_path / "gs.tz"
    tz.save_file(tensors, path, chunk_bytes=4096, min_compress_bytes=0)
    indices = [0, -1, 999, slice(10, 20), slice(3, 900, 7), slice(50, 10), (slice(2, 9), slice(1, 4)), (7, 3), 1000]
    with tz.safe_open(path, framework="pt", device="cuda") as f:
        for name, t in tensors.items():
            for idx in indices:
                try:
                    want = t[idx]
                except IndexError:
                    with pytest.raises(IndexError):
                        f.get_slice(name)[idx]
                    continue
                got = f.get_slice(name)[idx]
                assert got.is_cuda and same(got, want), (name, idx)


def test_compressed_linear_on_the_gpu():
    torch.manual_seed(5)
    lin = torch.nn.Linear(384, 256).to(torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_((torch.randn(256, 384) * 0.02).to(torch.bfloat16))
    lin = lin.cuda()
    c = tz.CompressedLinear.from_linear(lin)
    assert c.weight.device.type == "cuda" and c.weight_state.is_cuda
    x = torch.randn(8, 384, device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        want = lin(x)
        assert same(c(x), want)
        # Moved to the host and back, compressed: the header is kept, the result the same.
        c = c.cpu()
        assert not c.weight_state.is_cuda
        assert same(c(x.cpu()), lin.cpu()(x.cpu()))
        c = c.cuda()
        assert same(c(x), want)
    # A CPU checkpoint loaded into a layer on the GPU lands there.
    fresh = tz.CompressedLinear(384, 256, device="cuda")
    fresh.load_state_dict({k: v.cpu() for k, v in c.state_dict().items()})
    assert fresh.weight_state.is_cuda
    with torch.no_grad():
        assert same(fresh(x), want)
    # A host weight compressed into a layer made on the GPU: the state lives on the GPU.
    on_gpu = tz.CompressedLinear(384, 256, bias=False, device="cuda")
    on_gpu.compress_weight(lin.weight.detach().cpu())
    assert on_gpu.weight_state.is_cuda and on_gpu.weight.device.type == "cuda"
    assert same(on_gpu.dequantize().cpu(), lin.weight.detach().cpu())


def test_training_state_saved_from_and_loaded_onto_the_gpu(tmp_path):
    torch.manual_seed(6)
    model = torch.nn.Linear(256, 128).cuda()
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 256, device="cuda")).sum().backward()
    opt.step()
    ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 1}
    tz.save(ckpt, tmp_path / "c.tz")
    back = tz.load(tmp_path / "c.tz", device="cuda")
    assert back["step"] == 1
    assert back["model"]["weight"].is_cuda and same(back["model"]["weight"], ckpt["model"]["weight"])
    for k in ("exp_avg", "exp_avg_sq"):
        assert same(back["optimizer"]["state"][0][k], ckpt["optimizer"]["state"][0][k])


def test_files_of_more_tensors_than_one_launch_takes(gen, tmp_path):
    """A file of more tensors than one GPU launch takes (4096): save_file of CUDA tensors writes
    the CPU's file, load_file and safe_open onto the GPU read it back in several launches, every
    tensor bit-exact (the last launch a partial one)."""
    dtypes = [torch.bfloat16, torch.float32, torch.float16, torch.int8]
    tensors = {f"t{i:05}": gen(dtypes[i % 4], (i % 7 + 1, 3), i) for i in range(2 * 4096 + 5)}
    cpu, gpu = tmp_path / "cpu.tz", tmp_path / "gpu.tz"
    tz.save_file(tensors, cpu)
    tz.save_file({k: v.cuda() for k, v in tensors.items()}, gpu)
    assert cpu.read_bytes() == gpu.read_bytes()
    back = tz.load_file(gpu, device="cuda")
    assert sorted(back) == sorted(tensors)
    for k, v in tensors.items():
        assert back[k].is_cuda and same(back[k], v), k
    with tz.safe_open(gpu, framework="pt", device="cuda") as f:
        assert same(f.get_tensor("t08196"), tensors["t08196"])
