"""Further rounds of timed calls while the candidate's median is not yet known well enough.

A fixed number of timed calls gives a median whose precision depends on the machine: on a shared
CPU a few sub-millisecond calls can leave it at ±7 % where the margin needs ±2.5 %. After the
schedule's calls, while the candidate's median (and, on the host, the paired eager median) is
less precise than the timing bound, and once the schedule's outputs have passed, one more round of
timed calls runs, until the bound is met, the round budget (`settings.timing_rounds_budget_s`) is
spent or no fresh input set fits the byte budget. Each round looks like the schedule's timed calls to
the candidate: every call has an input set of its own, never seen before, sent with the call; a
secret sample of its outputs (the share the schedule checks among its timed calls) is judged against
the reference before the next round.
"""

from __future__ import annotations

import secrets

from ..timing.profile import summarize_times


def less_precise_than(samples_by_name: dict, bound: float) -> list[str]:
    """The names whose samples' median has a relative standard error above `bound` (or cannot be told)."""
    loose = []
    for name, samples in samples_by_name.items():
        if not samples:
            continue
        se = summarize_times([float(s) for s in samples])["median_rel_se"]
        if se is None or se > bound:
            loose.append(name)
    return loose


def fresh_sets_left(sets_made: int, set_bytes: int, fresh_input_bytes: int) -> int:
    """How many more distinct input sets fit the byte budget of the timed calls."""
    return max(0, fresh_input_bytes // max(1, set_bytes) - sets_made)


def plan_round(size: int, checked: int, first_set: int) -> tuple[list[tuple[str, int]], set[int]]:
    """`size` timed calls on the new sets first_set, first_set + 1, ..., and the offsets within the
    round of the `checked` calls whose outputs are checked (a secret sample)."""
    calls = [("timed", first_set + i) for i in range(size)]
    sampled = set(secrets.SystemRandom().sample(range(size), min(checked, size)))
    return calls, sampled
