"""cuZipNN's API: `compress_tensor`, `decompress_tensor`, `compress_tensor_with_crc32`,
`hash_tensor_with_crc32` — same names, keywords, defaults and return types.

Differences (improvements only):

* It runs without a GPU: CPU tensors are compressed by the CPU engine, and `decompress_tensor`
  decodes on the CPU when the target device is the CPU or no GPU engine is usable. CUDA tensors are
  compressed, and blobs decoded to a CUDA device, by the GPU engine, on torch's current stream.
  Both engines write the same bytes.
* A blob that is not ours, truncated, or damaged in its header or tables raises `ValueError` naming
  the problem (cuZipNN: undefined behaviour). A blob has no checksum of its own: damage to its
  payload can decode to other values without an error; `compress_tensor_with_crc32` gives the
  CRC-32s to keep and `hash_tensor_with_crc32` recomputes them.
* The blob format is tensorzip's (docs/FORMAT.md), not cuZipNN's; `sub_chunk_bytes` is validated
  and otherwise ignored (nvCOMP's sub-chunks have no counterpart: tensorzip's adaptive unit is
  `block_units`). Extra keyword-only options: `block_units`, `max_tables`, `condition`,
  `pair_exponents` (format version 2: bf16 exponents two units a symbol; on by default,
  `False` writes version 1 only).
"""

from __future__ import annotations

import contextlib
import ctypes

import torch

from . import _core
from . import _tensorzip as _native

DEFAULT_CHUNK_BYTES = 128 * 1024
DEFAULT_SUB_CHUNK_BYTES = 8 * 1024
DEFAULT_PASSTHROUGH_THRESHOLD = 0.95
DEFAULT_MIN_COMPRESS_BYTES = 64 * 1024
DEFAULT_CHECKSUM_CHUNK_BYTES = 16 * 1024
DEFAULT_BLOCK_UNITS = 4096
DEFAULT_MAX_TABLES = 8
DEFAULT_CONDITION = _core.DEFAULT_CONDITION
DEFAULT_PAIR_EXPONENTS = _core.DEFAULT_PAIR_EXPONENTS

_MAX_NDIM = 64


def _options(chunk_bytes, passthrough_threshold, min_compress_bytes, block_units, max_tables, condition, pair_exponents):
    opts = _core.Options(
        chunk_bytes, block_units, passthrough_threshold, min_compress_bytes, max_tables, condition, pair_exponents
    )
    _core.check_options(opts)
    return opts


def _check_tensor(tensor) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in _core.SUPPORTED_DTYPES:
        raise TypeError(f"unsupported dtype {tensor.dtype}")
    if tensor.dim() > _MAX_NDIM:
        raise ValueError(f"at most {_MAX_NDIM} dimensions are supported")
    _core.check_memory(tensor)


def _check_piece(checksum_chunk_bytes) -> None:
    """A checksum piece size: an int in 1 ..= 2^63 - 1 (above, a bare OverflowError came from the
    conversion to Rust)."""
    if isinstance(checksum_chunk_bytes, bool) or not isinstance(checksum_chunk_bytes, int):
        raise TypeError("checksum_chunk_bytes must be an int")
    if not 0 < checksum_chunk_bytes < 1 << 63:
        raise ValueError(f"checksum_chunk_bytes must be in 1 ..= 2^63 - 1, not {checksum_chunk_bytes}")


def _compress(tensor: torch.Tensor, opts: _core.Options, pin_memory: bool, checksum_chunk_bytes: int | None):
    """Blob (1-D uint8 CPU tensor) and, if asked, the blob's CRC-32s (1-D uint32 CPU tensor)."""
    _check_tensor(tensor)
    _core.check_bool("pin_memory", pin_memory)
    if checksum_chunk_bytes is not None:
        _check_piece(checksum_chunk_bytes)
    data = _core.as_bytes(tensor)
    shape = list(tensor.shape)
    name = _core.dtype_name(tensor.dtype)
    crc = None
    if data.is_cuda and _core.gpu_available():
        dev = data.device
        gb = _native.gpu_compress(
            _core.cuda_index(dev), _core.stream_of(dev), data.data_ptr(), data.numel(), name, shape, opts.args()
        )
        if checksum_chunk_bytes is not None:
            crc = _crc_out(len(gb), checksum_chunk_bytes)
            gb.crc32(checksum_chunk_bytes, crc.data_ptr(), crc.numel())
        blob = torch.empty(len(gb), dtype=torch.uint8, pin_memory=pin_memory)
        gb.download(blob.data_ptr() if blob.numel() else 0, pin_memory)
        del data
        return blob, crc
    if data.is_cuda:
        data = data.cpu()
    elif data.device.type != "cpu":
        raise ValueError(f"tensors on {data.device} are not supported (CPU or CUDA)")
    blob = _core.from_rust(_native.compress(data.data_ptr(), data.numel(), name, shape, opts.args()))
    if pin_memory and torch.cuda.is_available():
        blob = blob.pin_memory()
    if checksum_chunk_bytes is not None:
        crc = _crc_cpu(blob, checksum_chunk_bytes)
    return blob, crc


def _crc_out(nbytes: int, piece: int) -> torch.Tensor:
    """The CPU tensor the CRC-32s of `nbytes` bytes in pieces of `piece` are written into (by
    Rust: a list of ints in between cost ~50 bytes a piece)."""
    return torch.empty(-(-nbytes // piece), dtype=torch.uint32)


def _crc_cpu(data: torch.Tensor, piece: int) -> torch.Tensor:
    data = _core.as_bytes(data)
    out = _crc_out(data.numel(), piece)
    _native.crc32_pieces(data.data_ptr(), data.numel(), piece, out.data_ptr(), out.numel())
    return out


def compress_tensor(
    tensor: torch.Tensor,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    sub_chunk_bytes: int = DEFAULT_SUB_CHUNK_BYTES,
    passthrough_threshold: float = DEFAULT_PASSTHROUGH_THRESHOLD,
    min_compress_bytes: int = DEFAULT_MIN_COMPRESS_BYTES,
    pin_memory: bool = False,
    block_units: int = DEFAULT_BLOCK_UNITS,
    max_tables: int = DEFAULT_MAX_TABLES,
    condition: bool = DEFAULT_CONDITION,
    pair_exponents: bool = DEFAULT_PAIR_EXPONENTS,
) -> torch.Tensor:
    """Compress a tensor losslessly; returns the blob as a 1-D uint8 CPU tensor.

    CUDA tensors are compressed on their GPU (torch's current stream), CPU tensors on the CPU; the
    blob is the same either way. A non-contiguous tensor is compressed in row-major order.

    chunk_bytes: bytes of original data per independently coded chunk (a multiple of 8, at most
    16 MiB). sub_chunk_bytes: accepted for cuZipNN compatibility (must be positive; unused).
    passthrough_threshold: a block stays coded only below this fraction of its raw size, in (0, 1].
    min_compress_bytes: tensors smaller than this are stored uncompressed. pin_memory: return the
    blob in pinned memory (when CUDA is available). block_units, max_tables, condition,
    pair_exponents: tensorzip's own encoder options (docs/FORMAT.md; pair_exponents, on by default,
    writes format version 2 where it pays: readers older than format version 2 refuse it).
    """
    _check_sub_chunk(sub_chunk_bytes)
    opts = _options(
        chunk_bytes, passthrough_threshold, min_compress_bytes, block_units, max_tables, condition, pair_exponents
    )
    blob, _ = _compress(tensor, opts, pin_memory, None)
    return blob


def compress_tensor_with_crc32(
    tensor: torch.Tensor,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    sub_chunk_bytes: int = DEFAULT_SUB_CHUNK_BYTES,
    passthrough_threshold: float = DEFAULT_PASSTHROUGH_THRESHOLD,
    min_compress_bytes: int = DEFAULT_MIN_COMPRESS_BYTES,
    checksum_chunk_bytes: int = DEFAULT_CHECKSUM_CHUNK_BYTES,
    pin_memory: bool = False,
    block_units: int = DEFAULT_BLOCK_UNITS,
    max_tables: int = DEFAULT_MAX_TABLES,
    condition: bool = DEFAULT_CONDITION,
    pair_exponents: bool = DEFAULT_PAIR_EXPONENTS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`compress_tensor` (same arguments, same blob), plus the CRC-32 (as `zlib.crc32`) of every
    `checksum_chunk_bytes` bytes of the blob, the last piece possibly shorter, as a 1-D uint32 CPU
    tensor. Computed on the GPU for CUDA tensors (before the blob is copied back)."""
    _check_sub_chunk(sub_chunk_bytes)
    _check_piece(checksum_chunk_bytes)  # None too: the checksums are this call's result
    opts = _options(
        chunk_bytes, passthrough_threshold, min_compress_bytes, block_units, max_tables, condition, pair_exponents
    )
    blob, crc = _compress(tensor, opts, pin_memory, checksum_chunk_bytes)
    assert crc is not None
    return blob, crc


def hash_tensor_with_crc32(
    tensor: torch.Tensor, *, checksum_chunk_bytes: int = DEFAULT_CHECKSUM_CHUNK_BYTES
) -> torch.Tensor:
    """CRC-32 (as `zlib.crc32`) of each `checksum_chunk_bytes` bytes of the tensor's bytes in
    row-major order, the last piece possibly shorter, as a 1-D uint32 CPU tensor. Computed on the
    GPU for CUDA tensors. Applied to a blob, it reproduces `compress_tensor_with_crc32`'s checksums."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    _check_piece(checksum_chunk_bytes)
    data = _core.as_bytes(tensor)
    if data.is_cuda and _core.gpu_available():
        dev = data.device
        out = _crc_out(data.numel(), checksum_chunk_bytes)
        _native.gpu_crc32(
            _core.cuda_index(dev), _core.stream_of(dev), data.data_ptr(), data.numel(), checksum_chunk_bytes,
            out.data_ptr(), out.numel(),
        )
        return out
    return _crc_cpu(data.cpu(), checksum_chunk_bytes)


def _check_sub_chunk(sub_chunk_bytes) -> None:
    if isinstance(sub_chunk_bytes, bool) or not isinstance(sub_chunk_bytes, int):
        raise TypeError("sub_chunk_bytes must be an int")
    if sub_chunk_bytes <= 0:
        raise ValueError("sub_chunk_bytes must be positive")


def _target_device(blob: torch.Tensor | None, device) -> torch.device:
    """`device`, else the blob's if it is on a GPU, else the current CUDA device, else the CPU."""
    if device is not None:
        return _core.target_device(device)
    if blob is not None and blob.is_cuda:
        return blob.device
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def blob_info(blob: torch.Tensor) -> tuple[str, torch.dtype, tuple[int, ...], int]:
    """(scheme, dtype, shape, decoded bytes) of a blob ("stored" or "planes"), validating its header,
    tables and directory; raises ValueError for anything that is not a valid tensorzip blob. For a
    CUDA blob only its prefix is copied to the host (by the engine, where it runs: one gathering
    launch and one copy, parsed natively)."""
    _check_blob(blob)
    blob = blob.detach()
    if blob.is_cuda and _core.gpu_available():
        with torch.cuda.device(blob.device):
            _, described = _read_resident([blob], blob.device, indexed=False)
        scheme, name, shape, nbytes = described[0]
    elif blob.is_cuda:
        scheme, name, shape, nbytes = _native.inspect_prefix(_bytes_of(_host_prefix(blob)), blob.numel())
    else:
        data = _core.as_bytes(blob)
        scheme, name, shape, nbytes = _native.inspect(data.data_ptr(), data.numel())
    return scheme, _core.dtype_of(name), tuple(shape), nbytes


def _bytes_of(t: torch.Tensor) -> bytes:
    """The bytes of a contiguous CPU uint8 tensor."""
    if t.numel() == 0:
        return b""
    return ctypes.string_at(t.data_ptr(), t.numel())


def _host_prefix(blob: torch.Tensor, head: torch.Tensor | None = None) -> torch.Tensor:
    """A CPU uint8 tensor holding at least the blob's header, tables and directory: the blob itself
    if it is on the CPU; for a CUDA blob its first 64 KiB (or `head`, its first bytes already on
    the host), then as many bytes as its prefix needs (`prefix_len`: exact once the header and
    tables are in, so two copies in all but blobs of over ~64 KiB of tables)."""
    if not blob.is_cuda:
        return _core.as_bytes(blob)
    n = blob.numel()
    if head is None:
        head = blob[: min(n, 1 << 16)].cpu()
    need = _native.prefix_len(_bytes_of(head), n)
    while need > head.numel():
        head = blob[:need].cpu()
        need = _native.prefix_len(_bytes_of(head), n)
    return head


@contextlib.contextmanager
def _blob_index(k: int):
    """A ValueError raised inside names blob `k` of a batch."""
    try:
        yield
    except ValueError as e:
        raise ValueError(f"blob {k}: {e}") from None


def _host_prefixes(blobs: list[torch.Tensor]) -> list[torch.Tensor]:
    """`_host_prefix` of each blob, the first 4 KiB of all non-empty CUDA blobs of a device read
    back by one copy (one wait, where a copy each would wait once a blob), the rest of a longer
    prefix by a copy of its own. A ValueError names the blob's index."""
    heads: dict[int, torch.Tensor] = {}
    by_device: dict[torch.device, list[int]] = {}
    for k, b in enumerate(blobs):
        if b.is_cuda and b.numel():
            by_device.setdefault(b.device, []).append(k)
    for ks in by_device.values():
        # 4 KiB each: the whole prefix of a tensor of up to ~32 MiB (bf16, 128 KiB chunks).
        firsts = [blobs[k][: min(blobs[k].numel(), 1 << 12)] for k in ks]
        host = torch.cat(firsts).cpu()
        heads.update(zip(ks, torch.split(host, [h.numel() for h in firsts])))
    out = []
    for k, b in enumerate(blobs):
        with _blob_index(k):
            out.append(_host_prefix(b, heads.get(k)))
    return out


def _check_blob(blob) -> None:
    if not isinstance(blob, torch.Tensor):
        raise TypeError(f"blob must be a torch.Tensor, got {type(blob).__name__}")
    if blob.dtype != torch.uint8 or blob.dim() != 1:
        raise ValueError("blob must be a 1-D uint8 tensor")
    _core.check_memory(blob, "blob")


def _prepared(blob) -> torch.Tensor:
    _check_blob(blob)
    blob = blob.detach()
    return blob if blob.is_contiguous() else blob.contiguous()


def _on_gpu(blob: torch.Tensor, target: torch.device, pre: torch.Tensor):
    """(blob on `target`, its host prefix `pre`, dtype, shape, decoded bytes) for a GPU decode,
    validating the blob's header, tables and directory from the prefix first."""
    if blob.is_cuda:
        _, name, shape, nbytes = _native.inspect_prefix(_bytes_of(pre), blob.numel())
    else:
        _, name, shape, nbytes = _native.inspect(_ptr(pre), pre.numel())
    if blob.is_cuda or blob.is_pinned() or blob.numel() == 0:
        dev_blob = blob.to(target, non_blocking=True)
    else:
        # Pageable host memory: through the engine's page-locked staging buffers.
        dev_blob = torch.empty(blob.numel(), dtype=torch.uint8, device=target)
        _native.gpu_upload(_core.cuda_index(target), _core.stream_of(target), blob.data_ptr(), blob.numel(), dev_blob.data_ptr())
    return dev_blob, pre, _core.dtype_of(name), shape, nbytes


def _cpu_output(blob: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int, int]]:
    """A host blob's new output tensor and its decode job (blob address, blob bytes, output
    address, output bytes), validating the blob first."""
    _, name, shape, nbytes = _native.inspect(_ptr(blob), blob.numel())
    out = _core.empty(shape, _core.dtype_of(name))
    return out, (_ptr(blob), blob.numel(), _ptr(out), nbytes)


def _on_cpu(blob: torch.Tensor, target: torch.device) -> torch.Tensor:
    out, job = _cpu_output(blob.cpu() if blob.is_cuda else blob)
    _native.decompress_into(*job)
    return out if target.type == "cpu" else out.to(target)


def _ptr(t: torch.Tensor) -> int:
    """The address of a contiguous tensor's bytes (0 when it has none). Outputs are new tensors of
    `_core.empty`, contiguous from their data pointer: their address needs no `as_bytes` view
    (whose checks cost ~4 us a tensor on the CPU VM; docs/BENCHMARKS.md, 2026-12-07)."""
    return t.data_ptr() if t.numel() else 0


def decompress_tensor(blob: torch.Tensor, *, device: torch.device | str | int | None = None) -> torch.Tensor:
    """Decompress a blob (on the CPU or a GPU) into a tensor on `device`.

    The default device is the blob's if it is on a GPU, else the current CUDA device, else (no CUDA
    at all) the CPU. Decoding runs on that GPU (torch's current stream) or, for a CPU target or when
    the GPU engine cannot run, on the CPU. A blob that is not a valid tensorzip blob raises
    ValueError naming the problem; nothing is read or written out of bounds.
    """
    blob = _prepared(blob)
    target = _target_device(blob, device)
    if target.type == "cuda" and _core.gpu_available():
        with torch.cuda.device(target):
            if blob.is_cuda and blob.device.index == _core.cuda_index(target):
                return _decompress_resident([blob], target, indexed=False)[0]
            dev_blob, pre, dtype, shape, nbytes = _on_gpu(blob, target, _host_prefix(blob))
            out = _core.empty(shape, dtype, target)
            _native.gpu_decompress(
                _core.cuda_index(target),
                _core.stream_of(target),
                dev_blob.data_ptr(),
                dev_blob.numel(),
                _ptr(pre),
                pre.numel(),
                _ptr(out),
                nbytes,
            )
        return out
    return _on_cpu(blob, target)


def _decompress_resident(blobs: list[torch.Tensor], target: torch.device, indexed: bool = True) -> list[torch.Tensor]:
    """`decompress_tensors` of blobs all on the GPU `target` (and `decompress_tensor` of one, with
    `indexed` false): the prefixes read back, gathered, and parsed by one native call
    (`gpu_read_layouts`), the outputs allocated here, all blobs decoded by a second
    (`gpu_decode_layouts`): per blob, Python only makes its output. A bad blob raises ValueError
    (naming its index where `indexed`) before anything is decoded."""
    layouts, described = _read_resident(blobs, target, indexed)
    outs = []
    for k, (_, name, shape, _) in enumerate(described):
        with _blob_index(k) if indexed else contextlib.nullcontext():
            outs.append(_core.empty(shape, _core.dtype_of(name), target))
    _native.gpu_decode_layouts(
        _core.cuda_index(target),
        _core.stream_of(target),
        layouts,
        [(_ptr(o), nbytes) for o, (_, _, _, nbytes) in zip(outs, described)],
    )
    return outs


def _read_resident(
    blobs: list[torch.Tensor], device: torch.device, indexed: bool
) -> tuple[_native.GpuLayouts, list[tuple[str, str, list[int], int]]]:
    """The layouts (opaque, for `gpu_decode_layouts`) and descriptions (scheme, dtype name, shape,
    decoded bytes) of blobs all on the GPU `device`: their prefixes read back by the engine in one
    gathering copy a round and parsed natively (`gpu_read_layouts`). A bad blob raises ValueError,
    naming its index where `indexed`."""
    index, stream = _core.cuda_index(device), _core.stream_of(device)
    return _native.gpu_read_layouts(index, stream, [(_ptr(b), b.numel()) for b in blobs], indexed)


def decompress_tensors(blobs, *, device: torch.device | str | int | None = None) -> list[torch.Tensor]:
    """Decompress a sequence of blobs into a list of tensors on `device`, on a GPU in one launch.

    The batch form of `decompress_tensor`: the default device is that of the first blob on a GPU,
    else the current CUDA device, else the CPU. On a GPU every blob's header, tables and directory
    are checked first (a bad one raises ValueError naming its index, and nothing is decoded), then
    all blobs are decoded by one launch of the decoder (torch's current stream), so that many small
    tensors — a model's — keep the GPU busy together. On the CPU they are decoded concurrently, on
    all cores, by one call.
    """
    if isinstance(blobs, torch.Tensor):
        raise TypeError("blobs must be a sequence of blobs, not one tensor (decompress_tensor takes one)")
    blobs = [_prepared(b) for b in blobs]
    target = _target_device(next((b for b in blobs if b.is_cuda), None), device)
    if target.type == "cuda" and _core.gpu_available():
        with torch.cuda.device(target):
            index = _core.cuda_index(target)
            if blobs and all(b.is_cuda and b.device.index == index for b in blobs):
                return _decompress_resident(blobs, target)
            staged = []
            for k, (b, pre) in enumerate(zip(blobs, _host_prefixes(blobs))):
                with _blob_index(k):
                    staged.append(_on_gpu(b, target, pre))
            outs = [_core.empty(shape, dtype, target) for (_, _, dtype, shape, _) in staged]
            jobs = []
            for (dev_blob, pre, _, _, nbytes), out in zip(staged, outs):
                jobs.append((dev_blob.data_ptr(), dev_blob.numel(), _ptr(pre), pre.numel(), _ptr(out), nbytes))
            _native.gpu_decompress_batch(_core.cuda_index(target), _core.stream_of(target), jobs)
        return outs
    # On the CPU: every blob checked and its output allocated, then all decoded by one call,
    # concurrently (a model's small tensors, a chunk or two each, keep every core busy together).
    outs = []
    cpu_jobs = []
    for k, b in enumerate(blobs):
        with _blob_index(k):
            out, job = _cpu_output(b.cpu() if b.is_cuda else b)
        outs.append(out)
        cpu_jobs.append(job)
    _native.decompress_batch_into(cpu_jobs)
    return outs if target.type == "cpu" else [o.to(target) for o in outs]
