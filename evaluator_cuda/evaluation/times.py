"""The baselines (cached, or measured in the reference child) and the candidate's times."""

from __future__ import annotations

import time

from ..isolation.sandbox import Child
from ..progress import say
from ..roles.inputs import nbytes
from ..settings import EvalSettings
from ..tasks import Task
from ..timing.baselines import BaselineCache, baseline_key
from ..timing.host_baselines import host_baselines, host_eager_sample
from ..timing.profile import summarize_times
from ..timing.stability import baseline_protocol, baseline_recheck, eager_drift, timing_se_bound, unstable_times
from ..verdict.bounds import speed_of_light
from ..verdict.fault import Verdict, reference_failure, reply
from .calls import Calls
from .judging import Expected
from .loading import TimedSets


def record_times(reference: Child, task: Task, calls: Calls, timed: TimedSets, expected: Expected,
                 settings: EvalSettings, record: dict, begin: float, eager_before: dict | None) -> None:
    """The baselines' times and the candidate's, the eager times before and after the calls, and the
    speed-of-light flag."""
    baselines, eager_after = _baselines(reference, task, settings, record)
    if eager_before is not None and eager_after is not None:
        record["eager_drift"] = eager_drift(eager_before, eager_after, settings.margin)
    record["times_us"]["eager"] = baselines.get("eager")
    if calls.paired_eager:  # the host: eager timed call by call beside the candidate's calls
        record["times_us"]["eager_baseline"] = baselines.get("eager")
        record["times_us"]["eager"] = {**summarize_times(calls.paired_eager), "paired": True}
    record["times_us"]["compile"] = baselines.get("compile")
    if baselines.get("compile_error"):
        record["compile_baseline_error"] = baselines["compile_error"]
    record["times_us"]["candidate"] = valid_times(calls.times, calls.walls, pairs=settings.device_type() == "cuda")
    record["wall_s"]["profile"] = round(time.perf_counter() - begin - record["wall_s"]["verify"], 4)
    output_bytes = nbytes(expected.at[expected.checks[0]]) if expected.checks else 0
    median = record["times_us"]["candidate"]["median_us"]
    record.update(speed_of_light(timed.set_bytes + output_bytes, median, settings.peak_bandwidth))


def _baselines(reference: Child, task: Task, settings: EvalSettings, record: dict) -> tuple[dict, dict | None]:
    """The eager and torch.compile times of the task: from the cache when a fresh eager sample taken
    now agrees with the cached eager time, else (or with settings.refresh_baselines) measured now in the
    reference child (the candidate's child is idle then). With them, the eager time taken now (that
    sample, or the measured one)."""
    protocol = _protocol(settings, record)
    record["baseline_inputs"] = protocol.get("inputs", "one_set_cloned")  # how each baseline call gets its set
    torch_version = record["versions"].get("torch") or ""
    key = baseline_key(task.source, record["device"] or "", torch_version, settings.compile_mode, protocol)
    cache = BaselineCache(settings.cache_path() / "baselines")
    baselines, eager_now = (None if settings.refresh_baselines else cache.get(key)), None
    if baselines is not None:
        eager_now = eager_sample(reference, settings, protocol)
        check = baseline_recheck(baselines["eager"], eager_now, settings.margin)
        record["baseline_recheck"] = check
        if check["stale"]:
            say(f"the cached eager time ({check['cached_us']:.1f} us) disagrees with a fresh sample "
                f"({check['fresh_us']:.1f} us): measuring the baselines again")
            baselines = None
    record["baseline_cache_hit"] = baselines is not None
    if baselines is None:
        say("measuring the eager and torch.compile baselines " +
            ("anew (--refresh-baselines)" if settings.refresh_baselines else "(cached afterwards)"))
        begin = time.perf_counter()
        baselines = measure_baselines(reference, settings, protocol)
        baselines.update(task=task.name, device=record["device"], torch=record["versions"].get("torch"),
                         compile_mode=settings.compile_mode)
        unstable = unstable_times({k: baselines.get(k) for k in ("eager", "compile")}, timing_se_bound(settings))
        if unstable:  # measured again next time, on a quieter machine perhaps
            record["baseline_not_cached"] = unstable
        else:
            cache.put(key, baselines)
        record["wall_s"]["baselines"] = round(time.perf_counter() - begin, 4)
        if baselines.get("compile_first_call_s") is not None:  # torch.compile's work, within the baselines
            record["wall_s"]["compile_first_call"] = round(baselines["compile_first_call_s"], 4)
        eager_now = baselines.get("eager")
    return baselines, eager_now


def measure_baselines(reference: Child, settings: EvalSettings, protocol: dict) -> dict:
    if settings.time_baselines_per_request():  # one request per call, as the candidate's calls come
        measured = host_baselines(reference, settings, timing_se_bound(settings))
    else:
        request = {"cmd": "baselines", "compile_mode": settings.compile_mode,
                   "compile_threads": settings.compile_threads, **protocol,
                   "se_bound": timing_se_bound(settings), "budget_s": settings.baseline_budget_s}
        measured = reply(reference, request, settings.child_timeout_s, harness=True)
        if not measured.get("ok"):
            raise reference_failure(measured)
    return {k: measured.get(k) for k in ("eager", "compile", "compile_error", "compile_first_call_s")}


def eager_now(reference: Child, settings: EvalSettings, record: dict) -> dict:
    """Eager timed now, as the baselines are: the bracket taken before the candidate's calls."""
    return eager_sample(reference, settings, _protocol(settings, record))


def _protocol(settings: EvalSettings, record: dict) -> dict:
    """The baseline protocol of this evaluation: its sets made from seeds or not (record["inputs_by_seed"])."""
    return baseline_protocol(settings, bool(record.get("inputs_by_seed")))


def eager_sample(reference: Child, settings: EvalSettings, protocol: dict) -> dict:
    """One round of eager calls timed now, as the baselines are timed."""
    if settings.time_baselines_per_request():
        return host_eager_sample(reference, settings)
    request = {"cmd": "baselines", "eager_only": True, **protocol, "se_bound": None, "budget_s": 0.0}
    answer = reply(reference, request, settings.child_timeout_s, harness=True)
    if not answer.get("ok"):
        raise reference_failure(answer)
    return answer["eager"]


def valid_times(times, walls=None, pairs: bool = False) -> dict:
    if not times or not all(isinstance(t, (int, float)) and t > 0 for t in times):
        raise Verdict("runtime_error", "the candidate process reported no valid timing")
    stats = summarize_times([float(t) for t in times], pairs=pairs)
    if walls and all(isinstance(w, (int, float)) for w in walls):
        stats["wall_median_us"] = summarize_times([float(w) for w in walls], pairs=pairs)["median_us"]
    return stats

