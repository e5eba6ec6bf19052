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

import secrets
import shutil
import tempfile
import time
from pathlib import Path

from .baselines import BaselineCache, baseline_key
from .build import build_env, build_workspace
from .child import one_line
from .diagnostics import parse_compiler_output
from .record import finish, new_record
from .sandbox import Child, ChildFailed
from .settings import EvalSettings
from .solutions import Solution
from .tasks import Task
from .verify import compare_outputs


class _Verdict(Exception):
    """Stops an evaluation with a final status."""

    def __init__(self, status: str, message: str, diagnostics: list | None = None):
        super().__init__(message)
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


_CANDIDATE_KINDS = {"forbidden": "incorrect", "state_dict": "incorrect", "incorrect": "incorrect", "runtime": "runtime_error", "task": "task_error", "internal": "infra_error"}


def _fail_from_candidate(reply: dict) -> None:
    kind = reply.get("kind")
    message = reply.get("message", "")
    if kind == "compile":
        raise _Verdict("compile_error", message, parse_compiler_output(reply.get("detail", "")))
    if kind == "syntax":
        file, line, msg = (reply.get("detail", "").split("\n", 2) + ["", "", ""])[:3]
        raise _Verdict("compile_error", message, [{"file": file, "line": int(line) if line.isdigit() else None, "message": msg}])
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
    folder.mkdir(parents=True)
    for rel, data in solution.files.items():
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    (folder / "model.py").write_text(task.source)


def evaluate(task: Task, solution: Solution, settings: EvalSettings, artifact: bytes | None = None) -> dict:
    """Evaluate `solution` for `task`; returns the result record (never raises for a bad candidate)."""
    record = new_record(task.name, solution.label or task.stem, solution.format, settings)
    if solution.format == "reference":
        record["torch_blocked"] = False
    begin = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="cuda-agent-eval-"))
    try:
        _evaluate(task, solution, settings, artifact, record, workdir)
    except _Verdict as verdict:
        finish(record, verdict.status, verdict.message, verdict.diagnostics)
    except Exception as exc:  # a bug in the harness itself: never the candidate's fault
        finish(record, "infra_error", f"harness error: {one_line(exc)}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        record["wall_s"]["total"] = round(time.perf_counter() - begin, 4)
    return record


def _evaluate(task: Task, solution: Solution, settings: EvalSettings, artifact: bytes | None, record: dict, workdir: Path) -> None:
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
    device = settings.device_type()
    env = build_env(settings)
    verify_begin = time.perf_counter()
    with Child("reference", workdir, env=env) as reference, Child("candidate", solution_dir, env=env, log_name="../candidate.log") as candidate:
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

        ref = _reply(reference, {"cmd": "reference", "seeds": seeds}, settings.child_timeout_s, harness=True)
        if not ref.get("ok"):
            _fail_from_reference(ref)
        meta: list = []
        checked = _reply(candidate, {"cmd": "check", "init_inputs": loaded["init_inputs"], "state_dict": loaded["state_dict"], "inputs": ref["inputs"]}, settings.child_timeout_s, harness=False, tensor_meta=meta)
        if not checked.get("ok"):
            _fail_from_candidate(checked)
        outputs = checked.get("outputs")
        if not isinstance(outputs, list) or len(outputs) != len(seeds):
            raise _Verdict("incorrect", "the candidate process returned the wrong number of outputs")
        meta_per_set = _split_meta(meta, outputs)
        for index, (expected, actual) in enumerate(zip(ref["outputs"], outputs)):
            problem = compare_outputs(expected, actual, meta_per_set[index], device, settings.atol, settings.rtol)
            if problem:
                raise _Verdict("incorrect", f"input set {index}: {problem}")
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

        profile_begin = time.perf_counter()
        meta = []
        profiled = _reply(candidate, {"cmd": "profile", **protocol}, settings.child_timeout_s, harness=False, tensor_meta=meta)
        if not profiled.get("ok"):
            _fail_from_candidate(profiled)
        problem = compare_outputs(ref["outputs"][0], profiled.get("output"), meta, device, settings.atol, settings.rtol)
        if problem:
            raise _Verdict("incorrect", f"output of a timed call: {problem}")
        record["times_us"]["candidate"] = _valid_times(profiled.get("times"))
        record["wall_s"]["profile"] = round(time.perf_counter() - profile_begin, 4)
    finish(record, "correct")


def _valid_times(times) -> dict:
    if not isinstance(times, dict) or not isinstance(times.get("median_us"), (int, float)) or not times["median_us"] > 0:
        raise _Verdict("runtime_error", "the candidate process reported no valid timing")
    return times


def _split_meta(meta: list, outputs: list) -> list[list]:
    """Cut the flat tensor-metadata list into one list per input set (tensors in DFS order)."""
    import torch

    def count(value) -> int:
        if isinstance(value, torch.Tensor):
            return 1
        if isinstance(value, (list, tuple)):
            return sum(count(v) for v in value)
        if isinstance(value, dict):
            return sum(count(v) for v in value.values())
        return 0

    out, pos = [], 0
    for value in outputs:
        n = count(value)
        out.append(meta[pos:pos + n])
        pos += n
    return out
