import os

# Tests that exercise sharding use 8 fake CPU devices; this must be set before JAX initialises.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
if not os.environ.get("CUDA_AGENT_TEST_GPU"):
    # JAX tests run on the CPU (8 fake devices) unless a GPU run asks otherwise.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run on the device machine)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
