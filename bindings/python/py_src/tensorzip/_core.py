"""Plumbing between torch tensors and the Rust engines (`tensorzip._tensorzip`).

Tensors cross as raw addresses: every function here takes a *contiguous* tensor and keeps a
reference to it for the duration of the native call. Nothing in this module is public API.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from dataclasses import astuple, dataclass

import torch

from . import _tensorzip as _native

# The dtypes the format codes (docs/FORMAT.md, section 1), as torch dtypes.
SUPPORTED_DTYPES: tuple[torch.dtype, ...] = tuple(
    d
    for d in (
        torch.bool,
        torch.uint8,
        torch.int8,
        getattr(torch, "uint16", None),
        torch.int16,
        getattr(torch, "uint32", None),
        torch.int32,
        getattr(torch, "uint64", None),
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        getattr(torch, "float8_e4m3fn", None),
        getattr(torch, "float8_e5m2", None),
        getattr(torch, "float8_e4m3fnuz", None),
        getattr(torch, "float8_e5m2fnuz", None),
        torch.complex64,
    )
    if d is not None
)


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16` -> `"bfloat16"`."""
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    """`"bfloat16"` -> `torch.bfloat16`."""
    d = getattr(torch, name, None)
    if not isinstance(d, torch.dtype):
        raise ValueError(f"tensorzip: unknown dtype {name!r}")
    return d


# The writers' defaults for the two switches every writer takes (the command line's: the byte below
# the exponent conditioned on it, and bf16 exponents paired, format version 2), named once here.
DEFAULT_CONDITION = True
DEFAULT_PAIR_EXPONENTS = True


@dataclass(frozen=True)
class Options:
    """Encoder options (cuZipNN's meanings where the names match; see docs/FORMAT.md)."""

    chunk_bytes: int
    block_units: int
    passthrough_threshold: float
    min_compress_bytes: int
    max_tables: int
    condition: bool
    # Format version 2 (docs/FORMAT.md section 12): bf16 exponents two units a symbol.
    pair_exponents: bool = DEFAULT_PAIR_EXPONENTS

    def args(self) -> tuple:
        """The fields in declaration order: the tuple the native module takes (`OptionArgs`)."""
        return astuple(self)


def check_bool(name: str, value) -> None:
    """Raises TypeError naming `name` unless `value` is a bool (a truthy string such as "no" is not
    taken for one)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}")


def check_options(opts: Options) -> None:
    """Raises TypeError / ValueError naming the field, before any work is done."""
    for name in ("chunk_bytes", "block_units", "min_compress_bytes", "max_tables"):
        v = getattr(opts, name)
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, not {type(v).__name__}")
    if isinstance(opts.passthrough_threshold, bool) or not isinstance(opts.passthrough_threshold, (int, float)):
        raise TypeError(f"passthrough_threshold must be a float, not {type(opts.passthrough_threshold).__name__}")
    check_bool("condition", opts.condition)
    check_bool("pair_exponents", opts.pair_exponents)
    if opts.chunk_bytes <= 0 or opts.chunk_bytes % 8 or opts.chunk_bytes > 16 << 20:
        raise ValueError(f"chunk_bytes = {opts.chunk_bytes} must be a positive multiple of 8, at most {16 << 20}")
    b = opts.block_units
    if b < 32 or b > 65536 or b & (b - 1):
        raise ValueError(f"block_units = {b} must be a power of two in 32..=65536")
    if not 0 < opts.passthrough_threshold <= 1:
        raise ValueError(f"passthrough_threshold = {opts.passthrough_threshold} must be in (0, 1]")
    if not 0 <= opts.min_compress_bytes <= sys.maxsize:
        raise ValueError(f"min_compress_bytes = {opts.min_compress_bytes} must be in 0..={sys.maxsize}")
    if not 1 <= opts.max_tables <= 64:
        raise ValueError(f"max_tables = {opts.max_tables} must be in 1..=64")


def check_memory(t: torch.Tensor, what: str = "tensor") -> None:
    """Refuses a tensor whose bytes tensorzip cannot read: not on the CPU or a CUDA device (meta,
    MPS, XPU: an address there is not host memory), quantized (its scale and zero point live
    beside the bytes and would be lost), nested, not strided, or a subclass without storage of
    its own (`_make_wrapper_subclass`: a data pointer of 0)."""
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{what} on {t.device}: tensorzip reads CPU and CUDA tensors only")
    if t.is_quantized:
        raise TypeError(
            f"{what} is quantized ({t.dtype}): its scale and zero point would be lost; "
            "pass t.int_repr() or t.dequantize()"
        )
    if t.is_nested:
        raise TypeError(f"{what} is a nested tensor; pass its components")
    if t.layout != torch.strided:
        raise ValueError(f"only strided tensors are supported, not {t.layout}")
    try:
        ptr = t.data_ptr() if t.numel() else 1
    except RuntimeError:  # FakeTensor and other subclasses that refuse to give one
        ptr = 0
    if ptr == 0:
        raise TypeError(
            f"{what} has no memory of its own ({type(t).__name__}: a tensor subclass without "
            "storage?); convert it to a plain tensor first"
        )


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes in row-major order as a contiguous 1-D uint8 tensor (a view when possible).
    Raises as `check_memory` for a tensor whose bytes cannot be read."""
    check_memory(t)
    t = t.detach()
    # Conjugate and negative views keep their values' sign as a flag beside unchanged memory:
    # the bytes to store are the values', materialised.
    t = t.resolve_conj().resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.numel() == 0:
        return torch.empty(0, dtype=torch.uint8, device=t.device)
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    # A contiguous tensor's elements lie back to back from its storage offset, but torch calls a
    # tensor contiguous whatever the strides of its dimensions of size 1 (`x[:, 3][2:3]` has
    # stride 301), and `reshape` keeps such a stride, which `view` to bytes refuses: the flat
    # view is made with stride 1 explicitly.
    return t.as_strided((t.numel(),), (1,)).view(torch.uint8)


def from_rust(buf: "_native.RustBytes") -> torch.Tensor:
    """A uint8 CPU tensor over bytes owned by Rust, without a copy (the tensor keeps them alive)."""
    n = len(buf)
    if n == 0:
        return torch.empty(0, dtype=torch.uint8)
    arr = (ctypes.c_uint8 * n).from_address(buf.ptr())
    setattr(arr, "_tensorzip_owner", buf)  # the ctypes array keeps the Rust bytes alive
    return torch.frombuffer(arr, dtype=torch.uint8)


# --- GPU ------------------------------------------------------------------------------------------

_gpu_lock = threading.Lock()
_gpu_reason: list = []


def gpu_unavailable_reason() -> str | None:
    """None when the GPU engine can run (CUDA driver, NVRTC and a device), else why not."""
    with _gpu_lock:
        if not _gpu_reason:
            reason = None
            if not torch.cuda.is_available():
                reason = "torch sees no CUDA device"
            else:
                reason = _native.gpu_unavailable_reason()
            _gpu_reason.append(reason)
        return _gpu_reason[0]


def gpu_available() -> bool:
    return gpu_unavailable_reason() is None


def as_device(device: str | int | torch.device) -> torch.device:
    """A device argument as torch reads it, an int being that CUDA device."""
    return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)


def tied_key(t: torch.Tensor):
    """What makes two tensors one (tied weights): the same storage, offset, shape, strides, dtype
    and device — and the conjugate and negative bits (`z.conj()` is a view of `z`'s storage with
    the same shape and strides, but other values). None for an empty tensor, which ties nothing."""
    if not t.numel():
        return None
    return (t.device, t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.is_conj(),
            t.is_neg(), t.untyped_storage().data_ptr())


def empty(shape, dtype: torch.dtype, device: torch.device | None = None) -> torch.Tensor:
    """`torch.empty` of a shape read from a blob or a file: one whose strides do not fit in 64
    bits (a zero-size tensor's other dimensions are not bounded by its bytes: `[0, 2^62, 4]`)
    raises ValueError naming the shape, as other bad input does, not torch's RuntimeError."""
    stride = 1
    for d in reversed(tuple(shape)[1:]):
        stride *= max(int(d), 1)
        if stride >= 1 << 63:
            raise ValueError(f"shape {tuple(shape)}: a tensor torch cannot make (its strides overflow)")
    return torch.empty(tuple(shape), dtype=dtype, device=device)


def target_device(device: str | int | torch.device) -> torch.device:
    """A device that results are to be made on: a CUDA device torch cannot use (no CUDA, an index
    past the last) raises torch's own error now, before anything is decoded — not after a whole
    file was decoded on the CPU for it."""
    dev = as_device(device)
    if dev.type == "cuda":
        torch.empty(0, device=dev)
    return dev


def release_gpu_memory(device: str | int | torch.device | None = None) -> None:
    """Gives back to the CUDA driver the device memory tensorzip's GPU engine keeps for reuse.

    The engine allocates each call's buffers (blobs, scratch) from the device's memory pool and
    keeps what it frees there, so that the next call does not map the memory again (~20 ms per
    gigabyte). torch's caching allocator can neither use nor see that reserve. File-level calls
    (`load_file`, `save_file`, a `safe_open` reader on a GPU when its `with` block ends) trim it
    to 64 MiB;
    after tensor-level calls (`compress_tensor` / `decompress_tensor` of CUDA tensors) it holds up
    to the largest call's working set — a few times the tensor's size. Call this when done with
    such calls for a while. `device`: one CUDA device, or None for every device tensorzip has used.
    Does nothing where the GPU engine was never used."""
    dev = None if device is None else as_device(device)
    if dev is not None and dev.type != "cuda":
        raise ValueError(f"release_gpu_memory: {dev} is not a CUDA device")
    if gpu_unavailable_reason() is not None:
        return  # no engine can exist (and torch has no current CUDA device to ask for)
    _native.gpu_release_memory(None if dev is None else cuda_index(dev))


def stream_of(device: torch.device) -> int:
    """The handle of torch's current stream on `device`."""
    return torch.cuda.current_stream(device).cuda_stream


def cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()
