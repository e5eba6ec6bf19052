"""One evaluation: build, verify, profile and reward a candidate for a task.

This process decides the verdict and never imports candidate code. Two children do the work:
- the reference child (task code only): reference outputs from untouched inputs made from
  seeds chosen here per evaluation, and the eager/compile baselines on a cache miss;
- the candidate child: loads the extension and ModelNew, runs it on the inputs it is sent
  (never the seeds), with torch compute refused, then times it.
Outputs travel back over the structured channel and are compared here. A child that dies or
hangs while running candidate code is the candidate's fault (runtime_error); the reference
child or harness failing is infra_error.
"""

from __future__ import annotations

import atexit
import contextlib
import secrets
import time
from pathlib import Path

from .extension.diagnostics import parse_compiler_output
from .extension.build import build_workspace
from .extension.torch_build import build_env
from .isolation.sandbox import Child, ChildFailed, EvaluationSlot, StandbySlots, child_guard
from .isolation.static_checks import check_solution_sources
from .roles.errors import one_line
from .settings import EvalSettings
from .solutions import Solution, reference_solution
from .tasks import Task, TaskError, degenerate_reason
from .timing.baselines import BaselineCache, baseline_key
from .timing.profile import summarize_times
from .verdict.record import finish, new_record
from .verdict.verify import compare_outputs, criterion_of, outputs_ignore_inputs, precision_bound, relative_error, scale_problem, tolerances


class _Verdict(Exception):
    """Stops an evaluation with a final status."""

    def __init__(self, status: str, message: str, diagnostics: list | None = None, rejected: str | None = None):
        super().__init__(message)
        self.rejected = rejected
        self.status = status
        self.message = message
        self.diagnostics = diagnostics


def _reply(child: Child, message: dict, timeout: float, harness: bool, tensor_meta: list | None = None) -> dict:
    """Send a request; map a dead/hung child to runtime_error (candidate) or infra_error (harness)."""
    try:
        return child.request(message, timeout, tensor_meta)
    except ChildFailed as exc:
        status = "infra_error" if harness else "runtime_error"
        tail = exc.log_tail.strip().splitlines()[-3:]
        text = str(exc) + (": " + " | ".join(tail) if tail and not harness else "")
        raise _Verdict(status, text) from None


# Named rejections the candidate child reports (record["rejected"]).
_REJECTION_KINDS = ("no_kernel", "threads", "mutated_inputs")
_CUDA_ERROR_MARKERS = ("CUDA error", "cudaError", "illegal memory access", "CUBLAS_STATUS", "device-side assert")
_CANDIDATE_KINDS = {"forbidden": "incorrect", "state_dict": "incorrect", "incorrect": "incorrect", "runtime": "runtime_error", "task": "task_error", "internal": "infra_error"}


def _fail_from_candidate(reply: dict) -> None:
    kind = reply.get("kind")
    message = reply.get("message", "")
    if kind == "compile":
        raise _Verdict("compile_error", message, parse_compiler_output(reply.get("detail", "")))
    if kind == "syntax":
        file, line, msg = (reply.get("detail", "").split("\n", 2) + ["", "", ""])[:3]
        raise _Verdict("compile_error", message, [{"file": file, "line": int(line) if line.isdigit() else None, "message": msg}])
    if kind in _REJECTION_KINDS:
        raise _Verdict("incorrect", f"rejected: {kind}: {message}", rejected=kind)
    status = _CANDIDATE_KINDS.get(kind, "runtime_error")
    diagnostics = [{"file": None, "line": None, "message": message}]
    if reply.get("detail"):
        diagnostics.append({"file": None, "line": None, "message": reply["detail"]})
    raise _Verdict(status, message, diagnostics)


def _fail_from_reference(reply: dict) -> None:
    if reply.get("kind") == "task":
        raise _Verdict("task_error", reply.get("message", ""))
    raise _Verdict("infra_error", "reference process: " + reply.get("message", ""), [{"file": None, "line": None, "message": reply.get("detail", "")}])


def _write_solution(solution: Solution, task: Task, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for rel, data in solution.files.items():
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    (folder / "model.py").write_text(task.source)


def _make_read_only(folder: Path) -> None:
    """The candidate's copy of its solution (and the task) read-only: files 0444, folders 0555.
    The candidate child's own logs live one level up, outside this folder."""
    for path in sorted(folder.rglob("*"), reverse=True):
        path.chmod(0o555 if path.is_dir() else 0o444)
    folder.chmod(0o555)


# The next evaluation's children, warming in the background (see sandbox.StandbySlots). Off
# unless a long-lived caller (a bridge worker, a benchmark of many tasks) turns it on: a
# one-shot evaluation would start children it never uses.
_STANDBY = StandbySlots()
_keep_warm = False
atexit.register(_STANDBY.close)


def keep_children_warm(enabled: bool = True) -> None:
    """Keep the next evaluation's children started and warm (torch imported, CUDA context made)
    while this process is between evaluations or finishing one. For long-lived callers."""
    global _keep_warm
    _keep_warm = enabled
    if not enabled:
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
        slot = _STANDBY.take(build_env(settings), child_guard(settings), settings.device_type())
        record["children_warm_s"] = round(time.monotonic() - slot.started_at, 4)
        _evaluate(task, solution, settings, artifact, record, slot)
    except _Verdict as verdict:
        if verdict.status == "runtime_error" and any(m in verdict.message for m in _CUDA_ERROR_MARKERS):
            record["needs_recycle"] = True  # the candidate child is discarded; a worker sharing a GPU context should restart
        if verdict.rejected:
            record["rejected"] = verdict.rejected
        finish(record, verdict.status, verdict.message, verdict.diagnostics)
    except Exception as exc:  # a bug in the harness itself: never the candidate's fault
        finish(record, "infra_error", f"harness error: {one_line(exc)}")
    finally:
        if slot is not None:
            if _keep_warm and not slot.used:
                _STANDBY.give_back(slot)
            else:
                slot.close()
            if _keep_warm:
                _STANDBY.refill(slot.env, slot.guard, slot.device_type)
        record["wall_s"]["total"] = round(time.perf_counter() - begin, 4)
    return record


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
def _children(slot: EvaluationSlot):
    """The slot's (reference, candidate) children, marked used: they are never handed out again."""
    slot.used = True
    yield slot.reference, slot.candidate


def _evaluate(task: Task, solution: Solution, settings: EvalSettings, artifact: bytes | None, record: dict, slot: EvaluationSlot) -> None:
    workdir = slot.workdir
    findings = check_solution_sources(solution.files) if solution.format != "reference" and settings.static_checks else []
    if findings:
        diagnostics = [{"file": None, "line": None, "message": f.message} for f in findings]
        raise _Verdict("incorrect", f"rejected: {findings[0].reason}: {findings[0].message}", diagnostics, rejected=findings[0].reason)
    extension_path = None
    if solution.format == "workspace":
        if artifact is not None:
            extension_path = workdir / "cuda_extension.so"
            extension_path.write_bytes(artifact)
            record["build"].update(seconds=0.0, cache_hit=True, key="artifact")
        else:
            built = build_workspace(solution.files, settings)
            record["build"].update(seconds=round(built.build_seconds, 4), cache_hit=built.cache_hit, key=built.key)
            record["wall_s"]["build"] = round(built.build_seconds, 4)
            if built.status != "built":
                raise _Verdict(built.status, built.diagnostics[0]["message"] if built.diagnostics else "build failed", built.diagnostics)
            extension_path = Path(built.so_path)
    solution_dir = workdir / "solution"
    _write_solution(solution, task, solution_dir)
    _make_read_only(solution_dir)
    device = settings.device_type()
    record["sandbox"] = {k: v for k, v in slot.guard.items() if k != "command_prefix"}
    verify_begin = time.perf_counter()
    with _children(slot) as (reference, candidate):
        init_seed = secrets.randbits(31)
        seeds = [secrets.randbits(31) for _ in range(settings.checks)]
        record["seeds"] = {"init": init_seed, "inputs": seeds}
        reference.submit({"cmd": "load", "task_name": task.name, "task_source": task.source, "device": device, "init_seed": init_seed})
        candidate.submit({
            "cmd": "load", "format": solution.format, "entry": solution.entry, "solution_dir": str(solution_dir),
            "extension_path": str(extension_path) if extension_path else None, "task_name": task.name,
            "fast_cache_dir": str(settings.cache_path() / "fastbuild"),
            "task_source": task.source, "device": device, "block_torch": settings.block_torch and solution.format != "reference",
        })
        try:
            loaded = reference.result(settings.child_timeout_s)
        except ChildFailed as exc:
            raise _Verdict("infra_error", str(exc)) from None
        if not loaded.get("ok"):
            _fail_from_reference(loaded)
        record["device"] = loaded.get("device_name")
        record["versions"].update(torch=loaded.get("torch_version"), cuda=loaded.get("cuda_version"))
        try:
            cand_loaded = candidate.result(settings.compile_timeout_s + settings.child_timeout_s)
        except ChildFailed as exc:
            kind = "compile_error" if (exc.kind == "timeout" and solution.format == "kernelbench") else "runtime_error"
            raise _Verdict(kind, f"loading the candidate: {exc}") from None
        if not cand_loaded.get("ok"):
            _fail_from_candidate(cand_loaded)

        ref = _reply(reference, {"cmd": "reference", "seeds": seeds, "rerun": True}, settings.child_timeout_s, harness=True)
        if not ref.get("ok"):
            _fail_from_reference(ref)
        record["inputs_generated_on"] = ref.get("generated_on")
        degenerate = "random: two runs on the same inputs disagree" if ref.get("random") else degenerate_reason(ref["outputs"], None, settings.atol, settings.rtol)
        if degenerate:
            record["task_degenerate"] = degenerate
            raise _Verdict("task_error", f"task {task.name}: degenerate: {degenerate}")
        prepared = _reply(candidate, {"cmd": "prepare", "init_inputs": loaded["init_inputs"], "state_dict": loaded["state_dict"]}, settings.child_timeout_s, harness=False)
        if not prepared.get("ok"):
            _fail_from_candidate(prepared)

        # Timed input sets: fresh seeds per call while they fit the byte budget, else a rotating pool.
        n_timed = settings.warmup + settings.repeats if settings.profile else 0
        set_bytes = max(1, _nbytes(ref["inputs"][0]) if ref["inputs"] else 1)
        n_distinct = min(n_timed, max(1, settings.fresh_input_bytes // set_bytes)) if n_timed else 0
        timed_seeds = [secrets.randbits(31) for _ in range(n_distinct)]
        record["seeds"]["timed"] = timed_seeds
        record["fresh_inputs_per_call"] = n_distinct == n_timed
        timed_inputs = []
        if n_distinct:
            got = _reply(reference, {"cmd": "inputs", "seeds": timed_seeds}, settings.child_timeout_s, harness=True)
            if not got.get("ok"):
                _fail_from_reference(got)
            timed_inputs = got["inputs"]

        # One schedule of calls, all through the same path: check sets interleaved at random
        # positions among the timed ones; a secret sample of timed calls is checked as well.
        rng = secrets.SystemRandom()
        schedule = [("check", i) for i in range(len(seeds))] + [("timed", j % max(n_distinct, 1)) for j in range(n_timed)]
        rng.shuffle(schedule)
        timed_positions = [k for k, (kind, _) in enumerate(schedule) if kind == "timed"]
        sampled = set(rng.sample(timed_positions, min(settings.timed_checks, len(timed_positions))))
        # A set crosses the channel with its first call, never ahead (no future input is in
        # the candidate's process); one that later calls reuse (rotating timed sets) is kept
        # there under an opaque id and named, not sent again. When any set is reused, every set
        # is kept, check sets too, so that first calls all look alike.
        keep_sets = len(set(schedule)) < len(schedule)
        kept: dict = {}
        outputs: dict[int, tuple] = {}
        times, walls = [], []
        for position, (kind, index) in enumerate(schedule):
            message = {"cmd": "call", "poison": position % 2, "l2_flush_bytes": settings.l2_flush_bytes}
            if (kind, index) in kept:
                message["set"] = kept[(kind, index)]
            else:
                message["inputs"] = ref["inputs"][index] if kind == "check" else timed_inputs[index]
                if keep_sets:
                    kept[(kind, index)] = message["keep_as"] = secrets.token_hex(8)
            reply = _reply(candidate, message, settings.child_timeout_s, harness=False)
            if not reply.get("ok"):
                _fail_from_candidate(reply)
            if kind == "check" or position in sampled:
                # The candidate's description of its output (class, device) is taken before the
                # output is copied to the host; the wire's own metadata describes that copy.
                outputs[position] = (reply.get("output"), _output_meta(reply))
            if position >= settings.warmup:
                times.append(reply.get("time_us"))
                walls.append(reply.get("wall_us"))
        # CUDA: whether the driver demoted persisting L2 lines before every call (hacks.md #19)
        record["persisting_l2_reset"] = (reply.get("l2_resets") == len(schedule)) if device == "cuda" and schedule else None
        if _keep_warm:  # the timed calls are over: the next evaluation's children may start now
            _STANDBY.refill(slot.env, slot.guard, slot.device_type)

        check_positions = sorted(k for k in outputs if schedule[k][0] == "check")
        timed_checked = sorted(k for k in outputs if schedule[k][0] == "timed")
        expected_timed = []
        if timed_checked:
            more = _reply(reference, {"cmd": "outputs", "seeds": [timed_seeds[schedule[k][1]] for k in timed_checked]}, settings.child_timeout_s, harness=True)
            if not more.get("ok"):
                _fail_from_reference(more)
            expected_timed = more["outputs"]
        expected_at = {k: ref["outputs"][schedule[k][1]] for k in check_positions}
        expected_at.update(zip(timed_checked, expected_timed))
        worst_error = None
        if check_positions:
            record["tolerance"] = tolerances(expected_at[check_positions[0]], settings.atol, settings.rtol, settings.norm_rtol)
        for k in check_positions + timed_checked:
            actual, meta = outputs[k]
            problem = compare_outputs(expected_at[k], actual, meta, device, settings.atol, settings.rtol)
            err = relative_error(expected_at[k], actual) if not problem else None
            problem = problem or scale_problem(err, settings.norm_rtol)
            if problem:
                what = f"input set {schedule[k][1]}" if schedule[k][0] == "check" else "output of a timed call"
                record["failed_criterion"] = criterion_of(problem)
                raise _Verdict("incorrect", f"{what}: {problem}")
            worst_error = err if worst_error is None or (err is not None and err > worst_error) else worst_error
        if outputs_ignore_inputs([expected_at[k] for k in check_positions], [outputs[k][0] for k in check_positions]):
            record["failed_criterion"] = "constant_output"
            _reject("constant_output", "the output does not change when the inputs change")
        record["checked_calls"] = {"checks": len(check_positions), "timed": len(timed_checked), "calls": len(schedule)}
        _record_precision(record, expected_at[check_positions[0]] if check_positions else None, worst_error, settings)
        record["wall_s"]["verify"] = round(time.perf_counter() - verify_begin, 4)
        if not settings.profile:
            finish(record, "correct")
            return

        protocol = {"warmup": settings.warmup, "repeats": settings.repeats, "l2_flush_bytes": settings.l2_flush_bytes, "backend": settings.backend}
        key = baseline_key(task.source, record["device"] or "", record["versions"].get("torch") or "", settings.compile_mode, protocol)
        cache = BaselineCache(settings.cache_path() / "baselines")
        baselines = cache.get(key)
        record["baseline_cache_hit"] = baselines is not None
        if baselines is None:
            profile_begin = time.perf_counter()
            measured = _reply(reference, {"cmd": "baselines", "compile_mode": settings.compile_mode, **protocol}, settings.child_timeout_s, harness=True)
            if not measured.get("ok"):
                _fail_from_reference(measured)
            baselines = {k: measured.get(k) for k in ("eager", "compile", "compile_error", "compile_first_call_s")}
            baselines.update(task=task.name, device=record["device"], torch=record["versions"].get("torch"), compile_mode=settings.compile_mode)
            cache.put(key, baselines)
            record["wall_s"]["baselines"] = round(time.perf_counter() - profile_begin, 4)
        record["times_us"]["eager"] = baselines.get("eager")
        record["times_us"]["compile"] = baselines.get("compile")
        if baselines.get("compile_error"):
            record["compile_baseline_error"] = baselines["compile_error"]
        record["times_us"]["candidate"] = _valid_times(times, walls)
        record["wall_s"]["profile"] = round(time.perf_counter() - verify_begin - record["wall_s"]["verify"], 4)
        _record_speed_of_light(record, set_bytes + _nbytes(expected_at[check_positions[0]]) if check_positions else set_bytes, settings)
    finish(record, "correct")


def _output_meta(reply: dict) -> list:
    """The candidate child's per-tensor description of its output (a list of dicts)."""
    meta = reply.get("output_meta")
    if not isinstance(meta, list) or not all(isinstance(m, dict) for m in meta):
        raise _Verdict("runtime_error", "the candidate process sent its output without a description of its tensors")
    return meta


def _reject(reason: str, message: str) -> None:
    """A named rejection: status incorrect, record["rejected"] = reason."""
    raise _Verdict("incorrect", f"rejected: {reason}: {message}", rejected=reason)


def _nbytes(value) -> int:
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    return 0


def _record_precision(record: dict, expected, worst_error: float | None, settings: EvalSettings) -> None:
    """Flag (or reject) an output whose error looks like a lower-precision computation (hacks.md #15)."""
    bound = precision_bound(expected) if expected is not None else None
    suspected = bool(bound is not None and worst_error is not None and worst_error > bound)
    record["precision"] = {"relative_error": worst_error, "bound": bound, "downgrade_suspected": suspected}
    if suspected and settings.reject_precision_downgrade:
        _reject("precision_downgrade", f"relative error {worst_error:.3g} exceeds the {bound:g} an honest kernel of this dtype reaches")


def _record_speed_of_light(record: dict, bytes_moved: int, settings: EvalSettings) -> None:
    """Flag a time below the bytes-over-bandwidth bound (hacks.md #18): inputs read and outputs written once."""
    bound_us = bytes_moved / settings.peak_bandwidth * 1e6
    median = record["times_us"]["candidate"]["median_us"]
    record["sol_bound_us"] = bound_us
    record["sol_violation"] = bool(median < bound_us)


def _valid_times(times, walls=None) -> dict:
    if not times or not all(isinstance(t, (int, float)) and t > 0 for t in times):
        raise _Verdict("runtime_error", "the candidate process reported no valid timing")
    stats = summarize_times([float(t) for t in times])
    if walls and all(isinstance(w, (int, float)) for w in walls):
        stats["wall_median_us"] = summarize_times([float(w) for w in walls])["median_us"]
    return stats
