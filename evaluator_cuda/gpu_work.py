"""Two steps of an evaluation on the GPU's own record of the candidate's calls: whose work ran
(the kernel trace, verdict/attribution.py) and whether the measured times can be believed.

- `attribute_kernels`: after the outputs are judged, the candidate child hands over its trace;
  GPU work outside the candidate's extension rejects it (`foreign_kernels`, `no_own_kernel`,
  `data_movement`), whatever its Python side did to the torch-compute guard.
- `withhold_unbelievable_times`: the speed-up reward is withheld (reward 1 at most, the reasons in
  `record["speedup_withheld"]`) when the traced GPU work outspans the events around the timed
  calls, when the events claim more than the parent's own clock saw pass, when a median is too
  uncertain for the margin (timing/stability.py), or when the time is below the speed-of-light bound.
"""

from __future__ import annotations

from pathlib import Path

from .isolation.sandbox import Child
from .settings import EvalSettings
from .solutions import Solution
from .timing.kernel_trace import TRACE_BEFORE_CONTEXT, TRACE_ENV
from .timing.stability import drift_reason, reward_noise_cannot_make, timing_se_bound, unstable_times
from .verdict.attribution import attribution_problem, classify, extension_symbols, span_disagreement
from .verdict.fault import Verdict, candidate_failure, reading_candidate_reply, rejection, reply


def traces_kernels(settings: EvalSettings) -> bool:
    return settings.device_type() == "cuda" and settings.kernel_attribution


def trace_env(settings: EvalSettings, solution_format: str) -> dict[str, str]:
    """What a candidate child's environment needs for its trace to start before candidate code. The
    harness self-check (format "reference": the task's own Model, nothing to attribute) is never traced:
    a trace stopped after it started leaves CUPTI loaded in the process, and the self-check's calls must be
    timed as the baselines' are."""
    if solution_format == "reference" or not traces_kernels(settings):
        return {}
    return {TRACE_ENV: TRACE_BEFORE_CONTEXT if settings.kernel_trace_start == "before_context" else "1"}


def attribute_kernels(candidate: Child, solution: Solution, extension: Path | None, settings: EvalSettings,
                      record: dict) -> dict | None:
    """The candidate's trace (None when not traced); rejects foreign GPU work when torch compute is
    refused. record["kernels"] summarises what ran."""
    if not traces_kernels(settings) or solution.format == "reference":
        return None
    answer = reply(candidate, {"cmd": "kernel_trace"}, settings.child_timeout_s, harness=False)
    if not answer.get("ok"):
        raise candidate_failure(answer)
    symbols = extension_symbols(str(extension)) if extension else None
    with reading_candidate_reply("kernel trace"):
        trace = answer.get("trace") or {}
        if not isinstance(trace, dict):
            raise TypeError(f"a {type(trace).__name__}, not a mapping")
        if trace.get("error"):  # the trace runs in the candidate's process: its failure is that process's
            raise Verdict("runtime_error", f"the kernel trace in the candidate's process failed: {trace['error']}"[:300])
        summary = classify(trace, symbols)
    record["kernels"] = {**summary, "names_checked": symbols is not None, "unlaunched": trace.get("unlaunched", 0)}
    if settings.block_torch:
        problem = attribution_problem(summary, settings.data_movement_share, calls_expected=summary["calls"])
        if problem is None and summary["calls"] == 0:
            problem = ("no_own_kernel", "the trace recorded no GPU work in any call")
        if problem:
            reason, message = problem
            shown = [{"file": None, "line": None, "message": m} for m in summary["foreign"][:5]]
            raise rejection(reason, message, shown)
    return trace


def withhold_unbelievable_times(calls, trace: dict | None, settings: EvalSettings, record: dict) -> None:
    """record["speedup_withheld"]: why the times cannot earn a speed-up reward (absent: they can)."""
    reasons = []
    if trace is not None:
        with reading_candidate_reply("kernel trace"):
            spans = [((trace.get("calls") or {}).get(str(p)) or {}).get("span_us") for p in calls.timed_positions]
            spans = [float(s) if s is not None else 0.0 for s in spans]
        disagreement = span_disagreement(spans, calls.times, settings.span_tolerance, settings.span_slack_us)
        if disagreement:
            reasons.append(disagreement)
        record["times_us"]["candidate"]["gpu_span_median_us"] = _median(spans)
    outside = _median(calls.outside)
    if outside is not None:
        record["times_us"]["candidate"]["outside_median_us"] = round(outside, 3)
        claimed = max((m for m in (_median(calls.walls), _median(calls.times)) if m is not None), default=None)
        if claimed is not None and claimed > outside:
            reasons.append(f"the candidate's process reported {claimed:.1f} µs per call, more than the "
                           f"{outside:.1f} µs the evaluator's own clock saw pass")
    unstable = unstable_times({k: record["times_us"].get(k) for k in ("candidate", "eager", "compile")},
                              timing_se_bound(settings))
    cap = reward_noise_cannot_make(record["times_us"], settings.margin) if unstable else 3
    if cap == 1 and unstable:
        reasons.append(unstable)
    elif unstable:  # imprecise, but the speed-up over eager is far beyond the margin
        record["noise_outweighed"] = unstable
        if cap == 2:
            record["reward_cap"] = 2  # clearly faster than eager; against torch.compile the noise decides
    drift = drift_reason(record.get("eager_drift"))
    if drift:
        reasons.append(drift)
    if record.get("sol_violation"):
        reasons.append(f"the time is below the speed-of-light bound ({record.get('sol_bound_us', 0):.2f} µs)")
    if reasons:
        record["speedup_withheld"] = reasons


def _median(values: list) -> float | None:
    ordered = sorted(v for v in values if isinstance(v, (int, float)))
    return ordered[len(ordered) // 2] if ordered else None
