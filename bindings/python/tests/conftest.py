import os

import pytest
import torch

import tensorzip


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and the tensorzip GPU engine")


def pytest_collection_modifyitems(config, items):
    reason = tensorzip.gpu_unavailable_reason()
    if reason is None:
        return
    if os.environ.get("TENSORZIP_REQUIRE_GPU") == "1":
        # The device machine's run (scripts/gpu_run.sh): GPU tests that skip there would pass
        # a run that tested nothing on the GPU.
        pytest.exit(f"TENSORZIP_REQUIRE_GPU=1 but the GPU engine cannot run: {reason}", returncode=3)
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU ({reason}); run on the device machine: scripts/gpu_run.sh python")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _gen(dtype: torch.dtype, shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    n = 1
    for d in shape:
        n *= d
    if dtype.is_floating_point or dtype.is_complex:
        base = torch.randn(n, generator=g, dtype=torch.float32) * 0.02
        if dtype.is_complex:
            return torch.complex(base, base.flip(0)).reshape(shape).to(dtype)
        return base.to(dtype).reshape(shape)
    if dtype == torch.bool:
        return (torch.randint(0, 2, (n,), generator=g) == 1).reshape(shape)
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -1000), min(info.max, 1000)
    return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(dtype).reshape(shape)


@pytest.fixture
def gen():
    return _gen
