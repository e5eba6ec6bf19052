"""One evaluation: build, verify, profile and reward a candidate for a task.

This process decides the verdict and never imports candidate code. Two children do the work:
- the reference child (task code only): reference outputs from untouched inputs made from
  seeds chosen here per evaluation, and the eager/compile baselines on a cache miss;
- the candidate child: loads the extension and ModelNew, runs it on each call's input set (made
  there from the call's seed by the task's get_inputs, or sent), with torch compute refused, then
  times it.
Outputs travel back over the structured channel and are compared here. Whose fault a failure
is: verdict/fault.py.

The steps, in order (`_evaluate` below), each in a module of this package: static checks, build
(before.py); both children load, the check sets, the timed sets (loading.py); one schedule of calls
(calls.py); the verdict on the outputs (judging.py); further timed rounds while a median is imprecise
(rounds.py); then baselines and times (times.py).
"""

from __future__ import annotations

import atexit
import contextlib
import time

from ..extension.diagnostics import shown_to_agent
from ..extension.torch_build import build_env
from ..gpu_work import attribute_kernels, trace_env, withhold_unbelievable_times
from ..isolation import forkserver
from ..isolation.sandbox import ChildFailed, EvaluationSlot, StandbySlots, child_guard
from ..progress import say
from ..roles.errors import one_line
from ..settings import EvalSettings
from ..solutions import Solution, reference_solution
from ..tasks import Task, TaskError
from ..verdict.fault import CUDA_ERROR_MARKERS, Verdict
from ..verdict.record import finish, new_record
from .before import built_extension, check_sources, extension_copy, read_only_copy, reject_findings
from .calls import run_calls
from .judging import expected_outputs, judge_device, judge_outputs
from .loading import call_timeout, check_sets, load_children, prepare_candidate, start_split, timed_sets
from .rounds import more_rounds
from .times import eager_now, record_times

# The next evaluation's children, warming in the background (see sandbox.StandbySlots). Off
# unless a long-lived caller (a bridge worker, a benchmark of many tasks) turns it on: a
# one-shot evaluation would start children it never uses.
_STANDBY = StandbySlots()
_keep_warm = False
atexit.register(_STANDBY.close)

__all__ = ["evaluate", "check_task_degenerate", "keep_children_warm", "children_kept_warm", "standby_counters",
           "call_timeout", "judge_device"]


def keep_children_warm(enabled: bool = True) -> None:
    """Keep the next evaluation's children started and warm (torch imported, CUDA context made)
    while this process is between evaluations or finishing one, and fork children from servers that
    imported torch once (isolation/forkserver.py: the reference children from one, the jailed
    candidate and build children from another, each jailed after the fork). For long-lived callers."""
    global _keep_warm
    _keep_warm = enabled
    if enabled:
        forkserver.enable()
    else:  # the fork server stays when warming stops (forkserver.enable(False) ends it)
        _STANDBY.close()


@contextlib.contextmanager
def children_kept_warm(enabled: bool = True):
    """keep_children_warm(enabled) for a block; the previous setting afterwards."""
    previous = _keep_warm
    keep_children_warm(enabled)
    try:
        yield
    finally:
        keep_children_warm(previous)


def standby_counters() -> dict:
    """How many evaluations found their children warm (hits) or started them (misses)."""
    return {"hits": _STANDBY.hits, "misses": _STANDBY.misses}


def evaluate(task: Task, solution: Solution, settings: EvalSettings, artifact: bytes | None = None) -> dict:
    """Evaluate `solution` for `task`; returns the result record (never raises for a bad candidate)."""
    record = new_record(task.name, solution.label or task.stem, solution.format, settings)
    if solution.format == "reference":
        record["torch_blocked"] = False
    begin = time.perf_counter()
    slot = None
    try:
        # The children start first, so that they warm while the sources are checked and built.
        say("starting the sandboxed children")
        slot = _STANDBY.take({**build_env(settings), **trace_env(settings, solution.format)}, child_guard(settings),
                             settings.device_type())
        record["children_warm_s"] = round(slot.taken_at - slot.started_at, 4)
        if settings.next_children_start != "after_timing":  # the next pair warms while this one builds and loads
            _start_next_children(slot, settings, record)
        _evaluate(task, solution, settings, artifact, record, slot)
    except Verdict as verdict:
        if verdict.status == "runtime_error" and any(m in verdict.message for m in CUDA_ERROR_MARKERS):
            record["needs_recycle"] = True  # the candidate child is discarded; a worker sharing its GPU should restart
        if verdict.rejected:
            record["rejected"] = verdict.rejected
        finish(record, verdict.status, verdict.message, verdict.diagnostics)
    except Exception as exc:  # a bug in the harness itself: never the candidate's fault
        finish(record, "infra_error", f"harness error: {one_line(exc)}")
    finally:
        if slot is not None:
            _release(slot, settings)
        _diagnostics_for_agent(record, solution, settings)
        record["wall_s"]["total"] = round(time.perf_counter() - begin, 4)
    return record


def _diagnostics_for_agent(record: dict, solution: Solution, settings: EvalSettings) -> None:
    """Diagnostics name only workspace files and carry no text of others (an `#include` of an
    outside file); a compile error's message is its first shown diagnostic."""
    from cuda_agent.workspace import HARNESS_FILES

    if not record.get("diagnostics"):
        return
    own = ("/tmp/torch_extensions/", str(settings.cache_path() / "torch_extensions") + "/")  # load_inline's sources
    shown = shown_to_agent(record["diagnostics"], [*solution.files, *HARNESS_FILES, "binding.cpp"], own)
    if record["status"] == "compile_error" and shown != record["diagnostics"] and shown:
        record["message"] = shown[0]["message"]
    record["diagnostics"] = shown


def _release(slot: EvaluationSlot, settings: EvalSettings) -> None:
    """An unused slot back to the standby, a used one closed; the next ones warming when kept warm."""
    if _keep_warm and not slot.used:
        _STANDBY.give_back(slot)
    else:
        slot.close()
    if _keep_warm:
        _STANDBY.refill(slot.env, slot.guard, slot.device_type, settings.standby_pairs)


def _start_next_children(slot: EvaluationSlot, settings: EvalSettings, record: dict) -> None:
    """When kept warm, the next evaluations' pairs start now (up to settings.standby_pairs warming); the
    record says when, in seconds after this evaluation took its own pair."""
    if _keep_warm and "next_children_started_s" not in record:
        _STANDBY.refill(slot.env, slot.guard, slot.device_type, settings.standby_pairs)
        record["next_children_started_s"] = round(time.monotonic() - slot.taken_at, 4)


def _quiet_before_timing(settings: EvalSettings, record: dict) -> None:
    """With the next pair started at this evaluation's start, its timed work waits until that pair's
    start is done: no child starts (a CUDA context made, a trace begun) while anything is timed."""
    if _keep_warm and settings.next_children_start == "at_start":
        record["next_children_wait_s"] = _STANDBY.wait_ready(settings.import_timeout_s)


def _children_started(slot: EvaluationSlot, settings: EvalSettings, record: dict) -> None:
    """Wait until this evaluation's own pair is started; where their start went goes in the record.
    A pair that cannot start (a child died or hung before any request of this evaluation) is the
    machine's fault."""
    try:
        marks = slot.wait_ready(settings.import_timeout_s)
    except ChildFailed as exc:
        raise Verdict("infra_error", f"the sandboxed children did not start: {exc}") from None
    record["children_start_s"] = start_split(marks, slot.started_at)


def check_task_degenerate(task: Task, settings: EvalSettings | None = None) -> str | None:
    """Run the task's reference in a child on fresh inputs and return why it is degenerate, or None."""
    settings = settings or EvalSettings.for_backend("host")
    settings = EvalSettings.from_dict({**settings.to_dict(), "profile": False})
    record = evaluate(task, reference_solution(task.stem), settings)
    if record["status"] == "task_error" and record.get("task_degenerate"):
        return record["task_degenerate"]
    if record["status"] == "task_error":
        raise TaskError(task.name, record["message"].removeprefix(f"task {task.name}: "))
    return None


@contextlib.contextmanager
def _step(record: dict, name: str):
    """record["verify_steps_s"][name]: the wall time of one step of the verification, also when it raises."""
    begin = time.perf_counter()
    try:
        yield
    finally:
        record.setdefault("verify_steps_s", {})[name] = round(time.perf_counter() - begin, 4)


@contextlib.contextmanager
def _children(slot: EvaluationSlot):
    """The slot's (reference, candidate) children, marked used: they are never handed out again."""
    slot.used = True
    yield slot.reference, slot.candidate


def _evaluate(task: Task, solution: Solution, settings: EvalSettings, artifact: bytes | None, record: dict,
              slot: EvaluationSlot) -> None:
    """The steps of one evaluation. Each returns what the later ones need and writes the record
    fields it decides; a step that reaches a verdict raises it."""
    waiting = check_sources(solution, settings)
    extension = built_extension(solution, settings, artifact, slot.workdir, record)
    if waiting:  # it built: the names exist in torch's C++ API, and are torch compute
        reject_findings(waiting)
    extension, runtime = extension_copy(extension, slot.extension_dir, settings)
    solution_dir = read_only_copy(solution, task, slot.workdir / "solution")
    record["sandbox"] = {k: v for k, v in slot.guard.items() if k not in ("command_prefix", "jail_protections")}
    record["sandbox"]["reference_forked"] = slot.reference.forked  # from the fork server, torch imported
    record["sandbox"]["candidate_forked"] = slot.candidate.forked  # from its own server, jailed after the fork
    if slot.candidate.protections is not None:
        record["sandbox"]["jail"] = slot.candidate.protections
    begin = time.perf_counter()
    with _children(slot) as (reference, candidate):
        say("loading the reference and the candidate")
        with _step(record, "load"):
            _children_started(slot, settings, record)
            loaded, seeds = load_children(reference, candidate, task, solution, settings, extension, solution_dir,
                                          record, runtime)
        with _step(record, "check_sets"):
            checks = check_sets(reference, task, seeds, settings, record, loaded["candidate_makes_inputs"])
        with _step(record, "prepare"):
            prepare_candidate(candidate, loaded, settings)
        with _step(record, "timed_sets"):
            timed = timed_sets(reference, checks, settings, record)
        _quiet_before_timing(settings, record)
        eager_before = None
        if settings.profile:  # bracketed with the eager time after the calls: a load that changed shows
            with _step(record, "eager_before"):
                eager_before = eager_now(reference, settings, record)
        say("running the candidate's calls")
        with _step(record, "calls"):
            calls, caller = run_calls(candidate, reference, checks.get("inputs") or [], seeds, timed, settings, record)
        with _step(record, "expected"):
            expected = expected_outputs(reference, calls, checks["outputs"], timed.seeds, settings)
        with _step(record, "judge"):
            judge_outputs(calls, expected, settings, record)
        if settings.timing_rounds_budget_s > 0 and timed.calls and not caller.requests.keep_sets:  # judged first:
            with _step(record, "more_rounds"):  # no rounds for a candidate that is already wrong
                more_rounds(caller, reference, timed, len(expected.timed), settings, record)
        _start_next_children(slot, settings, record)  # the timed calls are over (when not started already)
        with _step(record, "attribution"):
            trace = attribute_kernels(candidate, solution, extension, settings, record)
        record["wall_s"]["verify"] = round(time.perf_counter() - begin, 4)
        if settings.profile:
            record_times(reference, task, calls, timed, expected, settings, record, begin, eager_before)
            withhold_unbelievable_times(calls, trace, settings, record)
    finish(record, "correct")

