"""The children load; the check sets and their reference outputs; ModelNew prepared; the timed input
sets chosen."""

from __future__ import annotations

import dataclasses
import secrets
import time
from pathlib import Path

from ..isolation.sandbox import Child, ChildFailed
from ..settings import EvalSettings
from ..solutions import Solution
from ..tasks import Task, degenerate_reason
from ..timing.host_pin import choose_cpu
from ..verdict.fault import Verdict, candidate_failure, reference_failure, reply


def load_children(reference: Child, candidate: Child, task: Task, solution: Solution, settings: EvalSettings,
          extension: Path | None, solution_dir: Path, record: dict,
          runtime: Path | None = None) -> tuple[dict, list[int]]:
    """Both children load at once: the task's Model from a secret seed in one, the candidate in
    the other. Returns the reference's answer (init inputs, state dict) and the check seeds."""
    init_seed = secrets.randbits(31)
    seeds = [secrets.randbits(31) for _ in range(settings.checks)]
    record["seeds"] = {"init": init_seed, "inputs": seeds}
    device = settings.device_type()
    pinning = _host_pinning(settings)
    reference.submit({"cmd": "load", "task_name": task.name, "task_source": task.source, "device": device,
                     "init_seed": init_seed, **pinning})
    candidate.submit({
        "cmd": "load", "format": solution.format, "entry": solution.entry, "solution_dir": str(solution_dir),
        "extension_path": str(extension) if extension else None, "task_name": task.name,
        "fast_cache_dir": str(settings.cache_path() / "fastbuild"),
        "binding_runtime": str(runtime) if runtime else None,
        "task_source": task.source, "device": device,
        "block_torch": settings.block_torch and solution.format != "reference",
        "commit_output_bytes": settings.commit_output_bytes,
        **pinning,
    })
    record["host_timing"] = pinning or None
    loaded = _reference_loaded(reference, settings)
    record["device"] = loaded.get("device_name")
    record["versions"].update(torch=loaded.get("torch_version"), cuda=loaded.get("cuda_version"))
    # CUDA: whether the baseline calls demote persisting L2 lines as the candidate's do (persisting_l2_reset)
    record["baseline_persisting_l2_reset"] = loaded.get("persisting_l2_reset")
    candidate_loaded = _candidate_loaded(candidate, solution, settings)
    loaded["candidate_makes_inputs"] = bool(candidate_loaded.get("makes_inputs"))
    return loaded, seeds


def start_split(marks_by_role: dict, started_at: float) -> dict:
    """Seconds from the slot's start to each mark a child reported when its start was done (roles/child.py:
    serve, warm: torch and the CUDA context, trace: the kernel trace begun, ready: its answer), per role.
    Reported by harness code before any candidate code loads; a diagnostic the verdict never reads."""
    split = {}
    for role, marks in marks_by_role.items():
        if isinstance(marks, dict):
            split[role] = {str(k): round(float(v) - started_at, 3) for k, v in marks.items()
                           if isinstance(v, (int, float))}
    return split


def _host_pinning(settings: EvalSettings) -> dict:
    """Threads and CPU of both children's timed calls on the host backend (timing/host_pin.py)."""
    if settings.device_type() != "cpu":
        return {}
    return {"host_threads": settings.host_threads, "host_cpu": choose_cpu() if settings.host_pin_cpu else None}


def _reference_loaded(reference: Child, settings: EvalSettings) -> dict:
    """The reference's load: an import (torch, the task's model) like the candidate's, so it gets the
    import limit when that is longer than the per-request child limit (a short `--timeout`)."""
    try:
        loaded = reference.result(max(settings.child_timeout_s, settings.import_timeout_s))
    except ChildFailed as exc:
        raise Verdict("infra_error", str(exc)) from None
    if not loaded.get("ok"):
        raise reference_failure(loaded)
    return loaded


def _candidate_loaded(candidate: Child, solution: Solution, settings: EvalSettings) -> dict:
    """The candidate's load (a KernelBench file builds its own extension here: its timeout is
    a compile_error); its answer."""
    timeout = settings.import_timeout_s + (settings.compile_timeout_s if solution.format == "kernelbench" else 0.0)
    try:
        loaded = candidate.result(timeout)
    except ChildFailed as exc:
        kind = "compile_error" if (exc.kind == "timeout" and solution.format == "kernelbench") else "runtime_error"
        raise Verdict(kind, f"loading the candidate: {exc}") from None
    if not loaded.get("ok"):
        if loaded.get("kind") == "task" and solution.format == "reference":  # the task's code failed to load
            raise Verdict("task_error", loaded.get("message", ""))
        raise candidate_failure(loaded)
    return loaded


def check_sets(reference: Child, task: Task, seeds: list[int], settings: EvalSettings, record: dict,
               candidate_makes_inputs: bool = False) -> dict:
    """The check sets' reference outputs (the first set run twice, so that a random task shows), and
    their inputs unless the candidate child makes every set from its seed (`by_seed`: asked for when both
    the settings and the candidate child can, granted by the reference child when the task's get_inputs
    makes the same set twice). A degenerate task is a task_error."""
    begin = time.perf_counter()
    asked = settings.inputs_from_seeds and candidate_makes_inputs
    request = {"cmd": "reference", "seeds": seeds, "rerun": True, "by_seed": asked}
    sets = reply(reference, request, settings.child_timeout_s, harness=True)
    if not sets.get("ok"):
        raise reference_failure(sets)
    record["inputs_by_seed"] = bool(sets.get("by_seed"))
    if asked and not sets.get("by_seed"):
        record["inputs_sent_because"] = str(sets.get("by_seed_refused") or "the reference child made them")
    # An upper bound on one reference call (input generation included): the candidate's call limit
    record["reference_call_s"] = round((time.perf_counter() - begin) / (len(seeds) + 1), 6)
    record["call_timeout_s"] = round(call_timeout(record["reference_call_s"], settings), 3)
    record["inputs_generated_on"] = sets.get("generated_on")
    if sets.get("random"):
        degenerate = "random: two runs on the same inputs disagree"
    else:
        degenerate = degenerate_reason(sets["outputs"], None, settings.atol, settings.rtol)
    if degenerate:
        record["task_degenerate"] = degenerate
        raise Verdict("task_error", f"task {task.name}: degenerate: {degenerate}")
    return sets


def call_timeout(reference_call_s: float | None, settings: EvalSettings) -> float:
    """The limit of one candidate call: a multiple of the reference's call plus a few seconds,
    never above the child timeout (docs/cheats.md: a loop in forward)."""
    if reference_call_s is None:
        return settings.child_timeout_s
    derived = settings.call_timeout_factor * reference_call_s + settings.call_timeout_extra_s
    return min(settings.child_timeout_s, derived)


def prepare_candidate(candidate: Child, loaded: dict, settings: EvalSettings) -> None:
    """ModelNew built with the reference's constructor arguments and weights."""
    request = {"cmd": "prepare", "init_inputs": loaded["init_inputs"], "state_dict": loaded["state_dict"]}
    prepared = reply(candidate, request, settings.import_timeout_s, harness=False)
    if not prepared.get("ok"):
        raise candidate_failure(prepared)


@dataclasses.dataclass
class TimedSets:
    seeds: list[int]  # one per distinct timed input set
    inputs: list  # the sets' values, sent with their first calls ([] when made from seeds)
    calls: int  # warm-up and timed calls (0 without profiling)
    set_bytes: int  # bytes of one input set
    by_seed: bool = False  # the candidate child makes each set from its seed
    generated_on: str | None = None  # where the sets are made ("cuda" or "cpu")


def timed_sets(reference: Child, sets: dict, settings: EvalSettings, record: dict) -> TimedSets:
    """Input sets of the timed calls. Made from seeds in the candidate child: a fresh seed per call.
    Sent: fresh sets per call while they fit the byte budget, else a rotating pool. Their reference
    outputs are computed in the reference child (when the sets are sent, now) and kept until asked for."""
    calls = settings.warmup + settings.repeats if settings.profile else 0
    set_bytes = max(1, int(sets.get("input_bytes") or 0))
    by_seed = bool(sets.get("by_seed"))
    distinct = calls if by_seed else (min(calls, max(1, settings.fresh_input_bytes // set_bytes)) if calls else 0)
    seeds = [secrets.randbits(31) for _ in range(distinct)]
    record["seeds"]["timed"] = seeds
    record["fresh_inputs_per_call"] = distinct == calls
    inputs = []
    if distinct and not by_seed:
        got = reply(reference, {"cmd": "inputs", "seeds": seeds}, settings.child_timeout_s, harness=True)
        if not got.get("ok"):
            raise reference_failure(got)
        inputs = got["inputs"]
    return TimedSets(seeds, inputs, calls, set_bytes, by_seed, sets.get("generated_on"))
