"""Files, mirroring `safetensors.torch`: `save_file`, `load_file`, `safe_open`; `save_dir` /
`load_dir`, a compressed model directory sharded as Hugging Face checkpoints are; and
`compress_file` / `decompress_file`, a `.safetensors` file to an archive and back without loading
its tensors (what `tensorzip compress` / `decompress` do).

The file is a tensorzip archive of the safetensors file the tensors make (the format of
`tensorzip compress`; `tensorzip decompress` turns it back into that `.safetensors` file, byte for
byte). Reading decodes only the tensors asked for (and `get_slice` only the rows asked for); every
blob's checksum is checked before it is decoded and a whole tensor's CRC-32 after. `load_file(..., device="cuda")` decodes all tensors on
the GPU in one launch, into tensors torch allocates on that device.
"""

from __future__ import annotations

import errno
import math
import os
import torch

from . import _core
from . import _tensorzip as _native
from . import _codec
from ._codec import (
    DEFAULT_BLOCK_UNITS,
    DEFAULT_CHUNK_BYTES,
    DEFAULT_CONDITION,
    DEFAULT_MAX_TABLES,
    DEFAULT_PAIR_EXPONENTS,
)

# safetensors dtype names of torch dtypes (as safetensors.torch writes them).
_ST_NAMES: dict[torch.dtype, str] = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.complex64: "C64",
}
for _name, _st in (
    ("uint16", "U16"),
    ("uint32", "U32"),
    ("uint64", "U64"),
    ("float8_e4m3fn", "F8_E4M3"),
    ("float8_e5m2", "F8_E5M2"),
    ("float8_e4m3fnuz", "F8_E4M3FNUZ"),
    ("float8_e5m2fnuz", "F8_E5M2FNUZ"),
    ("float8_e8m0fnu", "F8_E8M0"),
):
    if hasattr(torch, _name):
        _ST_NAMES[getattr(torch, _name)] = _st
# F4 holds two 4-bit values a byte. torch keeps it as float4_e2m1fn_x2, whose last dimension
# counts bytes; the safetensors header counts values (twice as many), as safetensors.torch
# writes and reads it (`_file_shape`, `_torch_shape`).
if hasattr(torch, "float4_e2m1fn_x2"):
    _ST_NAMES[torch.float4_e2m1fn_x2] = "F4"
_TORCH_OF: dict[str, torch.dtype] = {v: k for k, v in _ST_NAMES.items()}


def _torch_shape(st_name: str, shape) -> list[int]:
    """The torch shape of a tensor the header lists with `st_name` and `shape`."""
    if st_name != "F4":
        return list(shape)
    if not shape or shape[-1] % 2:
        raise ValueError(f"an F4 tensor of shape {list(shape)}: its last dimension must be even (two values a byte)")
    return [*shape[:-1], shape[-1] // 2]


def _file_shape(t: torch.Tensor) -> list[int]:
    """The shape the header lists for tensor `t` (`_torch_shape`'s inverse)."""
    if _ST_NAMES.get(t.dtype) != "F4":
        return list(t.shape)
    if t.dim() == 0:
        raise ValueError("a 0-d float4_e2m1fn_x2 tensor has no F4 shape (safetensors refuses it too)")
    return [*t.shape[:-1], t.shape[-1] * 2]


def _torch_dtype(st_name: str) -> torch.dtype:
    try:
        return _TORCH_OF[st_name]
    except KeyError:
        raise ValueError(f"tensors of safetensors dtype {st_name} cannot be loaded by this torch") from None


def save_file(
    tensors: dict[str, torch.Tensor],
    filename: str | bytes | os.PathLike,
    metadata: dict[str, str] | None = None,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    passthrough_threshold: float = 0.95,
    min_compress_bytes: int = 1024,
    block_units: int = DEFAULT_BLOCK_UNITS,
    max_tables: int = DEFAULT_MAX_TABLES,
    condition: bool = DEFAULT_CONDITION,
    pair_exponents: bool = DEFAULT_PAIR_EXPONENTS,
) -> None:
    """Saves `tensors` (name -> tensor, any device; each contiguous or made so) as a tensorzip
    archive at `filename`, written through a temporary file renamed into place. `metadata` is the
    safetensors header's string-to-string `__metadata__`. Tensors that share memory are saved as
    copies each (as `safetensors.torch.save_file` refuses to; here no sharing is recorded). When
    every tensor is on one CUDA device (and the GPU engine is usable) they are encoded there, on
    torch's current stream, and only their blobs come to the host; the file is the same either
    way."""
    if not isinstance(tensors, dict):
        raise TypeError(f"tensors must be a dict of name -> torch.Tensor, not {type(tensors).__name__}")
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("metadata must be a dict of str -> str")
    opts = _codec._options(
        chunk_bytes, passthrough_threshold, min_compress_bytes, block_units, max_tables, condition, pair_exponents
    )
    # Tensors all on one GPU (a model's state_dict on its device) are encoded there and never
    # copied to the host; any other mix goes through the CPU engine (CUDA tensors copied first).
    devices = {t.device for t in tensors.values() if isinstance(t, torch.Tensor)}
    on_gpu = (
        len(devices) == 1
        and len(tensors) > 0
        and next(iter(devices)).type == "cuda"
        and _core.gpu_available()
    )
    keep = []
    entries = []
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, not {type(name).__name__}")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name!r}: expected a torch.Tensor, got {type(t).__name__}")
        if t.layout != torch.strided:
            raise ValueError(f"{name!r}: only strided tensors can be saved, not {t.layout}")
        st = _ST_NAMES.get(t.dtype)
        if st is None:
            raise TypeError(f"{name!r}: dtype {t.dtype} has no safetensors name")
        # Before `.cpu()`, which raises torch's own error for a meta tensor.
        _core.check_memory(t, repr(name))
        data = _core.as_bytes(t if on_gpu else t.cpu())
        keep.append(data)
        entries.append((name, st, _file_shape(t), data.data_ptr() if data.numel() else 0, data.numel()))
    # safetensors orders the header and the data by (dtype alignment, name); name order is stable
    # and enough here: offsets are recorded per tensor.
    entries.sort(key=lambda e: e[0])
    meta = sorted(metadata.items()) if metadata is not None else None
    if on_gpu:
        dev = next(iter(devices))
        with torch.cuda.device(dev):
            _native.save_file_gpu(
                os.fsdecode(filename), entries, meta, opts.args(), _core.cuda_index(dev), _core.stream_of(dev)
            )
    else:
        _native.save_file(os.fsdecode(filename), entries, meta, opts.args())


class safe_open:  # noqa: N801 (the name mirrors safetensors)
    """Lazy reader: `with safe_open(path, framework="pt", device="cpu") as f: f.get_tensor(name)`
    decodes that tensor only. `keys()`, `metadata()` and `get_slice(name)[...]` as in safetensors."""

    def __init__(self, filename: str | bytes | os.PathLike, framework: str = "pt", device: str | int | torch.device = "cpu"):
        if framework not in ("pt", "torch"):
            raise ValueError(f"framework {framework!r} is not supported (only 'pt')")
        self._name = os.fsdecode(filename)
        self._device = _core.target_device(device)
        self._handle: _native.ArchiveFile | None = _native.open_archive(self._name)
        self._used_gpu = False  # whether reads went through the GPU engine (trimmed on exit)

    @property
    def _file(self):
        # After `with` the mapping is released; a use then says so (as a closed Python file does).
        if self._handle is None:
            raise ValueError(f"{self._name}: the archive is closed (used after its `with` block)")
        return self._handle

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc) -> None:
        self._handle = None
        if self._used_gpu:
            # One-by-one reads kept the engine's buffers between them; the reader is done.
            self._used_gpu = False
            _native.gpu_trim(_core.cuda_index(self._device))

    def keys(self) -> list[str]:
        return sorted(self._file.keys())

    def offset_keys(self) -> list[str]:
        """Names in the order of their data in the file."""
        return self._file.keys()

    def metadata(self) -> dict[str, str] | None:
        return self._file.metadata()

    def _empty(self, name: str, device: torch.device) -> torch.Tensor:
        if not isinstance(name, str):
            raise TypeError(f"a tensor name is a str, not {type(name).__name__}")
        st, shape, nbytes = self._file.info(name)
        dtype = _torch_dtype(st)
        shape = _torch_shape(st, shape)
        # Checked before allocating: a forged header's shape may ask for far more than its bytes.
        if math.prod(shape) * dtype.itemsize != nbytes:
            raise ValueError(f"{name!r}: {nbytes} bytes do not make a {dtype} tensor of shape {tuple(shape)}")
        return _core.empty(shape, dtype, device)

    def get_tensor(self, name: str) -> torch.Tensor:
        """Decodes tensor `name` (only its blob is read) onto the reader's device."""
        if self._device.type == "cuda" and _core.gpu_available():
            out = self._empty(name, self._device)
            _decode_gpu(self._file, [name], [out], self._device, False)
            self._used_gpu = True
            return out
        out = self._empty(name, torch.device("cpu"))
        self._file.decode_into(name, _codec._ptr(out), out.nbytes)
        return out if self._device.type == "cpu" else out.to(self._device)

    def get_slice(self, name: str) -> "_Slice":
        if not isinstance(name, str):
            raise TypeError(f"a tensor name is a str, not {type(name).__name__}")
        return _Slice(self, name)


class _Slice:
    """`safe_open.get_slice(name)`: shape and dtype without decoding. Indexing decodes only the rows
    (indices of the first dimension) the index selects, from the first to the last, as one range of
    elements, so that a tensor-parallel shard reads only the chunks that hold it; the rest of the
    index applies to those rows. Indices whose rows cannot be told without the data (tensors,
    lists, booleans, `None` or `...` first) decode the whole tensor, as on a CUDA device, where the
    GPU decodes it. The blob's checksum is checked; the original bytes' CRC-32 covers the whole
    tensor, so a part of it is not checked against that."""

    def __init__(self, f: safe_open, name: str):
        self._f, self._name = f, name
        st, shape, _ = f._file.info(name)
        # The header's shape; rows are counted in the torch tensor's (F4: `_torch_shape`).
        self._shape, self._st = list(shape), st
        self._rows_shape = _torch_shape(st, shape)

    def get_shape(self) -> list[int]:
        return list(self._shape)

    def get_dtype(self) -> str:
        return self._st

    def __getitem__(self, index) -> torch.Tensor:
        f, dev = self._f, self._f._device
        shape = self._rows_shape
        if self._st == "F4":
            # The header counts values, torch's last dimension bytes (two values each): an index
            # into that dimension would mean two things (safetensors refuses F4 slices).
            items = index if isinstance(index, tuple) else (index,)
            if len(shape) < 2 or len(items) >= len(shape) or any(i is Ellipsis or i is None for i in items):
                raise ValueError(
                    f"{self._name!r}: an F4 tensor is sliced by its leading dimensions only (its last one "
                    "holds two values a byte); get_tensor gives the whole tensor"
                )
        rows = None if dev.type == "cuda" and _core.gpu_available() else _rows_of(index, shape)
        if rows is None:
            return f.get_tensor(self._name)[index]
        r0, r1, rest = rows
        inner = 1
        for d in shape[1:]:
            inner *= d
        part = _core.empty((r1 - r0, *shape[1:]), _torch_dtype(self._st))
        b = _core.as_bytes(part)
        isz = part.element_size()
        f._file.decode_range_into(self._name, r0 * inner * isz, r1 * inner * isz, b.data_ptr() if b.numel() else 0, b.numel())
        out = part[rest]
        return out if dev.type == "cpu" else out.to(dev)


def _rows_of(index, shape: list[int]):
    """For `tensor[index]` on a tensor of `shape`: the rows `r0:r1` of its first dimension that the
    index reads and the index to apply to those rows alone, or None where that is not known from
    the index (or the tensor has no dimension)."""
    if not shape:
        return None
    items = index if isinstance(index, tuple) else (index,)
    if not items:
        return None
    first, n = items[0], shape[0]
    if isinstance(first, bool) or not isinstance(first, (int, slice)):
        return None
    if isinstance(first, int):
        k = first + n if first < 0 else first
        if not 0 <= k < n:
            return None  # torch raises its IndexError on the whole tensor
        return k, k + 1, (0, *items[1:])
    if first.step is not None and (not isinstance(first.step, int) or first.step <= 0):
        return None  # torch refuses non-positive steps itself
    for v in (first.start, first.stop):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            return None
    picked = range(*first.indices(n))
    if len(picked) == 0:
        return 0, 0, (slice(0, 0), *items[1:])
    r0, r1 = picked[0], picked[-1] + 1
    return r0, r1, (slice(0, r1 - r0, picked.step), *items[1:])


def _decode_gpu(file, names: list[str], outs: list[torch.Tensor], device: torch.device, trim: bool) -> None:
    """`names` into `outs`, one launch per 4096 of them; with `trim`, the engine's pool is
    trimmed to 64 MiB after it (a whole file's load; one-by-one reads keep their buffers for the
    next and trim when the reader closes)."""
    with torch.cuda.device(device):
        # New tensors of `_empty`: addressed as `_codec._ptr` does (no `as_bytes` view).
        ptrs = [_codec._ptr(o) for o in outs]
        file.gpu_decode(names, ptrs, _core.cuda_index(device), _core.stream_of(device), trim)


def load_file(filename: str | bytes | os.PathLike, device: str | int | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Loads every tensor of a tensorzip archive onto `device`. On a CUDA device the tensors are
    decoded by the GPU, one launch per 4096 of them (the blobs are uploaded once, compressed); on
    the CPU by all cores. Checksums are checked before and after decoding; a damaged file raises
    ValueError."""
    return _load_all(safe_open(filename, device=device))


def _load_all(f: "safe_open") -> dict[str, torch.Tensor]:
    """Every tensor of an open archive onto its device (`load_file`'s work, on a handle its caller
    already read: `tensorzip.load` takes the structure and the tensors from one opening)."""
    names = f.offset_keys()
    dev = f._device
    if dev.type == "cuda" and _core.gpu_available():
        outs = [f._empty(n, dev) for n in names]
        _decode_gpu(f._file, names, outs, dev, True)
        return dict(zip(names, outs))
    # All tensors in one call: decoded concurrently (a model's small tensors, a chunk or two each,
    # left cores idle one at a time).
    outs = [f._empty(n, torch.device("cpu")) for n in names]
    f._file.decode_many_into(names, [(_codec._ptr(o), o.nbytes) for o in outs])
    if dev.type != "cpu":
        outs = [o.to(dev) for o in outs]
    return dict(zip(names, outs))


def _untied(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A state dict without its tied names: of the names of one tensor (`_core.tied_key`: the same
    storage, offset, shape, strides, dtype and bits) the first is kept; returns the kept tensors
    and {dropped name: kept name}. Tensors that merely overlap are kept, each saved as a copy."""
    kept: dict[str, torch.Tensor] = {}
    dropped: dict[str, str] = {}
    first: dict = {}
    for name, t in state.items():
        key = _core.tied_key(t) if isinstance(t, torch.Tensor) else None
        if key is not None and key in first:
            dropped[name] = first[key]
            continue
        if key is not None:
            first[key] = name
        kept[name] = t
    return kept, dropped


def save_model(
    model: torch.nn.Module,
    filename: str | bytes | os.PathLike,
    metadata: dict[str, str] | None = None,
    **options,
) -> None:
    """Saves `model.state_dict()` as `save_file` does, each tied tensor once (as
    `safetensors.torch.save_model`: an `lm_head` tied to the embedding is stored under one name,
    and the header's metadata maps each dropped name to the one kept). `load_model` loads it back.
    Without this a state dict's tied tensors are saved twice (`save_file` keeps every name)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    tensors, dropped = _untied(model.state_dict())
    meta = dict(metadata or {})
    for name, to in dropped.items():
        meta.setdefault(name, to)
    save_file(tensors, filename, meta or None, **options)


def load_model(
    model: torch.nn.Module,
    filename: str | bytes | os.PathLike,
    strict: bool = True,
    device: str | int | torch.device = "cpu",
) -> tuple[list[str], list[str]]:
    """Loads an archive written by `save_model` (or any with `model`'s tensor names) into `model`:
    a name the file lacks because the model ties it to a name the file has is not missing. With
    `strict`, other missing names or unexpected ones raise RuntimeError naming them; returns
    (missing, unexpected), as `safetensors.torch.load_model`."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    state = load_file(filename, device=device)
    _, tied = _untied(model.state_dict())
    # The names of each tied tensor, whichever of them the file kept (the model that saved it
    # may have listed them in another order).
    group: dict[str, set[str]] = {}
    for name, to in tied.items():
        names = group.setdefault(to, {to})
        names.add(name)
        group[name] = names
    missing, unexpected = model.load_state_dict(state, strict=False)
    # A tied name is loaded through another name of its tensor that the file has.
    missing = [m for m in missing if not (group.get(m, set()) & state.keys())]
    unexpected = list(unexpected)
    if strict and (missing or unexpected):
        raise RuntimeError(
            f"{os.fsdecode(filename)}: loading into {type(model).__name__}: missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)}"
        )
    return missing, unexpected


def save_dir(
    tensors: dict[str, torch.Tensor],
    dirname: str | bytes | os.PathLike,
    metadata: dict[str, str] | None = None,
    *,
    max_shard_bytes: int = 5_000_000_000,
    **options,
) -> list[str]:
    """Saves `tensors` as a compressed model directory, sharded the way Hugging Face checkpoints
    are: `model.safetensors.tz` when everything fits in `max_shard_bytes` (of original tensor
    bytes), else `model-00001-of-0000N.safetensors.tz`, ... and `model.safetensors.index.json`
    (`{"metadata": {"total_size": ...}, "weight_map": {name: shard}}`, the shards named without
    `.tz`, as `tensorzip decompress DIR -o OUT` restores them). Tensors go into shards in the
    dictionary's order, a new shard starting when the next tensor would pass the limit (a tensor
    larger than the limit gets a shard of its own). Each shard is written with `save_file`
    (`metadata` in every one, `options` as `save_file`'s) into a hidden temporary directory in
    `dirname`, with the index; only once all are written are they renamed into place (the index
    last), so a save that fails (a tensor it cannot store, a full disk, an interrupt) leaves the
    directory as it was. The
    renames are not one atomic step: a crash between two of them, or a reader looking at that
    moment, can see new shards beside old ones. The directory is made if missing; files a previous
    save left under these names (`model.safetensors.tz`, other `model-*-of-*.safetensors.tz`, the
    index) are removed once the new ones are in place, so that `load_dir` reads this save alone;
    a directory whose `model.safetensors.index.json` is an uncompressed checkpoint's (the shards
    it names are there) is refused with ValueError, before anything is written. Run as root,
    `dirname` and every directory above it must be root's and not writable by other users (a
    sticky one, as /tmp, allowed), else PermissionError: another user could swap the staging
    directory for a link and have root write where it points (the command line's rule too).
    Returns the names of the files written."""
    if not isinstance(tensors, dict):
        raise TypeError(f"tensors must be a dict of name -> torch.Tensor, not {type(tensors).__name__}")
    if isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int) or max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes must be a positive int, not {max_shard_bytes!r}")
    root = os.fsdecode(dirname)
    # Run as root, shards are staged only where no other user can swap the staging directory (or
    # a directory above it) for a link, and at the resolved path: the command line's rule for a
    # model directory. Checked before the directory is made (on the deepest one that exists: a
    # link of theirs on the way would have root make directories where it points) and again
    # after; PermissionError, before anything is written.
    as_root = hasattr(os, "geteuid") and os.geteuid() == 0
    if as_root:
        there = os.path.abspath(root)
        while not os.path.isdir(there):
            there = os.path.dirname(there)
        _native.only_ours_above(there)
    made = not os.path.isdir(root)
    os.makedirs(root, exist_ok=True)
    try:
        if as_root:
            root = os.fsdecode(_native.only_ours_above(root))
        return _save_shards(tensors, root, metadata, max_shard_bytes, options)
    except BaseException:
        # Nothing of this save is left (its shards were removed); a directory it made goes too.
        if made and not os.listdir(root):
            os.rmdir(root)
        raise


def _save_shards(tensors, root: str, metadata, max_shard_bytes: int, options: dict) -> list[str]:
    import json
    import re
    import shutil
    import tempfile

    # An index of an uncompressed checkpoint in this directory (its shards present under the
    # names it gives them) is not this save's to replace or remove: refused before anything is
    # written. An index of a compressed save names its shards without `.tz`, which are absent.
    index_path = os.path.join(root, "model.safetensors.index.json")
    if os.path.isfile(index_path):
        try:
            with open(index_path, encoding="utf-8") as fh:
                named = {v for v in json.load(fh)["weight_map"].values() if isinstance(v, str)}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{index_path}: this save would replace an index it cannot read ({e}); save into another directory") from None
        theirs = sorted(v for v in named if os.path.exists(os.path.join(root, v)))
        if theirs:
            raise ValueError(
                f"{index_path}: the index of an uncompressed checkpoint ({theirs[0]} is here), which this save would "
                "replace or remove; save into another directory"
            )
    shards: list[list[str]] = [[]]
    size = 0
    total = 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0
        if shards[-1] and size + n > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
        total += n
    if len(shards) == 1:
        files = ["model.safetensors"]
    else:
        files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    # Every file of this save is written into a hidden directory of its own (threads and
    # processes saving the same directory do not share one) and moved into place only once all of
    # them are written.
    stage = tempfile.mkdtemp(dir=root, prefix=".tensorzip-save-")
    try:
        for f, names in zip(files, shards):
            save_file({k: tensors[k] for k in names}, os.path.join(stage, f + ".tz"), metadata, **options)
        written = [f + ".tz" for f in files]
        if len(shards) > 1:
            index = "model.safetensors.index.json"
            doc = {"metadata": {"total_size": total}, "weight_map": {k: f for f, names in zip(files, shards) for k in names}}
            with open(os.path.join(stage, index), "w", encoding="utf-8") as out:
                json.dump(doc, out, indent=2, sort_keys=True)
                out.write("\n")
                out.flush()
                os.fsync(out.fileno())
            written.append(index)
        for name in written:
            os.replace(os.path.join(stage, name), os.path.join(root, name))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    # Shard numbers take five digits or more (a save of 100,000 shards or more writes six).
    ours = re.compile(r"model(-\d{5,}-of-\d{5,})?\.safetensors\.tz|model\.safetensors\.index\.json")
    for entry in os.listdir(root):
        if ours.fullmatch(entry) and entry not in written:
            os.remove(os.path.join(root, entry))
    return written


def load_dir(dirname: str | bytes | os.PathLike, device: str | int | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Loads a compressed model directory (`tensorzip compress DIR -o OUT`, or `compress DIR`):
    every `*.safetensors.tz` archive directly in `dirname` — the shards of one model; sub-folders
    (a pipeline's other components) are not read, pass them on their own — each with `load_file`
    (on a GPU, one launch per archive), into one dictionary. Each `*.safetensors.index.json` there
    (a sharded checkpoint's index, which the command line copies as it is) is checked: every
    tensor of its `weight_map` must come from the archive of the shard it names (`<shard>.tz`),
    and no archive may hold a tensor that no index names. A name found in two archives, a
    directory without archives and an index that does not match raise ValueError naming the file."""
    import json

    root = os.fsdecode(dirname)
    if not os.path.isdir(root):
        raise ValueError(f"{root}: not a directory")
    names = sorted(n for n in os.listdir(root) if n.endswith(".safetensors.tz") and not n.startswith("."))
    if not names:
        raise ValueError(f"{root}: no .safetensors.tz archive in this directory")
    out: dict[str, torch.Tensor] = {}
    source: dict[str, str] = {}
    for n in names:
        for key, t in load_file(os.path.join(root, n), device=device).items():
            if key in source:
                raise ValueError(f"{os.path.join(root, n)}: tensor {key!r} is also in {source[key]}")
            out[key], source[key] = t, n
    indexes = sorted(n for n in os.listdir(root) if n.endswith(".safetensors.index.json") and not n.startswith("."))
    named: set[str] = set()
    for n in indexes:
        path = os.path.join(root, n)
        try:
            with open(path, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
            items = [(str(k), str(v)) for k, v in weight_map.items()]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{path}: not a safetensors index ({type(e).__name__}: {e})") from None
        for key, shard in items:
            if source.get(key) != shard + ".tz":
                where = f"is in {source[key]}" if key in source else "is in no archive"
                raise ValueError(f"{path}: tensor {key!r} of shard {shard} {where}")
            named.add(key)
    if indexes and len(named) != len(out):
        extra = sorted(set(out) - named)
        raise ValueError(f"{root}: {len(extra)} tensors no index names, e.g. {extra[0]!r} in {source[extra[0]]}")
    return out


def verify_file(src: str | bytes | os.PathLike, against: str | bytes | os.PathLike | None = None) -> int:
    """Checks every checksum of the archive `src` and decodes all of it without keeping anything;
    with `against` (the original `.safetensors` file), also compares the restored bytes with it,
    as `tensorzip verify [--against]`. Returns the restored size. A damaged archive, or a
    restore that differs, raises ValueError naming the file (and the first differing byte)."""
    return _native.verify_file(os.fsdecode(src), None if against is None else os.fsdecode(against))


def compress_file(
    src: str | bytes | os.PathLike,
    dst: str | bytes | os.PathLike | None = None,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    passthrough_threshold: float = 0.95,
    min_compress_bytes: int = 1024,
    block_units: int = DEFAULT_BLOCK_UNITS,
    max_tables: int = DEFAULT_MAX_TABLES,
    condition: bool = DEFAULT_CONDITION,
    pair_exponents: bool = DEFAULT_PAIR_EXPONENTS,
    verify: bool = False,
    overwrite: bool = False,
) -> tuple[int, int]:
    """Compresses the `.safetensors` file `src` into a tensorzip archive at `dst` (default: `src`
    + ".tz") without loading its tensors: the archive `tensorzip compress` writes, byte for byte,
    through a temporary file renamed into place. As the command line, it refuses a `dst` that
    exists (FileExistsError) unless `overwrite` (its `--force`); `dst` may not be `src`. With
    `verify`, the archive is decoded and compared with `src` before it takes its name (`tensorzip
    compress --verify`). Returns (the file's size, the archive's size). A file that is not a
    safetensors file raises ValueError naming it."""
    src = os.fsdecode(src)
    dst = src + ".tz" if dst is None else os.fsdecode(dst)
    opts = _codec._options(
        chunk_bytes, passthrough_threshold, min_compress_bytes, block_units, max_tables, condition, pair_exponents
    )
    _core.check_bool("verify", verify)
    _refuse_existing(dst, overwrite)
    return _native.compress_file(src, dst, opts.args(), verify)


def decompress_file(
    src: str | bytes | os.PathLike, dst: str | bytes | os.PathLike | None = None, *, overwrite: bool = False
) -> int:
    """Restores the `.safetensors` file of the tensorzip archive `src` at `dst` (default: `src`
    without its ".tz"), byte for byte, checking every checksum, through a temporary file renamed
    into place. As the command line, it refuses a `dst` that exists (FileExistsError) unless
    `overwrite`. Returns the restored file's size. A damaged archive raises ValueError naming it
    (and nothing is left at `dst`)."""
    src = os.fsdecode(src)
    if dst is None:
        if not src.endswith(".tz") or len(src) == 3 or src.endswith("/.tz"):
            raise ValueError(f"{src}: name does not end in .tz; give the output file")
        dst = src[:-3]
    dst = os.fsdecode(dst)
    _refuse_existing(dst, overwrite)
    return _native.decompress_file(src, dst)


def _refuse_existing(dst: str, overwrite: bool) -> None:
    """FileExistsError where a file-to-file call would replace `dst` without `overwrite` (a
    directory is left to the call, which refuses it as such). A file made at `dst` between this
    check and the rename is replaced (the command line's `--force`-less commit is a hard link,
    which never replaces)."""
    _core.check_bool("overwrite", overwrite)
    if not overwrite and os.path.lexists(dst) and not os.path.isdir(dst):
        raise FileExistsError(errno.EEXIST, "already exists (pass overwrite=True to replace it)", dst)
