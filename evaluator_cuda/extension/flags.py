"""The compiler flags of both build paths, and the torch release that keys their caches."""

from __future__ import annotations

# docs/paper.md §3: -O3 for the host compiler, -O3 --use_fast_math for nvcc. The C++ standard is
# left to torch (C++17 in the CUDA-Agent era, C++20 from torch 2.10 on): forcing -std=c++17
# after torch's own flag breaks torch's headers on newer releases.
CXX_FLAGS = ("-O3",)
NVCC_FLAGS = ("-O3", "--use_fast_math")


def torch_release() -> str:
    """The installed torch's version, from its metadata when it has any (no import)."""
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:
        import torch

        return torch.__version__
