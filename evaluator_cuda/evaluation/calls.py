"""The candidate's calls: one schedule (verdict/schedule.py), every call through the same path in the
candidate child, its answer, time and (for a checked call) output gathered here."""

from __future__ import annotations

import dataclasses
import time

from ..isolation.commitment import value_digest
from ..isolation.sandbox import Child
from ..settings import EvalSettings
from ..timing.call_split import summarize_split
from ..timing.host_baselines import host_eager_call
from ..verdict.fault import Verdict, candidate_failure, output_meta, reading_candidate_reply, rejection, reply
from ..verdict.schedule import CallRequests, call_schedule
from .loading import TimedSets, call_timeout


@dataclasses.dataclass
class Calls:
    schedule: list  # (kind, input set) per call, in order
    outputs: dict  # position -> (output, the candidate's description of its tensors), checked calls only
    times: list  # per-call device times (µs) after the warm-up
    walls: list  # per-call wall times (µs) after the warm-up
    outside: list = dataclasses.field(default_factory=list)  # per-call round trips (µs), the parent's clock
    splits: list = dataclasses.field(default_factory=list)  # per call: the candidate child's split (µs)
    round_trips: list = dataclasses.field(default_factory=list)  # per call, warm-up included (µs)
    timed_positions: list = dataclasses.field(default_factory=list)  # positions of the timed calls
    paired_eager: list = dataclasses.field(default_factory=list)  # host: an eager call's time (µs) per timed call


def run_calls(candidate: Child, reference: Child, check_inputs: list, check_seeds: list[int], timed: TimedSets,
              settings: EvalSettings, record: dict) -> tuple[Calls, "Caller"]:
    """Every call of one schedule (verdict/schedule.py), through the same path in the candidate child;
    with the caller that makes further rounds of them later (rounds.py).

    Profiled on the host, each call after the warm-up is paired with one eager call in the reference
    child, just before it or just after it in turn: the two medians then come from the same seconds
    of a machine whose speed drifts by tens of percent from one second to the next."""
    schedule, sampled = call_schedule(settings.checks, timed.calls, len(timed.seeds), settings.timed_checks)
    seeds = {"check": check_seeds, "timed": timed.seeds} if timed.by_seed else None
    requests = CallRequests(schedule, check_inputs, timed.inputs, settings.l2_flush_bytes, settings.launch_pad_cycles,
                            seeds, timed.generated_on)
    calls = Calls(list(schedule), {}, [], [])
    caller = Caller(candidate, reference, requests, calls, settings, call_timeout(record.get("reference_call_s"), settings))
    answer: dict = {}
    for position, call in enumerate(schedule):
        answer = caller.call(position, call, checked=position in sampled)
    # CUDA: whether the driver demoted persisting L2 lines before every call (docs/cheats.md #19)
    on_cuda = settings.device_type() == "cuda"
    record["persisting_l2_reset"] = (answer.get("l2_resets") == len(schedule)) if on_cuda and schedule else None
    record["calls_split_us"] = summarize_split(calls.splits, calls.round_trips)
    return calls, caller


@dataclasses.dataclass
class Caller:
    """One call of the candidate at a time, its answer and times added to `calls`."""

    candidate: Child
    reference: Child
    requests: CallRequests
    calls: Calls
    settings: EvalSettings
    limit: float  # the candidate's call limit (call_timeout)
    paired: bool = dataclasses.field(init=False)  # host eager timed beside each timed call

    def __post_init__(self):
        settings = self.settings
        self.paired = settings.profile and settings.device_type() == "cpu" and settings.pair_host_eager

    def call(self, position: int, call: tuple, checked: bool) -> dict:
        settings, calls = self.settings, self.calls
        timeout = min(settings.child_timeout_s, self.limit + (settings.first_call_extra_s if position == 0 else 0.0))
        request = {**self.requests.request(position, call), "position": position}
        pair_now = self.paired and position >= settings.warmup
        if pair_now and position % 2 == 0:
            calls.paired_eager.append(host_eager_call(self.reference, settings, position))
        sent = time.perf_counter()
        answer = reply(self.candidate, request, timeout, harness=False)
        outside_us = (time.perf_counter() - sent) * 1e6
        if pair_now and position % 2 == 1:
            calls.paired_eager.append(host_eager_call(self.reference, settings, position))
        if not answer.get("ok"):
            raise candidate_failure(answer)
        calls.splits.append(answer.get("split_us"))
        calls.round_trips.append(outside_us)
        if call[0] == "check" or checked:
            # The candidate's description of its output (class, device) is taken before the
            # output is copied to the host; the wire's own metadata describes that copy.
            calls.outputs[position] = (_output(self.candidate, answer, self.limit), output_meta(answer))
        if position >= settings.warmup:
            calls.times.append(answer.get("time_us"))
            calls.walls.append(answer.get("wall_us"))
            calls.outside.append(outside_us)
            calls.timed_positions.append(position)
        return answer


def _output(candidate: Child, answer: dict, timeout: float):
    """A checked call's output: sent with its answer, or fetched now and bound to the digest the
    answer gave (isolation/commitment.py)."""
    if "output" in answer:
        return answer["output"]
    digest = answer.get("output_digest")
    if not isinstance(digest, str):
        raise Verdict("runtime_error", "the candidate process answered a call with neither its output nor a digest")
    fetched = reply(candidate, {"cmd": "output"}, timeout, harness=False)
    if not fetched.get("ok"):
        raise candidate_failure(fetched)
    with reading_candidate_reply("output"):
        changed = value_digest(fetched.get("output")) != digest
    if changed:
        raise rejection("output_changed", "the output sent when asked is not the one the call answered with "
                                          "(its digest differs)")
    return fetched["output"]

