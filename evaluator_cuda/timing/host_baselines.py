"""Host baselines timed the way the candidate is timed: one request per call.

On the host the candidate's calls each arrive over the child's channel, after fresh input copies
and a poisoned allocator; a process woken for each call finds colder caches than a loop of calls
in one go. Timing the baselines in a loop made the unchanged reference look 2-3x slower than
itself. Here the parent sends the reference child one request per baseline call, each preceded by
the same preparation (roles/reference.py `do_time_call`), in rounds until the median is precise
enough (timing/stability.py) or the budget is spent. With `baselines_per_request` a CUDA evaluation
times its baselines this way too (summarized as pair means, as the candidate's calls are there).
"""

from __future__ import annotations

import time

from ..isolation.sandbox import Child
from ..verdict.fault import reference_failure, reply
from .profile import summarize_times


def host_baselines(reference: Child, settings, bound: float) -> dict:
    """{"eager", "compile", "compile_error", "compile_first_call_s"} like the looped baselines."""
    result = {"eager": _timed(reference, "eager", settings, bound, settings.baseline_budget_s / 2),
              "compile": None, "compile_error": None}
    request = {"cmd": "prepare_compiled", "compile_mode": settings.compile_mode,
               "compile_threads": settings.compile_threads}
    prepared = reply(reference, request, settings.child_timeout_s, harness=True)
    if not prepared.get("ok"):
        raise reference_failure(prepared)
    if prepared.get("error"):
        result["compile_error"] = prepared["error"]
        return result
    result["compile_first_call_s"] = prepared.get("first_call_s")
    result["compile"] = _timed(reference, "compile", settings, bound, settings.baseline_budget_s / 2)
    return result


def host_eager_sample(reference: Child, settings) -> dict:
    """One round of eager calls, timed as the baselines are: the fresh sample a cached eager time is
    checked against."""
    return summarize_times(_round(reference, "eager", settings, settings.warmup), _pairs(settings))


def host_eager_call(reference: Child, settings, position: int) -> float:
    """One eager call timed in the reference child (µs), prepared as the candidate's call at `position` is:
    the eager time paired with that call."""
    return _round(reference, "eager", settings, 0, first=position, count=1)[0]


def _timed(reference: Child, which: str, settings, bound: float, budget_s: float) -> dict:
    begin = time.perf_counter()
    samples = _round(reference, which, settings, settings.warmup)
    rounds = 1
    pairs = _pairs(settings)
    while (summarize_times(samples, pairs)["median_rel_se"] or 0.0) > bound and time.perf_counter() - begin < budget_s:
        samples += _round(reference, which, settings, 0)
        rounds += 1
    return {**summarize_times(samples, pairs), "rounds": rounds}


def _pairs(settings) -> bool:
    """Summarized as the candidate's calls are (evaluation/times.py valid_times): pair means on CUDA."""
    return settings.device_type() == "cuda"


def _round(reference: Child, which: str, settings, warmup: int, first: int = 0,
           count: int | None = None) -> list[float]:
    samples = []
    for position in range(first, first + (warmup + settings.repeats if count is None else count)):
        answer = reply(reference, {"cmd": "time_call", "which": which, "poison": position % 2,
                                   "l2_flush_bytes": settings.l2_flush_bytes,
                                   "launch_pad_cycles": settings.launch_pad_cycles},
                       settings.child_timeout_s, harness=True)
        if not answer.get("ok"):
            raise reference_failure(answer)
        if position >= first + warmup:
            samples.append(float(answer["time_us"]))
    return samples
