"""When a measured time is known well enough to earn a speed-up reward, and what keys a baseline.

The reward compares medians with a 5 % margin. A median whose relative standard error is larger
than half that margin cannot tell a 5 % gain from noise: such a time (the candidate's, eager's or
torch.compile's) withholds the speed-up reward, and such a baseline is not cached. Unless the
speed-up is far beyond the margin (`reward_noise_cannot_make`): a candidate 4.9x faster than eager
with a 9 % standard error has earned reward 2 whatever the noise.
"""

from __future__ import annotations

import math


def timing_se_bound(settings) -> float:
    """The largest relative standard error of a median that still earns a speed-up reward."""
    return settings.timing_se_bound if settings.timing_se_bound is not None else settings.margin / 2


def unstable_times(times: dict, bound: float) -> str | None:
    """Why the named summaries (summarize_times) are not precise enough, or None. A summary without
    the figure (planted, or from before it was recorded) is not judged."""
    loose = []
    for name, stats in times.items():
        se = (stats or {}).get("median_rel_se")
        if isinstance(se, (int, float)) and se > bound:
            loose.append(f"{name} ±{se:.1%}")
    if not loose:
        return None
    return f"timing unstable: the median's relative standard error is {', '.join(loose)} (at most {bound:.1%})"


CLEAR_STANDARD_ERRORS = 3.0


def _standing(times: dict, baseline: str, margin: float) -> int | None:
    """+1 when the candidate beats `baseline` by the margin beyond CLEAR_STANDARD_ERRORS standard errors
    of the pair of medians (on the log scale, where a relative standard error is one), -1 when it misses
    it as clearly, 0 in between; None when either time is missing."""
    candidate, base = times.get("candidate") or {}, times.get(baseline) or {}
    if not candidate.get("median_us") or not base.get("median_us"):
        return None
    gap = math.log(base["median_us"] / candidate["median_us"]) - math.log1p(margin)
    noise = CLEAR_STANDARD_ERRORS * math.hypot(candidate.get("median_rel_se") or 0.0, base.get("median_rel_se") or 0.0)
    return 1 if gap > noise else -1 if gap < -noise else 0


def reward_noise_cannot_make(times: dict, margin: float) -> int:
    """The highest reward imprecise times cannot have made: 3 when the candidate clearly beats eager and
    stands clearly against torch.compile (faster or not; the medians decide), 2 when it clearly beats
    eager but not clearly compile either way, else 1."""
    if _standing(times, "eager", margin) != 1:
        return 1
    return 2 if _standing(times, "compile", margin) == 0 else 3


def baseline_protocol(settings, inputs_by_seed: bool = False) -> dict:
    """Everything besides the task, device, torch release and compile mode that changes a baseline's time.
    `inputs_by_seed`: the candidate child makes each call's set from a seed in this evaluation."""
    # "calls": each baseline call prepared as a candidate's call is (roles/reference.py CandidateLikeCalls)
    protocol = {"warmup": settings.warmup, "repeats": settings.repeats, "l2_flush_bytes": settings.l2_flush_bytes,
                "backend": settings.backend, "calls": "prepared_as_candidate_one_output_block"}
    if settings.launch_pad_cycles is not None:
        protocol["launch_pad_cycles"] = settings.launch_pad_cycles
    if settings.device_type() == "cuda" and settings.time_baselines_per_request():
        protocol["calls"] = "one_request_each"  # timing/host_baselines.py
    if settings.device_type() == "cuda" and inputs_by_seed and protocol["calls"] != "one_request_each":
        # each baseline call makes a fresh set from a seed on the device, as the candidate child does
        # (roles/reference.py CandidateLikeCalls): timed against a set kept for the whole loop, the
        # candidate's reductions were about 9 % slower in self-check (docs/figures.md)
        protocol["inputs"] = "made_per_call"
    if settings.device_type() == "cuda":  # timing/profile.py summarize_times(pairs=True)
        protocol["statistic"] = "median_of_pair_means"
        protocol["persisting_l2"] = "reset_before_each_call"  # the reference child binds the driver's reset too
    if settings.device_type() == "cpu":
        protocol.update(host_threads=settings.host_threads, host_pin_cpu=settings.host_pin_cpu,
                        host_pages="thp")  # torch's CPU blocks on huge pages (sandbox.MALLOC_ENV)
    return protocol


def _disagreement(first: dict, second: dict, margin: float) -> tuple[float, float, bool]:
    """(ratio second/first of two medians, the log-ratio allowed, whether they disagree): further from 1
    than both the margin and three standard errors of the pair allow."""
    ratio = second["median_us"] / first["median_us"]
    se = math.hypot(first.get("median_rel_se") or 0.0, second.get("median_rel_se") or 0.0)
    allowed = max(math.log1p(margin), 3.0 * se)
    return ratio, allowed, abs(math.log(ratio)) > allowed


# A fresh sample whose own noise would let the cached median be more than twice or less than half of
# it confirms nothing (its calls were descheduled, say): the cached times are not used on its word. (The
# cached median's noise was bounded when it was stored: timing_se_bound.)
RECHECK_MAX_LOG_RATIO = math.log(2.0)


def baseline_recheck(cached: dict, fresh: dict, margin: float) -> dict:
    """A cached eager time against a fresh sample of the same calls, taken in this evaluation. The
    cached one is stale (timed under another load, or on a machine that has changed since) when the
    two disagree: a baseline that is too slow would turn an unchanged reference into a speed-up. It
    is measured again as well when the sample's own noise is too wide for it to confirm anything."""
    ratio, allowed, stale = _disagreement(cached, fresh, margin)
    too_noisy = 3.0 * (fresh.get("median_rel_se") or 0.0) > RECHECK_MAX_LOG_RATIO
    return {"cached_us": cached["median_us"], "fresh_us": fresh["median_us"], "ratio": float(f"{ratio:.4g}"),
            "allowed_log_ratio": round(allowed, 4), "too_noisy": too_noisy, "stale": stale or too_noisy}


def eager_drift(before: dict, after: dict, margin: float) -> dict:
    """Eager timed just before the candidate's calls against eager timed after them (the baselines, or
    the sample that rechecks a cached one). When they disagree, the machine's speed changed during
    the evaluation (another job started or stopped), and the candidate's time, taken in between,
    cannot be compared with the baseline: its speed-up is withheld."""
    ratio, allowed, moved = _disagreement(before, after, margin)
    return {"before_us": before["median_us"], "after_us": after["median_us"], "ratio": float(f"{ratio:.4g}"),
            "allowed_log_ratio": round(allowed, 4), "moved": moved}


def drift_reason(drift: dict | None) -> str | None:
    """Why a drift withholds the speed-up, or None."""
    if not drift or not drift.get("moved"):
        return None
    return (f"the machine's speed changed during the evaluation: eager took {drift['before_us']:.1f} µs per call "
            f"before the candidate's calls and {drift['after_us']:.1f} µs after them")
