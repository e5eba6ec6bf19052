"""The worker's GPU memory: the measured peak of a candidate's forwards, the release of what it leaves in
torch's caching allocator, and out-of-memory errors told apart from a task's own faults.

The workers of a run share one GPU, so a CUDA out-of-memory error may say more about the other
candidates running beside this one than about this candidate: the run tries such a candidate again
later (pipeline/run.py). On the CPU every function here does nothing.
"""

from __future__ import annotations

import gc

OUT_OF_MEMORY_MARKERS = ("OutOfMemoryError", "CUDA out of memory")


def out_of_memory(error) -> bool:
    """Whether an exception, or an error message, is a (CUDA) out-of-memory error."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return any(marker in text for marker in OUT_OF_MEMORY_MARKERS)


def on_gpu(device: str) -> bool:
    import torch

    return torch.device(device).type == "cuda"


def reset_peak(device: str) -> None:
    """The peak counter of `device` starts again from what is allocated now."""
    import torch

    if on_gpu(device):
        torch.cuda.reset_peak_memory_stats()


def peak_bytes(device: str) -> int | None:
    """The most bytes allocated on `device` since reset_peak (None on the CPU: not measured)."""
    import torch

    return int(torch.cuda.max_memory_allocated()) if on_gpu(device) else None


def release(device: str) -> None:
    """Give the GPU memory this process no longer references back to the driver, for the evaluator's
    children and the other workers (tensors in reference cycles are collected first)."""
    import torch

    if on_gpu(device):
        gc.collect()
        torch.cuda.empty_cache()
