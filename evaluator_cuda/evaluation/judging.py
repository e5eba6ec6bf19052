"""The verdict on the outputs: the reference output of every checked call, compared here (on the GPU
when this process can use it)."""

from __future__ import annotations

import dataclasses

from ..isolation.sandbox import Child
from ..settings import EvalSettings
from ..verdict.bounds import precision
from ..verdict.fault import Verdict, reference_failure, rejection, reply
from ..verdict.verify import (compare_outputs, criterion_of, on_device, outputs_ignore_inputs, relative_error,
                              scale_problem, tolerances)
from .calls import Calls


def judge_timed_outputs(calls: "Calls", expected: "Expected", settings: EvalSettings, record: dict) -> None:
    _reject_wrong(calls, _compare(calls, expected, settings)[1], record)


@dataclasses.dataclass
class Expected:
    at: dict  # position -> reference output
    checks: list  # positions of the check calls
    timed: list  # positions of the checked timed calls


def expected_outputs(reference: Child, calls: Calls, check_outputs: list, timed_seeds: list[int],
                     settings: EvalSettings) -> Expected:
    """The reference output of every checked call; those of timed calls kept in the reference child."""
    checks = sorted(k for k in calls.outputs if calls.schedule[k][0] == "check")
    timed = sorted(k for k in calls.outputs if calls.schedule[k][0] == "timed")
    expected_timed = []
    if timed:
        request = {"cmd": "outputs", "seeds": [timed_seeds[calls.schedule[k][1]] for k in timed]}
        more = reply(reference, request, settings.child_timeout_s, harness=True)
        if not more.get("ok"):
            raise reference_failure(more)
        expected_timed = more["outputs"]
    at = {k: check_outputs[calls.schedule[k][1]] for k in checks}
    at.update(zip(timed, expected_timed))
    return Expected(at, checks, timed)


def judge_device(settings: EvalSettings) -> str:
    """Where the outputs are compared: the GPU of a CUDA evaluation when this process can use it
    (`judge_on_device`), else the CPU. Large outputs take seconds to compare on the CPU."""
    if not (settings.judge_on_device and settings.device_type() == "cuda"):
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def judge_outputs(calls: Calls, expected: Expected, settings: EvalSettings, record: dict, judge=None) -> None:
    """The verdict on the outputs (`judge`: _judge), on judge_device(); the device copies are released after it."""
    judge = judge or _judge
    device = judge_device(settings)
    record["judged_on"] = device
    if device == "cpu":
        return judge(calls, expected, settings, record)
    import torch

    outputs = {k: (on_device(value, device), meta) for k, (value, meta) in calls.outputs.items()}
    at = {k: on_device(value, device) for k, value in expected.at.items()}
    try:
        judge(dataclasses.replace(calls, outputs=outputs), dataclasses.replace(expected, at=at), settings, record)
    finally:
        del outputs, at
        torch.cuda.empty_cache()


def _judge(calls: Calls, expected: Expected, settings: EvalSettings, record: dict) -> None:
    """Every checked output against its reference; then outputs that ignore their inputs and
    the precision of the output's dtype."""
    if expected.checks:
        first = expected.at[expected.checks[0]]
        record["tolerance"] = tolerances(first, settings.atol, settings.rtol, settings.norm_rtol)
    worst_error, wrong = _compare(calls, expected, settings)
    _reject_wrong(calls, wrong, record)
    checked = [expected.at[k] for k in expected.checks], [calls.outputs[k][0] for k in expected.checks]
    if outputs_ignore_inputs(*checked):
        record["failed_criterion"] = "constant_output"
        raise rejection("constant_output", "the output does not change when the inputs change")
    record["checked_calls"] = {"checks": len(expected.checks), "timed": len(expected.timed),
                               "calls": len(calls.schedule)}
    record["precision"] = precision(expected.at[expected.checks[0]] if expected.checks else None, worst_error)
    if record["precision"]["downgrade_suspected"] and settings.reject_precision_downgrade:
        bound = record["precision"]["bound"]
        message = f"relative error {worst_error:.3g} exceeds the {bound:g} an honest kernel of this dtype reaches"
        raise rejection("precision_downgrade", message)


def _reject_wrong(calls: Calls, wrong: tuple | None, record: dict) -> None:
    """`incorrect` for the first wrong output _compare() found (position, problem), naming its call."""
    if wrong is None:
        return
    position, problem = wrong
    kind, index = calls.schedule[position]
    what = f"input set {index}" if kind == "check" else "output of a timed call"
    record["failed_criterion"] = criterion_of(problem)
    raise Verdict("incorrect", f"{what}: {problem}")


def _compare(calls: Calls, expected: Expected, settings: EvalSettings) -> tuple[float | None, tuple | None]:
    """The worst relative error of the checked outputs, and the first wrong one as (position,
    problem), or None."""
    worst = None
    for k in expected.checks + expected.timed:
        actual, meta = calls.outputs[k]
        problem = compare_outputs(expected.at[k], actual, meta, settings.device_type(), settings.atol, settings.rtol)
        err = relative_error(expected.at[k], actual) if not problem else None
        problem = problem or scale_problem(err, settings.norm_rtol)
        if problem:
            return worst, (k, problem)
        worst = err if worst is None or (err is not None and err > worst) else worst
    return worst, None

