"""The evaluations of `speed`: one case and form evaluated once (baselines measured), then --evals times with
cached baselines inside children_kept_warm(), while the budget allows; the medians over them."""

from __future__ import annotations

import statistics

from evaluator_bench.report import Clock, fmt
from evaluator_bench.speed_cases import Case


class BudgetClock(Clock):
    """The clock, and the cached-baseline evaluations so far to estimate the next size's cost from."""

    def __init__(self, budget_s: float):
        super().__init__(budget_s)
        self.history: list[tuple[int, float]] = []  # (bytes per input+output set, seconds)

    def estimate_eval_s(self, io_bytes: int) -> float | None:
        """One evaluation of a new size, scaled by bytes from the earlier sizes (the most data-heavy one
        extrapolates best: min over them); None before any."""
        if not self.history:
            return None
        return max(2.0, min(seconds * io_bytes / max(b, 1) for b, seconds in self.history))


def evaluate_form(clock: BudgetClock, case: Case, form: str, task, solution, settings, evals: int, io_bytes: int,
                  notes: list) -> dict:
    """evaluate() once (baselines cached after it), then `evals` more, children kept warm throughout."""
    from evaluator_cuda.evaluation import children_kept_warm, standby_counters

    row: dict = {"case": case.name, "format": form, "evals": []}
    guess = clock.estimate_eval_s(io_bytes)
    first_guess = None if guess is None else 2.5 * guess + 20  # + eager/compile baselines on a miss
    if first_guess is not None and first_guess > clock.remaining():
        row["skipped"] = (f"skipped, budget: the first evaluation needs ~{first_guess:.0f} s (estimated), "
                          f"{clock.remaining():.0f} s left")
        notes.append(f"{case.name} {form}: {row['skipped']}")
        clock.say(notes[-1])
        return row
    with children_kept_warm():
        before = standby_counters()
        repeat_evaluations(clock, row, task, solution, settings, evals, io_bytes, notes)
        after = standby_counters()
    row["standby"] = {"hits": after["hits"] - before["hits"], "misses": after["misses"] - before["misses"]}
    good = [e for e in row["evals"] if e["status"] == "correct"]
    if good:
        row.update(medians_of(good))
    return row


def repeat_evaluations(clock: BudgetClock, row: dict, task, solution, settings, evals: int, io_bytes: int,
                       notes: list) -> None:
    """row["first"], then row["evals"]: evaluations while they stay correct and the budget allows."""
    from evaluator_cuda.evaluation import evaluate

    name = f"{row['case']} {row['format']}"
    first = row["first"] = summarize_record(evaluate(task, solution, settings))
    clock.say(f"{name} first: {first['status']} total {fmt(first['total_s'], 2)} s (baselines "
              f"{fmt(first['baselines_s'], 2)} s, hit {first['baseline_cache_hit']}) ours {fmt(first['ours_us'])} µs "
              f"eager {fmt(first['eager_us'])} compile {fmt(first['compile_us'])} {first['message'][:160]}")
    if first["status"] != "correct":
        row["error"] = f"first evaluation {first['status']}: {first['message']}"
        return
    for k in range(evals):
        last = row["evals"][-1]["total_s"] if row["evals"] else first["total_s"] - (first["baselines_s"] or 0.0)
        if last * 1.2 + 1 > clock.remaining():
            notes.append(f"{name}: {evals - k} of {evals} evaluations skipped, budget ({clock.remaining():.0f} s left, "
                         f"~{last:.0f} s each)")
            clock.say(notes[-1])
            return
        one = summarize_record(evaluate(task, solution, settings))
        row["evals"].append(one)
        if one["status"] == "correct" and one["total_s"]:
            clock.history.append((io_bytes, one["total_s"]))
        clock.say(f"{name} eval {k + 1}/{evals}: {one['status']} verify {fmt(one['verify_s'], 2)} s profile "
                  f"{fmt(one['profile_s'], 2)} s total {fmt(one['total_s'], 2)} s (baselines hit "
                  f"{one['baseline_cache_hit']}, children warm {fmt(one['children_warm_s'], 2)} s) ours "
                  f"{fmt(one['ours_us'])} µs (wall {fmt(one['ours_wall_us'])} µs)")
        if one["status"] != "correct":
            row["error"] = f"evaluation {k + 1} {one['status']}: {one['message']}"
            return


def medians_of(good: list[dict]) -> dict:
    """The row's columns over the correct cached-baseline evaluations."""
    medians = [e["ours_us"] for e in good]
    middle = statistics.median(medians)
    median = lambda key: statistics.median(key(e) for e in good)  # noqa: E731
    return dict(
        n=len(good), ours_us=middle, ours_medians_us=medians,
        spread=(max(medians) - min(medians)) / middle if len(medians) > 1 else None,
        verify_s=median(lambda e: e["verify_s"]), profile_s=median(lambda e: e["profile_s"]),
        verify_profile_s=median(lambda e: e["verify_s"] + e["profile_s"]), total_s=median(lambda e: e["total_s"]),
        rest_s=median(lambda e: e["total_s"] - e["verify_s"] - e["profile_s"] - (e["build_s"] or 0.0)),
        eager_us=good[-1]["eager_us"], compile_us=good[-1]["compile_us"], sol_bound_us=good[-1]["sol_bound_us"],
    )


def summarize_record(record: dict) -> dict:
    times = record.get("times_us") or {}
    candidate = times.get("candidate") or {}
    wall = record.get("wall_s") or {}
    return {
        "status": record["status"], "message": (record.get("message") or "")[:300], "reward": record.get("reward"),
        "baseline_cache_hit": record.get("baseline_cache_hit"), "build_s": wall.get("build"),
        "verify_s": wall.get("verify"), "profile_s": wall.get("profile"), "baselines_s": wall.get("baselines"),
        "total_s": wall.get("total"), "children_warm_s": record.get("children_warm_s"),
        "ours_us": candidate.get("median_us"), "ours_wall_us": candidate.get("wall_median_us"),
        "ours_p25_us": candidate.get("p25_us"), "ours_p75_us": candidate.get("p75_us"),
        "eager_us": (times.get("eager") or {}).get("median_us"),
        "compile_us": (times.get("compile") or {}).get("median_us"),
        "sol_bound_us": record.get("sol_bound_us"), "sol_violation": record.get("sol_violation"),
        "checked_calls": record.get("checked_calls"), "fresh_inputs_per_call": record.get("fresh_inputs_per_call"),
        "device": record.get("device"),
    }
