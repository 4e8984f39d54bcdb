"""tensorzip: lossless compression of neural-network tensors, on the CPU and on NVIDIA GPUs.

Three APIs over one format (docs/FORMAT.md), whose blobs both engines read and write byte for byte:

* cuZipNN's: `compress_tensor`, `decompress_tensor`, `compress_tensor_with_crc32`,
  `hash_tensor_with_crc32` (same names, keywords, defaults and return types), and
  `decompress_tensors`, many blobs in one GPU launch;
* EntroPack's, for the lossless schemes: `compress(tensor, config)` -> `CompressedTensor`,
  `decompress(compressed, config)`, `TensorZipConfig`, `RawConfig`, and `CompressedLinear` (a
  linear layer whose weight stays compressed; `compress_linears(model)` swaps them in);
* files mirroring `safetensors.torch`: `save_file`, `load_file`, `safe_open`; `save_dir` /
  `load_dir` for sharded model directories; `save` / `load` for training state (nested dicts,
  lists and tuples of tensors and plain values, as `torch.save` takes them, without pickle).

CUDA tensors are coded on their GPU, on torch's current stream, when the GPU engine can run
(`gpu_available()`); everything else runs on the CPU engine. Foreign, truncated or damaged blobs
raise `ValueError` where the damage shows (header, tables, sizes); damage to a bare blob's payload
is caught only by checksums — files and `CompressedTensor` carry them,
`compress_tensor_with_crc32` gives them.

The names are loaded on first use (the torch layer imports torch, ~1.5 s), so that the command
line (`python -m tensorzip`, the `tensorzip` script) starts at once and runs without PyTorch;
without it, using any of them raises ImportError saying so.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ._tensorzip import __version__

# Each public name and the module that defines it.
_WHERE = {
    "blob_info": "_codec",
    "compress_tensor": "_codec",
    "compress_tensor_with_crc32": "_codec",
    "decompress_tensor": "_codec",
    "decompress_tensors": "_codec",
    "hash_tensor_with_crc32": "_codec",
    "gpu_available": "_core",
    "gpu_unavailable_reason": "_core",
    "release_gpu_memory": "_core",
    "CompressedTensor": "_entropack",
    "CompressionConfig": "_entropack",
    "CompressionFallbackWarning": "_entropack",
    "RawConfig": "_entropack",
    "TensorZipConfig": "_entropack",
    "compress": "_entropack",
    "decompress": "_entropack",
    "compress_file": "_files",
    "decompress_file": "_files",
    "load_dir": "_files",
    "load_file": "_files",
    "load_model": "_files",
    "safe_open": "_files",
    "save_dir": "_files",
    "save_file": "_files",
    "save_model": "_files",
    "verify_file": "_files",
    "CompressedLinear": "_linear",
    "compress_linears": "_linear",
    "load": "_objects",
    "save": "_objects",
}

__all__ = [
    "CompressedLinear",
    "CompressedTensor",
    "CompressionConfig",
    "CompressionFallbackWarning",
    "RawConfig",
    "TensorZipConfig",
    "__version__",
    "blob_info",
    "compress",
    "compress_file",
    "compress_linears",
    "compress_tensor",
    "compress_tensor_with_crc32",
    "decompress",
    "decompress_file",
    "decompress_tensor",
    "decompress_tensors",
    "gpu_available",
    "gpu_unavailable_reason",
    "hash_tensor_with_crc32",
    "load",
    "load_dir",
    "load_file",
    "load_model",
    "release_gpu_memory",
    "safe_open",
    "save",
    "save_dir",
    "save_file",
    "save_model",
    "verify_file",
]

if TYPE_CHECKING:
    from ._codec import (
        blob_info,
        compress_tensor,
        compress_tensor_with_crc32,
        decompress_tensor,
        decompress_tensors,
        hash_tensor_with_crc32,
    )
    from ._core import gpu_available, gpu_unavailable_reason, release_gpu_memory
    from ._entropack import CompressedTensor, CompressionConfig, CompressionFallbackWarning, RawConfig, TensorZipConfig, compress, decompress
    from ._files import (
        compress_file,
        decompress_file,
        load_dir,
        load_file,
        load_model,
        safe_open,
        save_dir,
        save_file,
        save_model,
        verify_file,
    )
    from ._linear import CompressedLinear, compress_linears
    from ._objects import load, save


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'tensorzip' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(f".{module}", __name__), name)
    except ModuleNotFoundError as e:
        if e.name != "torch":
            raise
        raise ImportError(
            f"tensorzip.{name} needs PyTorch: pip install 'tensorzip[torch]' (the command line works without it)"
        ) from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
