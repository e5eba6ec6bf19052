"""Benchmark metrics over one candidate per task (docs/paper.md §10, KernelBench's fast_p).

pass rate        correct / all tasks
faster rate      correct and speed-up > 1, over all tasks (vs eager, vs compile)
geomean speedup  geometric mean over correct candidates with a timing
fast_p           correct and speed-up > p, over all tasks, p in FAST_P_THRESHOLDS
"""

from __future__ import annotations

import math

FAST_P_THRESHOLDS = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)


def geometric_mean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def fast_p(records: list[dict], baseline: str, p: float) -> float:
    """Share of all tasks whose candidate is correct and more than p times faster than `baseline`."""
    if not records:
        return 0.0
    hits = 0
    for r in records:
        if r.get("status") != "correct":
            continue
        speedup = (r.get("speedup") or {}).get(baseline)
        if p == 0.0 or (speedup is not None and speedup > p):
            hits += 1
    return hits / len(records)


def bench_metrics(records: list[dict]) -> dict:
    """The KernelBench-style summary of one record per task."""
    n = len(records)
    correct = [r for r in records if r.get("status") == "correct"]
    out = {"tasks": n, "correct": len(correct), "pass_rate": len(correct) / n if n else 0.0}
    for baseline in ("eager", "compile"):
        speedups = [r["speedup"][baseline] for r in correct if (r.get("speedup") or {}).get(baseline)]
        out[f"faster_rate_vs_{baseline}"] = fast_p(records, baseline, 1.0)
        out[f"geomean_speedup_vs_{baseline}"] = geometric_mean(speedups)
        out[f"fast_p_vs_{baseline}"] = {str(p): fast_p(records, baseline, p) for p in FAST_P_THRESHOLDS}
    rewards = [r["reward"] for r in records if r.get("reward") is not None]
    out["mean_reward"] = sum(rewards) / len(rewards) if rewards else None
    statuses = sorted({r.get("status") for r in records})
    out["statuses"] = {s: sum(1 for r in records if r.get("status") == s) for s in statuses}
    return out
