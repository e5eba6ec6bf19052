"""Timing of one module's forward: warm-up, synchronisation, L2 flush, several repeats.

CUDA: one pair of CUDA events per call, a device-wide synchronize after each call, and the
L2 cache flushed (a 256 MiB buffer zeroed, as KernelBench and triton's do_bench do) before
each timed call. Host backend: `time.perf_counter_ns` around each call. Each measurement is
a list of per-call times in microseconds, summarised by its median and spread.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time

# Bound once, when the harness is imported and before any candidate code runs: a candidate
# that later replaces time.perf_counter_ns does not change what the harness reads (docs/cheats.md #7).
_clock_ns = time.perf_counter_ns

# The CUDA timing functions, bound by bind_cuda_timing() in the candidate child after torch is
# imported and before the candidate's code is (and in the reference child at its load, so that its
# baseline calls demote the persisting L2 lines as the candidate's calls do): (Event class, Event.record,
# Event.elapsed_time, torch.cuda.synchronize). Rebinding them later in torch changes nothing
# here; the static checks reject sources that assign to module attributes at all.
_cuda_timing: tuple | None = None
_reset_persisting_l2 = None

# GPU cycles of a busy-wait queued just before each start event (about 2 ms at the H200's
# ~2 GHz): the host reaches the launch while the GPU still spins, so the host-side cost of the
# call (Python, the compute guard, the kernel trace's range, argument checks) is not counted as
# kernel time. On the H200 that cost is about 0.5 ms with the trace on; a pad of 0.5 ms made a
# 37 µs kernel measure 38-247 µs. What the host does beyond it shows in the wall-clock cross-check.
LAUNCH_PAD_CYCLES = 4_000_000


def bind_cuda_timing() -> None:
    """Bind the CUDA event/synchronize functions and the driver's persisting-L2 reset now."""
    global _cuda_timing, _reset_persisting_l2
    import torch

    event = torch.cuda.Event
    _cuda_timing = (event, event.record, event.elapsed_time, torch.cuda.synchronize, torch.cuda._sleep)
    _reset_persisting_l2 = _driver_persisting_l2_reset()


def _driver_persisting_l2_reset():
    """cuCtxResetPersistingL2Cache from the CUDA driver (None without one)."""
    import ctypes

    try:
        function = ctypes.CDLL("libcuda.so.1").cuCtxResetPersistingL2Cache
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_int
    function.argtypes = []
    return function


def persisting_l2_reset_bound() -> bool:
    """Whether bind_cuda_timing() found the driver's persisting-L2 reset."""
    return _reset_persisting_l2 is not None


def reset_persisting_l2() -> bool:
    """Demote every persisting L2 line of the current context to normal (docs/cheats.md #19), so the
    L2 flush that follows evicts them too. True when the driver did it."""
    return bool(_reset_persisting_l2 is not None and _reset_persisting_l2() == 0)


# Two poison byte patterns, alternated call by call (docs/cheats.md #1, #14): 0xFF is NaN in every
# float format; 0x7F gives large finite values (3.4e38 in float32, 0x7F7F in bf16).
POISON_BYTES = (0xFF, 0x7F)
HOST_MMAP_THRESHOLD_MAX = 32 * 1024**2  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit


def median_rel_se(iqr: float, median: float, n: int) -> float | None:
    """The relative standard error of a median of n samples, from their interquartile range: the
    median's error is about 1.2533 * sigma / sqrt(n), and sigma about IQR / 1.349 for a normal spread.
    None when it cannot be told (fewer than two samples, a zero median)."""
    if n < 2 or median <= 0:
        return None
    return 1.2533 * (iqr / 1.349) / math.sqrt(n) / median


def pair_means(samples_us: list[float]) -> list[float]:
    """The mean of each two consecutive calls (1st and 2nd, 3rd and 4th, ...); an odd last call is left out.
    Fewer than two calls: the calls themselves."""
    if len(samples_us) < 2:
        return list(samples_us)
    return [(a + b) / 2.0 for a, b in zip(samples_us[0::2], samples_us[1::2])]


def summarize_times(samples_us: list[float], pairs: bool = False) -> dict:
    """Median and spread of per-call times (µs), in call order: median, mean, std, min, max, p25, p75, n,
    and the median's relative standard error.

    `pairs` (CUDA): the median and its standard error are those of the means of consecutive pairs of
    calls. There, a small kernel's even and odd calls can run at two speeds (a 6_Swish call on an H100:
    10.6 and 11.4 µs, scripts/bench_evaluator.py placement; where its tensors lie alternates). The
    median of such calls falls on the inner edge of one mode or the other, as an odd count or a stray
    call tips it; the median of pair means lies between the two. It also makes a candidate pay for
    slow calls it alternates with fast ones. `call_median_us` keeps the plain median of the calls."""
    if not samples_us:
        raise ValueError("no timing samples")
    ordered = sorted(samples_us)
    n = len(ordered)
    central = sorted(pair_means(samples_us)) if pairs else ordered
    median = statistics.median(central)
    iqr = _quantile(central, 0.75) - _quantile(central, 0.25)
    summary = {
        "median_rel_se": median_rel_se(iqr, median, len(central)),
        "median_us": median,
        "mean_us": statistics.fmean(ordered),
        "std_us": statistics.pstdev(ordered) if n > 1 else 0.0,
        "min_us": ordered[0],
        "max_us": ordered[-1],
        "p25_us": _quantile(ordered, 0.25),
        "p75_us": _quantile(ordered, 0.75),
        "n": n,
    }
    if pairs:
        summary.update(statistic="median_of_pair_means", call_median_us=statistics.median(ordered))
    return summary


def _quantile(ordered: list[float], q: float) -> float:
    pos = q * (len(ordered) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def time_forward(call, warmup: int, repeats: int, device_type: str, l2_flush_bytes: int = 0, prepare=None,
                 pad_cycles: int | None = None):
    """Per-call times (µs) of `call()` after `warmup` untimed calls; returns (samples, last_output).
    `prepare(position)`, when given, runs before every call, untimed, before the cache flush; `pad_cycles`:
    the launch pad (None: LAUNCH_PAD_CYCLES)."""
    import torch

    prepare = prepare or (lambda position: None)
    output = None
    # Each call's output is dropped before the next preparation, as a candidate child's call drops its own
    # (a local of the call): held through the next call, the outputs would take two blocks in turn, and the
    # calls alternate between two placements where the candidate's keep one.
    with torch.no_grad():
        for position in range(warmup):
            output = None
            prepare(position)
            output = call()
        flush = flush_buffer(l2_flush_bytes, device_type)
        if device_type == "cuda":
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
            torch.cuda.synchronize()
            for i in range(repeats):
                output = None
                prepare(warmup + i)
                if flush is not None:
                    flush.zero_()
                torch.cuda._sleep(pad_cycles or LAUNCH_PAD_CYCLES)
                starts[i].record()
                output = call()
                ends[i].record()
                torch.cuda.synchronize()
            samples = [s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)]
        else:
            samples = []
            for i in range(repeats):
                output = None
                prepare(warmup + i)
                flush_l2(flush)
                begin = _clock_ns()
                output = call()
                samples.append((_clock_ns() - begin) / 1000.0)
    return samples, output


def tensor_sizes(value) -> list[int]:
    """Byte sizes of the tensors in a nested value (the allocation sizes worth poisoning)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value.numel() * value.element_size()] if value.numel() else []
    if isinstance(value, (list, tuple)):
        return [n for v in value for n in tensor_sizes(v)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in tensor_sizes(v)]
    return []


def poison_sizes(kept: list[int], sizes: list[int]) -> list[int]:
    """The block sizes to poison before the next call: the four largest output sizes seen so far (where an
    output the call allocates with empty_like lands)."""
    return sorted({*kept, *sizes})[-4:]


def poison_allocator(block_sizes: list[int], parity: int, device_type: str) -> None:
    """Allocate blocks of the given byte sizes, fill them with a poison pattern and free them,
    so that an output the candidate allocates next starts out as poison, not as an earlier
    result (torch's caching allocator on CUDA, malloc's free lists on the host)."""
    import torch

    device = "cuda" if device_type == "cuda" else "cpu"
    value = POISON_BYTES[parity % len(POISON_BYTES)]
    # On the host, blocks above malloc's largest mmap threshold come back from the OS zeroed
    # and are unmapped when freed: poisoning them would cost time and reach nothing.
    limit = None if device == "cuda" else HOST_MMAP_THRESHOLD_MAX
    blocks = [torch.empty(n, dtype=torch.uint8, device=device).fill_(value)
              for n in block_sizes if n > 0 and (limit is None or n <= limit)]
    del blocks


def flush_buffer(nbytes: int, device_type: str):
    """A buffer whose zeroing evicts the caches before a call (GPU: L2; host: the CPU's caches), or None
    when `nbytes` is 0."""
    if nbytes <= 0:
        return None
    import torch

    return torch.empty(max(nbytes // 4, 1), dtype=torch.int32, device="cuda" if device_type == "cuda" else "cpu")


def flush_l2(buffer) -> None:
    """Zero a buffer larger than the cache (no-op without one)."""
    if buffer is not None:
        buffer.zero_()


def requested_pad(request: dict) -> int | None:
    """The launch pad a timing request asks for (`launch_pad_cycles`), None for the default."""
    pad = request.get("launch_pad_cycles")
    return int(pad) if pad else None


def time_one_call(call, device_type: str, window=None, pad_cycles: int | None = None):
    """(output, device_time_us, wall_time_us) of one call; `window`: a context entered around the
    events and the call (the kernel trace's range of this call); `pad_cycles`: the launch pad (None:
    LAUNCH_PAD_CYCLES).

    CUDA: events around the call on the current stream, then a device-wide synchronize (work
    left on other streams finishes before the wall clock stops); the wall time (which also
    covers the rest of the L2 flush and the launch) is a cross-check. Host: the wall clock.
    """
    if device_type == "cuda":
        import torch

        event, record, elapsed_time, synchronize, sleep = _cuda_timing or (
            torch.cuda.Event, torch.cuda.Event.record, torch.cuda.Event.elapsed_time, torch.cuda.synchronize,
            torch.cuda._sleep)
        # No synchronize before the start event: the L2 flush and the launch pad queued just
        # before keep the GPU busy while the host reaches the launch, so the host overhead of
        # the call and the guard is not counted as GPU time. The previous call ended synchronised.
        start, end = event(enable_timing=True), event(enable_timing=True)
        sleep(pad_cycles or LAUNCH_PAD_CYCLES)
        begin = _clock_ns()
        with window or contextlib.nullcontext():
            record(start)
            output = call()
            record(end)
        synchronize()
        wall_us = (_clock_ns() - begin) / 1000.0
        return output, elapsed_time(start, end) * 1000.0, wall_us
    begin = _clock_ns()
    output = call()
    wall_us = (_clock_ns() - begin) / 1000.0
    return output, wall_us, wall_us
