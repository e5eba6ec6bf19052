"""What ran on the GPU during each of the candidate's calls, recorded by CUPTI (torch.profiler).

The candidate child starts the trace before any candidate code loads (CUPTI's start-up takes
seconds on the H200, so a warming child pays it before its evaluation). Each call's window is a
profiler range opened by harness code around the timed region. At the end, `collect()` stops the
trace and reports, per call, every GPU activity launched inside that window (kernels, memcpys,
memsets, whichever stream they ran on), with the innermost torch operator that launched it and
the span from the first activity's start to the last one's end in hardware timestamps. Which of
them are the candidate's own work is decided by the parent (verdict/attribution.py).
"""

from __future__ import annotations

import bisect
import contextlib

TRACE_ENV = "CUDA_AGENT_TRACE_KERNELS"  # set in a candidate child's environment: trace from its start
TRACE_BEFORE_CONTEXT = "before_context"  # its value when the trace starts before the CUDA context
RANGE_PREFIX = "cuda_agent_call_"
MAX_ITEMS_PER_CALL = 200  # distinct (name, kind, operator) per call; more is reported as truncated
_LAUNCH_PREFIXES = ("cudaLaunch", "cuLaunch", "cudaMemcpy", "cuMemcpy", "cudaMemset", "cuMemset", "cudaGraphLaunch",
                    "cuGraphLaunch")

_profiler = None
_range = None  # torch's dispatcher-free profiler range, bound before candidate code loads
_failure = ""  # why the trace could not start


def start_trace() -> None:
    """Start recording CPU operators and GPU activity (a no-op when already started); a failure is
    kept for collect() to report."""
    global _profiler, _range, _failure
    if _profiler is not None:
        return
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile

        _range = torch._C._profiler._RecordFunctionFast
        profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        profiler.__enter__()
        _profiler = profiler
    except Exception as exc:  # reported, never fatal here: the parent decides
        _range, _failure = None, f"{type(exc).__name__}: {exc}"[:300]


def active() -> bool:
    return _profiler is not None


def call_range(position: int):
    """The profiler range of call `position` (a no-op context without a trace)."""
    if _range is None:
        return contextlib.nullcontext()
    return _range(f"{RANGE_PREFIX}{position}")


def discard_trace() -> None:
    """Stop the trace and drop what it recorded (the harness self-check: the task's own Model is not
    attributed, and the trace's cost per launched kernel would bias the times of its several kernels)."""
    global _profiler, _range
    if _profiler is None:
        return
    profiler, _profiler, _range = _profiler, None, None
    profiler.__exit__(None, None, None)


def collect() -> dict:
    """Stop the trace; {"calls": {str(position): {"span_us", "items": [[name, kind, op, count, total_us]],
    "truncated"}}, "unlaunched": n} (n: GPU activities with no launch record found), with "error" when
    there was no trace."""
    global _profiler, _range
    if _profiler is None:
        return {"calls": {}, "unlaunched": 0, "error": _failure or "the trace was not started"}
    profiler, _profiler, _range = _profiler, None, None
    profiler.__exit__(None, None, None)
    return summarize(profiler.profiler.kineto_results.events())


def summarize(events) -> dict:
    """The per-call report of a list of kineto events (name(), device_type(), correlation_id(),
    start_ns(), end_ns(), start_thread_id())."""
    cpu, device = [], []
    for event in events:
        (device if _on_gpu(event) else cpu).append(event)
    windows = _Windows([e for e in cpu if e.name().startswith(RANGE_PREFIX)])
    operators = _Operators([e for e in cpu if _is_operator(e.name())])
    launches = {e.correlation_id(): e for e in cpu if e.name().startswith(_LAUNCH_PREFIXES)}
    calls: dict[int, dict] = {}
    unlaunched = 0
    for activity in device:
        if activity.name().startswith(RANGE_PREFIX):
            continue
        launch = launches.get(activity.correlation_id())
        if launch is None:
            unlaunched += 1
            continue
        window = windows.containing(launch)
        if window is None:
            continue  # harness work between calls (input copies, poison, L2 flush, the launch pad)
        _add(calls.setdefault(window, {"first": None, "last": None, "items": {}}), activity,
             operators.innermost(launch, windows.bounds(window)))
    return {"calls": {str(position): _report(call) for position, call in calls.items()}, "unlaunched": unlaunched}


def _on_gpu(event) -> bool:
    return "CUDA" in str(event.device_type())


def _is_operator(name: str) -> bool:
    return not name.startswith(RANGE_PREFIX) and not name.startswith(("cuda", "cu")) and "::" in name


def activity_kind(name: str) -> str:
    lowered = name.lower()
    if lowered.startswith("memcpy"):
        return "memcpy"
    if lowered.startswith("memset"):
        return "memset"
    return "kernel"


def _add(call: dict, activity, operator: str | None) -> None:
    start, end = activity.start_ns(), activity.end_ns()
    call["first"] = start if call["first"] is None else min(call["first"], start)
    call["last"] = end if call["last"] is None else max(call["last"], end)
    name = activity.name()[:300]
    key = (name, activity_kind(name), operator)
    if key not in call["items"] and len(call["items"]) >= MAX_ITEMS_PER_CALL:
        call["truncated"] = True
        return
    count, total = call["items"].get(key, (0, 0.0))
    call["items"][key] = (count + 1, total + max(0, end - start) / 1000.0)


def _report(call: dict) -> dict:
    items = [[name, kind, op, count, round(total, 3)] for (name, kind, op), (count, total) in call["items"].items()]
    return {"span_us": round((call["last"] - call["first"]) / 1000.0, 3), "items": items,
            "truncated": bool(call.get("truncated"))}


class _Windows:
    """The calls' profiler ranges, per thread, sorted by start."""

    def __init__(self, ranges):
        self.by_thread: dict[int, list] = {}
        self.position: dict[int, tuple] = {}
        for event in sorted(ranges, key=lambda e: e.start_ns()):
            position = int(event.name()[len(RANGE_PREFIX):])
            self.by_thread.setdefault(event.start_thread_id(), []).append((event.start_ns(), event.end_ns(), position))
            self.position[position] = (event.start_ns(), event.end_ns())

    def containing(self, launch) -> int | None:
        spans = self.by_thread.get(launch.start_thread_id(), [])
        i = bisect.bisect_right(spans, (launch.start_ns(), float("inf"), 0)) - 1
        if i >= 0 and spans[i][0] <= launch.start_ns() <= spans[i][1]:
            return spans[i][2]
        return None

    def bounds(self, position: int) -> tuple:
        return self.position[position]


class _Operators:
    """Torch operators (aten::mm, ...) per thread, to find the innermost one around a launch."""

    def __init__(self, operators):
        self.by_thread: dict[int, list] = {}
        for event in sorted(operators, key=lambda e: e.start_ns()):
            self.by_thread.setdefault(event.start_thread_id(), []).append(event)

    def innermost(self, launch, window: tuple) -> str | None:
        best = None
        for event in self.by_thread.get(launch.start_thread_id(), []):
            if event.start_ns() > launch.start_ns():
                break
            inside_window = event.start_ns() >= window[0]
            if inside_window and event.end_ns() >= launch.start_ns():
                if best is None or event.start_ns() >= best.start_ns():
                    best = event
        return best.name() if best is not None else None
