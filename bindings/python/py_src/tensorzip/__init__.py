"""tensorzip: lossless compression of neural-network tensors, on the CPU and on NVIDIA GPUs.

Three APIs over one format (docs/FORMAT.md), whose blobs both engines read and write byte for byte:

* cuZipNN's: `compress_tensor`, `decompress_tensor`, `compress_tensor_with_crc32`,
  `hash_tensor_with_crc32` (same names, keywords, defaults and return types);
* EntroPack's, for the lossless schemes: `compress(tensor, config)` -> `CompressedTensor`,
  `decompress(compressed, config)`, `TensorZipConfig`, `RawConfig`, and `CompressedLinear` (a
  linear layer whose weight stays compressed; `compress_linears(model)` swaps them in);
* files mirroring `safetensors.torch`: `save_file`, `load_file`, `safe_open`; `save_dir` /
  `load_dir` for sharded model directories; `save` / `load` for training state (nested dicts,
  lists and tuples of tensors and plain values, as `torch.save` takes them, without pickle).

CUDA tensors are coded on their GPU, on torch's current stream, when the GPU engine can run
(`gpu_available()`); everything else runs on the CPU engine. Corrupted or foreign blobs raise
`ValueError`.
"""

from ._codec import (
    blob_info,
    compress_tensor,
    compress_tensor_with_crc32,
    decompress_tensor,
    hash_tensor_with_crc32,
)
from ._core import gpu_available, gpu_unavailable_reason
from ._entropack import (
    CompressedTensor,
    CompressionConfig,
    CompressionFallbackWarning,
    RawConfig,
    TensorZipConfig,
    compress,
    decompress,
)
from ._files import compress_file, decompress_file, load_dir, load_file, safe_open, save_dir, save_file, verify_file
from ._linear import CompressedLinear, compress_linears
from ._objects import load, save
from ._tensorzip import __version__

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
    "gpu_available",
    "gpu_unavailable_reason",
    "hash_tensor_with_crc32",
    "load",
    "load_dir",
    "load_file",
    "safe_open",
    "save",
    "save_dir",
    "save_file",
    "verify_file",
]
