"""Further rounds of timed calls while the medians are less precise than the timing bound, each
round's secret sample of outputs judged before the next (verdict/more_rounds.py)."""

from __future__ import annotations

import dataclasses
import math
import secrets
import time

from ..isolation.sandbox import Child
from ..settings import EvalSettings
from ..timing.stability import timing_se_bound
from ..verdict.fault import reference_failure, reply
from ..verdict.more_rounds import fresh_sets_left, less_precise_than, plan_round
from .calls import Caller, Calls
from .judging import expected_outputs, judge_outputs, judge_timed_outputs
from .loading import TimedSets


def more_rounds(caller: Caller, reference: Child, timed: TimedSets, checked_in_schedule: int,
                settings: EvalSettings, record: dict) -> None:
    """Rounds of `repeats` timed calls on fresh input sets while the candidate's median (and the paired
    eager median) is less precise than the timing bound, within timing_rounds_budget_s; each round's
    secret sample of outputs is judged before the next (verdict/more_rounds.py)."""
    calls, bound = caller.calls, timing_se_bound(settings)
    checked = math.ceil(checked_in_schedule * settings.repeats / timed.calls)
    begin, rounds, calls_before = time.perf_counter(), 0, len(calls.schedule)
    try:
        while time.perf_counter() - begin < settings.timing_rounds_budget_s:
            loose = less_precise_than({"candidate": calls.times, "eager": calls.paired_eager}, bound)
            if not loose or (not timed.by_seed and fresh_sets_left(len(timed.seeds), timed.set_bytes,
                                                                  settings.fresh_input_bytes) < settings.repeats):
                break
            _one_round(caller, reference, timed, checked, settings, record)
            rounds += 1
    finally:  # also when a round's outputs were wrong: the record says which round it was
        record["timing_rounds"] = {"extra_rounds": rounds, "extra_calls": len(calls.schedule) - calls_before,
                                   "seconds": round(time.perf_counter() - begin, 4),
                                   "still_imprecise": less_precise_than(
                                       {"candidate": calls.times, "eager": calls.paired_eager}, bound)}
        record["checked_calls"]["calls"] = len(calls.schedule)


def _one_round(caller: Caller, reference: Child, timed: TimedSets, checked: int, settings: EvalSettings,
               record: dict) -> None:
    """`repeats` timed calls on new input sets, then the verdict on a secret sample of their outputs."""
    calls = caller.calls
    seeds = [secrets.randbits(31) for _ in range(settings.repeats)]
    if not timed.by_seed:
        got = reply(reference, {"cmd": "inputs", "seeds": seeds}, settings.child_timeout_s, harness=True)
        if not got.get("ok"):
            raise reference_failure(got)
        timed.inputs.extend(got["inputs"])  # the same list CallRequests sends from
    round_calls, sampled = plan_round(settings.repeats, checked, len(timed.seeds))
    timed.seeds.extend(seeds)  # the same list CallRequests takes seeds from
    positions = []
    for offset, call in enumerate(round_calls):
        calls.schedule.append(call)
        positions.append(len(calls.schedule) - 1)
        caller.call(positions[-1], call, checked=offset in sampled)
    _judge_round(reference, calls, [positions[i] for i in sorted(sampled)], timed.seeds, settings, record)


def _judge_round(reference: Child, calls: Calls, positions: list[int], timed_seeds: list[int],
                 settings: EvalSettings, record: dict) -> None:
    """The checked outputs of one further round against their reference outputs; freed once judged."""
    if not positions:
        return
    round_calls = dataclasses.replace(calls, outputs={k: calls.outputs.pop(k) for k in positions})
    expected = expected_outputs(reference, round_calls, [], timed_seeds, settings)
    judge_outputs(round_calls, expected, settings, record, judge=judge_timed_outputs)
    record["checked_calls"]["timed"] += len(positions)

