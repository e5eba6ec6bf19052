"""One evaluation: build, verify, profile and reward a candidate for a task.

This process decides the verdict and never imports candidate code. Two children do the work:
- the reference child (task code only): reference outputs from untouched inputs made from
  seeds chosen here per evaluation, and the eager/compile baselines on a cache miss;
- the candidate child: loads the extension and ModelNew, runs it on the inputs it is sent
  (never the seeds), with torch compute refused, then times it.
Outputs travel back over the structured channel and are compared here. Whose fault a failure
is: verdict/fault.py.

The steps, in order: static checks, build, both children load, the check sets, the timed sets,
one schedule of calls, the verdict on the outputs, then baselines and times.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import math
import secrets
import shutil
import time
from pathlib import Path

from .extension.build import build_workspace
from .extension.diagnostics import located, shown_to_agent
from .extension.torch_build import build_env
from .gpu_work import attribute_kernels, trace_env, withhold_unbelievable_times
from .timing.host_baselines import host_baselines, host_eager_call, host_eager_sample
from .timing.host_pin import choose_cpu
from .timing.stability import baseline_protocol, baseline_recheck, eager_drift, timing_se_bound, unstable_times
from .isolation import forkserver
from .isolation.commitment import value_digest
from .isolation.sandbox import Child, ChildFailed, EvaluationSlot, StandbySlots, child_guard
from .isolation.static_checks import check_solution_sources
from .progress import say
from .roles.errors import one_line
from .settings import EvalSettings
from .solutions import Solution, reference_solution
from .tasks import Task, TaskError, degenerate_reason
from .timing.baselines import BaselineCache, baseline_key
from .timing.call_split import summarize_split
from .timing.profile import summarize_times
from .verdict.bounds import precision, speed_of_light
from .verdict.fault import (CUDA_ERROR_MARKERS, Verdict, candidate_failure, output_meta, reading_candidate_reply,
                            reference_failure, rejection, reply)
from .verdict.record import finish, new_record
from .verdict.more_rounds import fresh_sets_left, less_precise_than, plan_round
from .verdict.schedule import CallRequests, call_schedule
from .verdict.verify import (compare_outputs, criterion_of, on_device, outputs_ignore_inputs, relative_error,
                             scale_problem, tolerances)

# The next evaluation's children, warming in the background (see sandbox.StandbySlots). Off
# unless a long-lived caller (a bridge worker, a benchmark of many tasks) turns it on: a
# one-shot evaluation would start children it never uses.
_STANDBY = StandbySlots()
_keep_warm = False
atexit.register(_STANDBY.close)


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
        record["children_warm_s"] = round(time.monotonic() - slot.started_at, 4)
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
            _release(slot)
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


def _release(slot: EvaluationSlot) -> None:
    """An unused slot back to the standby, a used one closed; the next one warming when kept warm."""
    if _keep_warm and not slot.used:
        _STANDBY.give_back(slot)
    else:
        slot.close()
    if _keep_warm:
        _STANDBY.refill(slot.env, slot.guard, slot.device_type)


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
    waiting = _check_sources(solution, settings)
    extension = _extension(solution, settings, artifact, slot.workdir, record)
    if waiting:  # it built: the names exist in torch's C++ API, and are torch compute
        _reject(waiting)
    extension, runtime = _extension_copy(extension, slot.extension_dir, settings)
    solution_dir = _read_only_copy(solution, task, slot.workdir / "solution")
    record["sandbox"] = {k: v for k, v in slot.guard.items() if k not in ("command_prefix", "jail_protections")}
    record["sandbox"]["reference_forked"] = slot.reference.forked  # from the fork server, torch imported
    record["sandbox"]["candidate_forked"] = slot.candidate.forked  # from its own server, jailed after the fork
    if slot.candidate.protections is not None:
        record["sandbox"]["jail"] = slot.candidate.protections
    begin = time.perf_counter()
    with _children(slot) as (reference, candidate):
        say("loading the reference and the candidate")
        with _step(record, "load"):
            loaded, seeds = _load(reference, candidate, task, solution, settings, extension, solution_dir, record,
                                  runtime)
        with _step(record, "check_sets"):
            checks = _check_sets(reference, task, seeds, settings, record)
        with _step(record, "prepare"):
            _prepare(candidate, loaded, settings)
        with _step(record, "timed_sets"):
            timed = _timed_sets(reference, checks["inputs"], settings, record)
        eager_before = None
        if settings.profile:  # bracketed with the eager time after the calls: a load that changed shows
            with _step(record, "eager_before"):
                eager_before = _eager_sample(reference, settings, baseline_protocol(settings))
        say("running the candidate's calls")
        with _step(record, "calls"):
            calls, caller = _run_calls(candidate, reference, checks["inputs"], timed, settings, record)
        with _step(record, "expected"):
            expected = _expected_outputs(reference, calls, checks["outputs"], timed.seeds, settings)
        with _step(record, "judge"):
            _judge_outputs(calls, expected, settings, record)
        if settings.timing_rounds_budget_s > 0 and timed.calls and not caller.requests.keep_sets:  # judged first:
            with _step(record, "more_rounds"):  # no rounds for a candidate that is already wrong
                _more_rounds(caller, reference, timed, len(expected.timed), settings, record)
        if _keep_warm:  # the timed calls are over: the next evaluation's children may start now
            _STANDBY.refill(slot.env, slot.guard, slot.device_type)
        with _step(record, "attribution"):
            trace = attribute_kernels(candidate, solution, extension, settings, record)
        record["wall_s"]["verify"] = round(time.perf_counter() - begin, 4)
        if settings.profile:
            _record_times(reference, task, calls, timed, expected, settings, record, begin, eager_before)
            withhold_unbelievable_times(calls, trace, settings, record)
    finish(record, "correct")


# --- before the children: static checks, the build, the solution's read-only copy -----------


def _check_sources(solution: Solution, settings: EvalSettings) -> list:
    """Reject a solution whose sources hold a forbidden form, before anything is built. Returns the
    findings that wait for the build: calls of names torch lacks, most likely typos the compiler names."""
    if solution.format == "reference" or not settings.static_checks:
        return []
    findings = check_solution_sources(solution.files)
    if any(f.reason != "unknown_torch_name" for f in findings):
        _reject(findings)
    return findings


def _reject(findings: list) -> None:
    """The rejection of static findings, each a diagnostic with its file and line."""
    diagnostics = [located(f.message) for f in findings]
    first = next((f for f in findings if f.reason != "unknown_torch_name"), findings[0])
    reason = "torch_compute_cpp" if first.reason == "unknown_torch_name" else first.reason
    raise rejection(reason, first.message, diagnostics)


def _extension(solution: Solution, settings: EvalSettings, artifact: bytes | None, workdir: Path,
               record: dict) -> Path | None:
    """The built extension (None: the solution builds none itself): the artifact a compile job
    made, or a build now. The build's facts go into the record; a failed build is the verdict."""
    if solution.format != "workspace":
        return None
    if artifact is not None:
        path = workdir / "cuda_extension.so"
        path.write_bytes(artifact)
        record["build"].update(seconds=0.0, cache_hit=True, key="artifact")
        return path
    say("building the extension (a first build takes longer)")
    built = build_workspace(solution.files, settings)
    record["build"].update(seconds=round(built.build_seconds, 4), cache_hit=built.cache_hit, key=built.key,
                           path=built.path or None, fast_fallback=built.fast_fallback)
    record["wall_s"]["build"] = round(built.build_seconds, 4)
    if built.status != "built":
        raise Verdict(built.status, built.diagnostics[0]["message"] if built.diagnostics else "build failed",
                      built.diagnostics)
    return Path(built.so_path)


def _extension_copy(extension: Path | None, folder: Path, settings: EvalSettings) -> tuple[Path | None, Path | None]:
    """The built extension (and, for a fast-built one, the binding runtime) copied into the
    folder the candidate sees read-only: the cache entry itself stays outside its view."""
    if extension is None:
        return None, None
    from .extension.fast.binding_runtime import RUNTIME_NAME, is_fast_extension, runtime_dir

    copy = folder / extension.name
    shutil.copyfile(extension, copy)
    copy.chmod(0o444)
    runtime = None
    if is_fast_extension(str(extension)):
        built = runtime_dir(settings.cache_path() / "fastbuild") / f"{RUNTIME_NAME}.so"
        if built.exists():
            runtime = folder / built.name
            shutil.copyfile(built, runtime)
            runtime.chmod(0o444)
    return copy, runtime


def _read_only_copy(solution: Solution, task: Task, folder: Path) -> Path:
    """The candidate's copy of its solution (and the task): files 0444, folders 0555. The
    candidate child's own logs live one level up, outside this folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for rel, data in solution.files.items():
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    (folder / "model.py").write_text(task.source)
    for path in sorted(folder.rglob("*"), reverse=True):
        path.chmod(0o555 if path.is_dir() else 0o444)
    folder.chmod(0o555)
    return folder


# --- the children load; the check sets; the timed sets ----------------------------------------


def _load(reference: Child, candidate: Child, task: Task, solution: Solution, settings: EvalSettings,
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
    _candidate_loaded(candidate, solution, settings)
    return loaded, seeds


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


def _candidate_loaded(candidate: Child, solution: Solution, settings: EvalSettings) -> None:
    """The candidate's load (a KernelBench file builds its own extension here: its timeout is
    a compile_error)."""
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


def _check_sets(reference: Child, task: Task, seeds: list[int], settings: EvalSettings, record: dict) -> dict:
    """The check sets' inputs and reference outputs (the first set run twice, so that a random
    task shows). A degenerate task is a task_error."""
    begin = time.perf_counter()
    sets = reply(reference, {"cmd": "reference", "seeds": seeds, "rerun": True}, settings.child_timeout_s,
                 harness=True)
    if not sets.get("ok"):
        raise reference_failure(sets)
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


def _prepare(candidate: Child, loaded: dict, settings: EvalSettings) -> None:
    """ModelNew built with the reference's constructor arguments and weights."""
    request = {"cmd": "prepare", "init_inputs": loaded["init_inputs"], "state_dict": loaded["state_dict"]}
    prepared = reply(candidate, request, settings.import_timeout_s, harness=False)
    if not prepared.get("ok"):
        raise candidate_failure(prepared)


@dataclasses.dataclass
class _TimedSets:
    seeds: list[int]  # one per distinct timed input set
    inputs: list
    calls: int  # warm-up and timed calls (0 without profiling)
    set_bytes: int  # bytes of one input set


def _timed_sets(reference: Child, check_inputs: list, settings: EvalSettings, record: dict) -> _TimedSets:
    """Input sets of the timed calls: fresh seeds per call while they fit the byte budget, else
    a rotating pool. Their reference outputs stay in the reference child until asked for."""
    calls = settings.warmup + settings.repeats if settings.profile else 0
    set_bytes = max(1, _nbytes(check_inputs[0]) if check_inputs else 1)
    distinct = min(calls, max(1, settings.fresh_input_bytes // set_bytes)) if calls else 0
    seeds = [secrets.randbits(31) for _ in range(distinct)]
    record["seeds"]["timed"] = seeds
    record["fresh_inputs_per_call"] = distinct == calls
    inputs = []
    if distinct:
        got = reply(reference, {"cmd": "inputs", "seeds": seeds}, settings.child_timeout_s, harness=True)
        if not got.get("ok"):
            raise reference_failure(got)
        inputs = got["inputs"]
    return _TimedSets(seeds, inputs, calls, set_bytes)


# --- the calls, and the verdict on their outputs ------------------------------------------------


@dataclasses.dataclass
class _Calls:
    schedule: list  # (kind, input set) per call, in order
    outputs: dict  # position -> (output, the candidate's description of its tensors), checked calls only
    times: list  # per-call device times (µs) after the warm-up
    walls: list  # per-call wall times (µs) after the warm-up
    outside: list = dataclasses.field(default_factory=list)  # per-call round trips (µs), the parent's clock
    splits: list = dataclasses.field(default_factory=list)  # per call: the candidate child's split (µs)
    round_trips: list = dataclasses.field(default_factory=list)  # per call, warm-up included (µs)
    timed_positions: list = dataclasses.field(default_factory=list)  # positions of the timed calls
    paired_eager: list = dataclasses.field(default_factory=list)  # host: an eager call's time (µs) per timed call


def _run_calls(candidate: Child, reference: Child, check_inputs: list, timed: _TimedSets, settings: EvalSettings,
               record: dict) -> tuple[_Calls, "_Caller"]:
    """Every call of one schedule (verdict/schedule.py), through the same path in the candidate child;
    with the caller that makes further rounds of them later (_more_rounds).

    Profiled on the host, each call after the warm-up is paired with one eager call in the reference
    child, just before it or just after it in turn: the two medians then come from the same seconds
    of a machine whose speed drifts by tens of percent from one second to the next."""
    schedule, sampled = call_schedule(settings.checks, timed.calls, len(timed.seeds), settings.timed_checks)
    requests = CallRequests(schedule, check_inputs, timed.inputs, settings.l2_flush_bytes, settings.launch_pad_cycles)
    calls = _Calls(list(schedule), {}, [], [])
    caller = _Caller(candidate, reference, requests, calls, settings, call_timeout(record.get("reference_call_s"), settings))
    answer: dict = {}
    for position, call in enumerate(schedule):
        answer = caller.call(position, call, checked=position in sampled)
    # CUDA: whether the driver demoted persisting L2 lines before every call (docs/cheats.md #19)
    on_cuda = settings.device_type() == "cuda"
    record["persisting_l2_reset"] = (answer.get("l2_resets") == len(schedule)) if on_cuda and schedule else None
    record["calls_split_us"] = summarize_split(calls.splits, calls.round_trips)
    return calls, caller


@dataclasses.dataclass
class _Caller:
    """One call of the candidate at a time, its answer and times added to `calls`."""

    candidate: Child
    reference: Child
    requests: CallRequests
    calls: _Calls
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


def _more_rounds(caller: _Caller, reference: Child, timed: _TimedSets, checked_in_schedule: int,
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
            if not loose or fresh_sets_left(len(timed.seeds), timed.set_bytes, settings.fresh_input_bytes) < settings.repeats:
                break
            _one_round(caller, reference, timed, checked, settings, record)
            rounds += 1
    finally:  # also when a round's outputs were wrong: the record says which round it was
        record["timing_rounds"] = {"extra_rounds": rounds, "extra_calls": len(calls.schedule) - calls_before,
                                   "seconds": round(time.perf_counter() - begin, 4),
                                   "still_imprecise": less_precise_than(
                                       {"candidate": calls.times, "eager": calls.paired_eager}, bound)}
        record["checked_calls"]["calls"] = len(calls.schedule)


def _one_round(caller: _Caller, reference: Child, timed: _TimedSets, checked: int, settings: EvalSettings,
               record: dict) -> None:
    """`repeats` timed calls on new input sets, then the verdict on a secret sample of their outputs."""
    calls = caller.calls
    seeds = [secrets.randbits(31) for _ in range(settings.repeats)]
    got = reply(reference, {"cmd": "inputs", "seeds": seeds}, settings.child_timeout_s, harness=True)
    if not got.get("ok"):
        raise reference_failure(got)
    round_calls, sampled = plan_round(settings.repeats, checked, len(timed.seeds))
    timed.seeds.extend(seeds)
    timed.inputs.extend(got["inputs"])  # the same list CallRequests sends from
    positions = []
    for offset, call in enumerate(round_calls):
        calls.schedule.append(call)
        positions.append(len(calls.schedule) - 1)
        caller.call(positions[-1], call, checked=offset in sampled)
    _judge_round(reference, calls, [positions[i] for i in sorted(sampled)], timed.seeds, settings, record)


def _judge_round(reference: Child, calls: _Calls, positions: list[int], timed_seeds: list[int],
                 settings: EvalSettings, record: dict) -> None:
    """The checked outputs of one further round against their reference outputs; freed once judged."""
    if not positions:
        return
    round_calls = dataclasses.replace(calls, outputs={k: calls.outputs.pop(k) for k in positions})
    expected = _expected_outputs(reference, round_calls, [], timed_seeds, settings)
    _judge_outputs(round_calls, expected, settings, record, judge=_judge_timed_outputs)
    record["checked_calls"]["timed"] += len(positions)


def _judge_timed_outputs(calls: "_Calls", expected: "_Expected", settings: EvalSettings, record: dict) -> None:
    _reject_wrong(calls, _compare(calls, expected, settings)[1], record)


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


@dataclasses.dataclass
class _Expected:
    at: dict  # position -> reference output
    checks: list  # positions of the check calls
    timed: list  # positions of the checked timed calls


def _expected_outputs(reference: Child, calls: _Calls, check_outputs: list, timed_seeds: list[int],
                      settings: EvalSettings) -> _Expected:
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
    return _Expected(at, checks, timed)


def judge_device(settings: EvalSettings) -> str:
    """Where the outputs are compared: the GPU of a CUDA evaluation when this process can use it
    (`judge_on_device`), else the CPU. Large outputs take seconds to compare on the CPU."""
    if not (settings.judge_on_device and settings.device_type() == "cuda"):
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _judge_outputs(calls: _Calls, expected: _Expected, settings: EvalSettings, record: dict, judge=None) -> None:
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


def _judge(calls: _Calls, expected: _Expected, settings: EvalSettings, record: dict) -> None:
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


def _reject_wrong(calls: _Calls, wrong: tuple | None, record: dict) -> None:
    """`incorrect` for the first wrong output _compare() found (position, problem), naming its call."""
    if wrong is None:
        return
    position, problem = wrong
    kind, index = calls.schedule[position]
    what = f"input set {index}" if kind == "check" else "output of a timed call"
    record["failed_criterion"] = criterion_of(problem)
    raise Verdict("incorrect", f"{what}: {problem}")


def _compare(calls: _Calls, expected: _Expected, settings: EvalSettings) -> tuple[float | None, tuple | None]:
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


# --- baselines and times -------------------------------------------------------------------------


def _record_times(reference: Child, task: Task, calls: _Calls, timed: _TimedSets, expected: _Expected,
                  settings: EvalSettings, record: dict, begin: float, eager_before: dict | None) -> None:
    """The baselines' times and the candidate's, the eager times before and after the calls, and the
    speed-of-light flag."""
    baselines, eager_after = _baselines(reference, task, settings, record)
    if eager_before is not None and eager_after is not None:
        record["eager_drift"] = eager_drift(eager_before, eager_after, settings.margin)
    record["times_us"]["eager"] = baselines.get("eager")
    if calls.paired_eager:  # the host: eager timed call by call beside the candidate's calls
        record["times_us"]["eager_baseline"] = baselines.get("eager")
        record["times_us"]["eager"] = {**summarize_times(calls.paired_eager), "paired": True}
    record["times_us"]["compile"] = baselines.get("compile")
    if baselines.get("compile_error"):
        record["compile_baseline_error"] = baselines["compile_error"]
    record["times_us"]["candidate"] = _valid_times(calls.times, calls.walls, pairs=settings.device_type() == "cuda")
    record["wall_s"]["profile"] = round(time.perf_counter() - begin - record["wall_s"]["verify"], 4)
    output_bytes = _nbytes(expected.at[expected.checks[0]]) if expected.checks else 0
    median = record["times_us"]["candidate"]["median_us"]
    record.update(speed_of_light(timed.set_bytes + output_bytes, median, settings.peak_bandwidth))


def _baselines(reference: Child, task: Task, settings: EvalSettings, record: dict) -> tuple[dict, dict | None]:
    """The eager and torch.compile times of the task: from the cache when a fresh eager sample taken
    now agrees with the cached eager time, else (or with settings.refresh_baselines) measured now in the
    reference child (the candidate's child is idle then). With them, the eager time taken now (that
    sample, or the measured one)."""
    protocol = baseline_protocol(settings)
    torch_version = record["versions"].get("torch") or ""
    key = baseline_key(task.source, record["device"] or "", torch_version, settings.compile_mode, protocol)
    cache = BaselineCache(settings.cache_path() / "baselines")
    baselines, eager_now = (None if settings.refresh_baselines else cache.get(key)), None
    if baselines is not None:
        eager_now = _eager_sample(reference, settings, protocol)
        check = baseline_recheck(baselines["eager"], eager_now, settings.margin)
        record["baseline_recheck"] = check
        if check["stale"]:
            say(f"the cached eager time ({check['cached_us']:.1f} us) disagrees with a fresh sample "
                f"({check['fresh_us']:.1f} us): measuring the baselines again")
            baselines = None
    record["baseline_cache_hit"] = baselines is not None
    if baselines is None:
        say("measuring the eager and torch.compile baselines " +
            ("anew (--refresh-baselines)" if settings.refresh_baselines else "(cached afterwards)"))
        begin = time.perf_counter()
        baselines = _measure_baselines(reference, settings, protocol)
        baselines.update(task=task.name, device=record["device"], torch=record["versions"].get("torch"),
                         compile_mode=settings.compile_mode)
        unstable = unstable_times({k: baselines.get(k) for k in ("eager", "compile")}, timing_se_bound(settings))
        if unstable:  # measured again next time, on a quieter machine perhaps
            record["baseline_not_cached"] = unstable
        else:
            cache.put(key, baselines)
        record["wall_s"]["baselines"] = round(time.perf_counter() - begin, 4)
        if baselines.get("compile_first_call_s") is not None:  # torch.compile's work, within the baselines
            record["wall_s"]["compile_first_call"] = round(baselines["compile_first_call_s"], 4)
        eager_now = baselines.get("eager")
    return baselines, eager_now


def _measure_baselines(reference: Child, settings: EvalSettings, protocol: dict) -> dict:
    if settings.time_baselines_per_request():  # one request per call, as the candidate's calls come
        measured = host_baselines(reference, settings, timing_se_bound(settings))
    else:
        request = {"cmd": "baselines", "compile_mode": settings.compile_mode,
                   "compile_threads": settings.compile_threads, **protocol,
                   "se_bound": timing_se_bound(settings), "budget_s": settings.baseline_budget_s}
        measured = reply(reference, request, settings.child_timeout_s, harness=True)
        if not measured.get("ok"):
            raise reference_failure(measured)
    return {k: measured.get(k) for k in ("eager", "compile", "compile_error", "compile_first_call_s")}


def _eager_sample(reference: Child, settings: EvalSettings, protocol: dict) -> dict:
    """One round of eager calls timed now, as the baselines are timed."""
    if settings.time_baselines_per_request():
        return host_eager_sample(reference, settings)
    request = {"cmd": "baselines", "eager_only": True, **protocol, "se_bound": None, "budget_s": 0.0}
    answer = reply(reference, request, settings.child_timeout_s, harness=True)
    if not answer.get("ok"):
        raise reference_failure(answer)
    return answer["eager"]


def _valid_times(times, walls=None, pairs: bool = False) -> dict:
    if not times or not all(isinstance(t, (int, float)) and t > 0 for t in times):
        raise Verdict("runtime_error", "the candidate process reported no valid timing")
    stats = summarize_times([float(t) for t in times], pairs=pairs)
    if walls and all(isinstance(w, (int, float)) for w in walls):
        stats["wall_median_us"] = summarize_times([float(w) for w in walls], pairs=pairs)["median_us"]
    return stats


def _nbytes(value) -> int:
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    return 0
