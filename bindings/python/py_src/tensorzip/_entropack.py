"""EntroPack's API for the lossless schemes: `compress(tensor, config) -> CompressedTensor`,
`decompress(compressed, config)`, `TensorZipConfig` (our lossless scheme), `RawConfig`.

`CompressedTensor` is a plain object (not a torch.Tensor subclass, as EntroPack's is) holding one
uint8 tensor, its *state*: a small header (magic, version, JSON metadata) followed by a tensorzip
blob. `state_dict()` returns that tensor, so it round-trips through `torch.save` /
`torch.load(weights_only=True)`; `.to(device)` moves it; `.to(dtype=...)` changes the output dtype
without recompressing.
"""

from __future__ import annotations

import json
import logging
import struct
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields

import torch

from . import _codec, _core

logger = logging.getLogger("tensorzip")

_STATE_MAGIC = b"TZCT"
_STATE_VERSION = 1
_STATE_HEAD = struct.Struct("<4sHHI")  # magic, version, reserved, JSON length
_LEAF = "tensorzip_state"


class CompressionFallbackWarning(RuntimeWarning):
    """Compression fell back to storing the tensor uncompressed (`compress_method == "raw"`)."""


@dataclass
class CompressionConfig:
    """Common settings. `execution_backend`: "auto" (None) uses the GPU for CUDA tensors when the GPU
    engine can run, else the CPU; "cuda" requires the GPU engine; "cpu" always uses the CPU engine."""

    execution_backend: str | None = "auto"

    def _validate(self) -> None:
        if self.execution_backend is not None and not isinstance(self.execution_backend, str):
            raise TypeError(f"execution_backend must be a str or None, not {type(self.execution_backend).__name__}")
        if self.execution_backend not in (None, "auto", "cuda", "cpu"):
            raise ValueError(f"execution_backend must be 'auto', 'cuda', 'cpu' or None, not {self.execution_backend!r}")


@dataclass
class RawConfig(CompressionConfig):
    """Store the tensor's bytes without coding (a tensorzip *stored* blob)."""


@dataclass
class TensorZipConfig(CompressionConfig):
    """tensorzip's lossless scheme (byte planes, adaptive rANS; docs/FORMAT.md). Every field has the
    meaning of the command line's option of the same name; the defaults are the CLI's."""

    chunk_bytes: int = _codec.DEFAULT_CHUNK_BYTES
    block_units: int = 4096
    passthrough_threshold: float = 0.95
    min_compress_bytes: int = 1024
    max_tables: int = 8
    condition: bool = _codec.DEFAULT_CONDITION
    pair_exponents: bool = _codec.DEFAULT_PAIR_EXPONENTS

    def _options(self) -> _core.Options:
        return _core.Options(**{f.name: getattr(self, f.name) for f in fields(_core.Options)})

    def _validate(self) -> None:
        super()._validate()
        _core.check_options(self._options())


_METHODS = {"tensorzip": True, "raw": True}  # name -> lossless


def _validate_config(config) -> None:
    if not isinstance(config, CompressionConfig):
        raise TypeError(f"config must be a tensorzip CompressionConfig, not {type(config).__name__}")
    config._validate()


class CompressedTensor:
    """A compressed tensor: `shape`, `dtype` (the output dtype), `compress_method`, `lossless`,
    `storage_nbytes()`, `actual_bpp`, `.to(device)`, `.to(dtype=...)`, `state_dict()` /
    `from_state_dict()`."""

    __slots__ = ("_state", "_meta", "_blob_at", "_dtype")

    def __init__(self, state: torch.Tensor, *, dtype: torch.dtype | None = None):
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.dim() != 1:
            raise ValueError("a CompressedTensor state must be a 1-D uint8 tensor")
        head = state[: _STATE_HEAD.size].cpu()
        if head.numel() < _STATE_HEAD.size:
            raise ValueError("CompressedTensor state is truncated")
        magic, version, _, jlen = _STATE_HEAD.unpack(_codec._bytes_of(_core.as_bytes(head)))
        if magic != _STATE_MAGIC:
            raise ValueError("not a tensorzip CompressedTensor state (bad magic number)")
        if version != _STATE_VERSION:
            raise ValueError(f"unsupported CompressedTensor state version {version} (this build reads {_STATE_VERSION})")
        at = _STATE_HEAD.size + jlen
        if state.numel() < at:
            raise ValueError("CompressedTensor state is truncated")
        try:
            meta = json.loads(_codec._bytes_of(_core.as_bytes(state[_STATE_HEAD.size : at].cpu())))
            _core.dtype_of(meta["dtype"])
            meta["shape"] = [int(d) for d in meta["shape"]]
            if any(d < 0 for d in meta["shape"]):
                raise ValueError(f"negative dimension in shape {meta['shape']}")
            if meta["compress_method"] not in _METHODS:
                raise ValueError(f"unknown compress_method {meta['compress_method']!r}")
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"corrupt CompressedTensor metadata: {e}") from None
        self._state = state
        self._meta = meta
        self._blob_at = at
        self._dtype = dtype if dtype is not None else _core.dtype_of(meta["dtype"])

    @classmethod
    def _pack(cls, blob: torch.Tensor, method: str, tensor: torch.Tensor, extra: dict | None = None) -> "CompressedTensor":
        blob = blob.cpu()
        # A bare blob has no checksum of its own (FORMAT.md section 3): the state carries the
        # blob's CRC-32, which `verify` (and so `from_state_dict` and CompressedLinear's
        # load_state_dict) checks — a state read back from a `torch.save` file is not under any
        # archive's checksums.
        meta = {
            "compress_method": method,
            "dtype": _core.dtype_name(tensor.dtype),
            "shape": list(tensor.shape),
            "crc32": _blob_crc(blob),
        }
        if extra:
            meta.update(extra)
        j = json.dumps(meta, separators=(",", ":")).encode()
        head = torch.frombuffer(bytearray(_STATE_HEAD.pack(_STATE_MAGIC, _STATE_VERSION, 0, len(j)) + j), dtype=torch.uint8)
        state = torch.cat([head, blob])
        # The container lives where the input did (EntroPack's convention).
        if tensor.device.type != "cpu":
            state = state.to(tensor.device)
        return cls(state)

    @property
    def shape(self) -> torch.Size:
        return torch.Size(self._meta["shape"])

    @property
    def dtype(self) -> torch.dtype:
        """The dtype `decompress` returns (the encoded one unless changed with `.to(dtype=...)`)."""
        return self._dtype

    @property
    def encoded_dtype(self) -> torch.dtype:
        return _core.dtype_of(self._meta["dtype"])

    @property
    def device(self) -> torch.device:
        return self._state.device

    @property
    def compress_method(self) -> str:
        return self._meta["compress_method"]

    @property
    def lossless(self) -> bool:
        return _METHODS[self.compress_method]

    @property
    def header(self) -> dict:
        return dict(self._meta)

    def storage_nbytes(self, include_header: bool = True) -> int:
        """Bytes of the state, or of the blob alone with `include_header=False`."""
        return self._state.numel() if include_header else self._state.numel() - self._blob_at

    @property
    def actual_bpp(self) -> float:
        """Bits per element of `shape`, the state's header included."""
        n = 1
        for d in self._meta["shape"]:
            n *= d
        return self.storage_nbytes() * 8 / max(n, 1)

    @property
    def blob(self) -> torch.Tensor:
        """The tensorzip blob (a view of the state)."""
        return self._state[self._blob_at :]

    def to(self, *args, copy: bool = False, **kwargs) -> "CompressedTensor":
        """`.to(device)` moves the state; `.to(dtype=...)` changes the output dtype without
        recompressing (the conversion happens after decoding)."""
        device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
        state = self._state
        if device is not None:
            state = state.to(device, non_blocking=non_blocking, copy=copy)
        elif copy:
            state = state.clone()
        out = CompressedTensor.__new__(CompressedTensor)
        out._state, out._meta, out._blob_at = state, self._meta, self._blob_at
        out._dtype = dtype if dtype is not None else self._dtype
        return out

    def _rebind(self, state: torch.Tensor) -> "CompressedTensor":
        """The same compressed tensor over `state`, a copy of this one's state elsewhere (moved by
        a module's `.to`): the header is not read again (reading it from a GPU waits for it)."""
        if state.numel() != self._state.numel() or state.dtype != torch.uint8 or state.dim() != 1:
            raise ValueError("a moved CompressedTensor state must keep its size")
        out = CompressedTensor.__new__(CompressedTensor)
        out._state, out._meta, out._blob_at, out._dtype = state, self._meta, self._blob_at, self._dtype
        return out

    def cpu(self) -> "CompressedTensor":
        return self.to("cpu")

    def cuda(self, device=None) -> "CompressedTensor":
        return self.to(torch.device("cuda") if device is None else _core.as_device(device))

    def state_dict(self, leaf: str | None = None) -> dict[str, torch.Tensor]:
        """The compressed tensor as a one-tensor dictionary under `leaf`."""
        return {(leaf or _LEAF): self._state.detach()}

    @classmethod
    def from_state_dict(cls, state: Mapping[str, torch.Tensor], leaf: str | None = None) -> "CompressedTensor":
        """Restores a compressed tensor from `state_dict()`'s dictionary (e.g. after `torch.load`),
        checking its blob's CRC-32 (`verify`)."""
        leaf = leaf or _LEAF
        if leaf not in state:
            raise ValueError(f"CompressedTensor state is missing {leaf!r}")
        c = cls(state[leaf])
        c.verify()
        return c

    def verify(self) -> None:
        """Raises ValueError unless the blob matches the CRC-32 its state recorded when it was made
        (states written before 2026-12-05 recorded none and pass). On a GPU state the CRC is taken
        there."""
        want = self._meta.get("crc32")
        if want is None:
            return
        got = _blob_crc(self.blob)
        if got != want:
            raise ValueError(f"corrupt CompressedTensor: its blob's CRC-32 is {got:#010x}, its state recorded {want:#010x}")

    def __repr__(self) -> str:
        return (
            f"CompressedTensor(shape={tuple(self.shape)}, dtype={self.dtype}, method={self.compress_method!r}, "
            f"device={self.device}, {self.actual_bpp:.2f} bpp)"
        )


def _backend_uses_gpu(config: CompressionConfig, t: torch.Tensor) -> bool:
    b = config.execution_backend or "auto"
    if b == "cpu":
        return False
    if b == "cuda":
        if not t.is_cuda:
            raise ValueError("execution_backend='cuda' needs a CUDA tensor")
        reason = _core.gpu_unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"execution_backend='cuda': {reason}")
        return True
    return t.is_cuda and _core.gpu_available()


def compress(tensor: torch.Tensor, config: CompressionConfig) -> CompressedTensor:
    """Compresses `tensor` with the scheme `config` selects. If the encoder cannot code the tensor
    (e.g. a dtype the format does not have), the tensor is stored raw with a
    `CompressionFallbackWarning` whose header records the requested scheme and the reason.
    Invalid configurations raise TypeError / ValueError naming the field."""
    if isinstance(tensor, CompressedTensor):
        raise TypeError("compress expects an uncompressed tensor; decompress the container before recompressing")
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    _validate_config(config)
    # A tensor whose bytes cannot be read (meta, quantized, storage-less) is an error, not a
    # fallback to raw: raw needs its bytes too.
    _core.check_memory(tensor)
    if isinstance(config, RawConfig):
        return CompressedTensor._pack(_raw_blob(tensor), "raw", tensor)
    if isinstance(config, TensorZipConfig):
        opts = config._options()
        source = tensor if _backend_uses_gpu(config, tensor) or not tensor.is_cuda else tensor.cpu()
        try:
            blob, _ = _codec._compress(source, opts, False, None)
        except (TypeError, ValueError) as error:
            return _fallback(tensor, "tensorzip", error)
        return CompressedTensor._pack(blob, "tensorzip", tensor)
    raise TypeError(f"no scheme for config {type(config).__name__}")


def _blob_crc(blob: torch.Tensor) -> int:
    """zlib.crc32 of a blob's bytes (one piece: the whole blob), on its device."""
    return int(_codec.hash_tensor_with_crc32(blob, checksum_chunk_bytes=max(1, blob.numel()))[0])


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _raw_blob(tensor: torch.Tensor) -> torch.Tensor:
    """The stored blob of a tensor's bytes (any dtype and rank: unknown dtypes, and tensors of more
    dimensions than a blob holds, as 1-D uint8 bytes; `decompress` views them as the state's JSON
    says)."""
    if tensor.dtype in _core.SUPPORTED_DTYPES and tensor.dim() <= 64:
        return _codec._compress(tensor.cpu(), _core.Options(8, 4096, 0.95, 1 << 62, 8, True), False, None)[0]
    data = _core.as_bytes(tensor.cpu())
    return _codec._compress(data, _core.Options(8, 4096, 0.95, 1 << 62, 8, True), False, None)[0]


def _fallback(tensor: torch.Tensor, requested: str, error: Exception) -> CompressedTensor:
    reason = f"{type(error).__name__}: {error}"
    logger.warning("%s could not encode a %s %s tensor, storing it uncompressed: %s", requested, tuple(tensor.shape), tensor.dtype, reason)
    warnings.warn(
        f"tensorzip stored a {tuple(tensor.shape)} {tensor.dtype} tensor uncompressed, at "
        f"{tensor.element_size() * 8} bits per element: compress_method={requested!r} failed with {reason}",
        CompressionFallbackWarning,
        stacklevel=3,
    )
    return CompressedTensor._pack(_raw_blob(tensor), "raw", tensor, {"requested": requested, "reason": reason})


def decompress(compressed: CompressedTensor, config: CompressionConfig) -> torch.Tensor:
    """Restores the tensor: its shape and `compressed.dtype`, on the device holding the state.
    `config` selects the backend (its encoder settings do not matter for decoding)."""
    if not isinstance(compressed, CompressedTensor):
        raise TypeError(f"expected a CompressedTensor, got {type(compressed).__name__}")
    _validate_config(config)
    blob = compressed.blob
    device = blob.device
    if (config.execution_backend or "auto") == "cpu" and device.type == "cuda":
        out = _codec.decompress_tensor(blob.cpu(), device="cpu").to(device)
    else:
        out = _codec.decompress_tensor(blob, device=device)
    encoded = compressed.encoded_dtype
    shape = compressed.shape
    # The state's JSON is not covered by the blob's checksums: it must describe the blob exactly
    # (an edited dtype of the same size, or a permuted shape, would otherwise reinterpret it).
    # A raw fallback the format cannot hold as it is — a dtype it does not have, or more than 64
    # dimensions (`_raw_blob`) — is stored as bytes; nothing else may be (a uint8 tensor's bytes
    # were refused, and a typed tensor's bytes could be read as any dtype the JSON named).
    as_bytes = encoded not in _core.SUPPORTED_DTYPES or len(shape) > 64
    if out.dtype == encoded and out.shape == shape:
        agrees = True
    else:
        agrees = as_bytes and out.dtype == torch.uint8 and out.dim() == 1 and out.numel() == shape.numel() * _itemsize(encoded)
    if not agrees:
        raise ValueError(
            f"corrupt CompressedTensor: its metadata says {encoded} {tuple(shape)}, its blob holds {out.dtype} {tuple(out.shape)}"
        )
    if out.dtype != encoded:
        out = out.view(encoded)
    out = out.reshape(shape)
    if compressed.dtype != encoded:
        out = out.to(compressed.dtype)
    return out
