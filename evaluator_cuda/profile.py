"""Timing of one module's forward: warm-up, synchronisation, L2 flush, several repeats.

CUDA: one pair of CUDA events per call, a device-wide synchronize after each call, and the
L2 cache flushed (a 256 MiB buffer zeroed, as KernelBench and triton's do_bench do) before
each timed call. Host backend: `time.perf_counter_ns` around each call. Each measurement is
a list of per-call times in microseconds, summarised by its median and spread.
"""

from __future__ import annotations

import math
import statistics
import time


def summarize_times(samples_us: list[float]) -> dict:
    """Median and spread of per-call times (µs): median, mean, std, min, max, p25, p75, n."""
    if not samples_us:
        raise ValueError("no timing samples")
    ordered = sorted(samples_us)
    n = len(ordered)

    def quantile(q: float) -> float:
        pos = q * (n - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

    return {
        "median_us": statistics.median(ordered),
        "mean_us": statistics.fmean(ordered),
        "std_us": statistics.pstdev(ordered) if n > 1 else 0.0,
        "min_us": ordered[0],
        "max_us": ordered[-1],
        "p25_us": quantile(0.25),
        "p75_us": quantile(0.75),
        "n": n,
    }


def time_forward(call, warmup: int, repeats: int, device_type: str, l2_flush_bytes: int = 0):
    """Per-call times (µs) of `call()` after `warmup` untimed calls; returns (samples, last_output)."""
    import torch

    output = None
    with torch.no_grad():
        for _ in range(warmup):
            output = call()
        if device_type == "cuda":
            flush = torch.empty(max(l2_flush_bytes // 4, 1), dtype=torch.int32, device="cuda") if l2_flush_bytes else None
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
            torch.cuda.synchronize()
            for i in range(repeats):
                if flush is not None:
                    flush.zero_()
                starts[i].record()
                output = call()
                ends[i].record()
                torch.cuda.synchronize()
            samples = [s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)]
        else:
            samples = []
            for _ in range(repeats):
                begin = time.perf_counter_ns()
                output = call()
                samples.append((time.perf_counter_ns() - begin) / 1000.0)
    return samples, output
