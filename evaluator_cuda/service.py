"""The evaluator as a service: plain, msgpack-able dicts in and out.

job = {"task": {"name": str, "source": str},
       "solution": {"format": "workspace" | "kernelbench" | "reference", "files": {relpath: bytes}, "entry"?: str},
       "settings": {key: value for key in cuda_agent.contracts.JOB_SETTINGS},
       "artifact"?: bytes}                      # evaluate_job only: a prebuilt extension
compile_job -> {"status": "built" | "compile_error" | "infra_error", "diagnostics": [...],
                "artifact": bytes | None, "build_seconds": float, "cache_hit": bool}
evaluate_job -> the result record (verdict/record.py)
A malformed job gives an infra_error result whose message says what is wrong with it, and so
does a job that sets anything outside JOB_SETTINGS: caches, sandbox limits, tolerances, the
static checks and the torch guard are the worker's (`worker`: its own EvalSettings fields, by
default from $CUDA_AGENT_WORKER_SETTINGS, a JSON mapping), so a job cannot weaken its grading.
"""

from __future__ import annotations

import json
import os

from cuda_agent.contracts import JobError, check_job_settings

from .roles.errors import one_line
from .settings import EvalSettings
from .solutions import SolutionError, solution_from_job
from .tasks import Task, TaskError, check_task_source
from .verdict.record import finish, new_record


WORKER_SETTINGS_ENV = "CUDA_AGENT_WORKER_SETTINGS"


def worker_settings() -> dict:
    """The worker's own settings from $CUDA_AGENT_WORKER_SETTINGS (a JSON mapping; empty if unset)."""
    text = os.environ.get(WORKER_SETTINGS_ENV, "").strip()
    if not text:
        return {}
    values = json.loads(text)
    if not isinstance(values, dict):
        raise ValueError(f"${WORKER_SETTINGS_ENV} must be a JSON mapping of evaluation settings")
    return values


def job_settings(chosen: dict | None, worker: dict | None = None) -> EvalSettings:
    """The settings of one job: the worker's own, then the few a job may choose (JOB_SETTINGS)."""
    chosen = check_job_settings(chosen)
    try:
        worker = dict(worker if worker is not None else worker_settings())
    except ValueError as exc:
        raise JobError(f"the worker's settings: {exc}") from None
    try:
        return EvalSettings.from_dict({**worker, **chosen})
    except (TypeError, ValueError) as exc:
        raise JobError(f"job.settings: {exc}") from None


def _parse_job(job: dict, worker: dict | None = None):
    if not isinstance(job, dict):
        raise JobError("a job is a mapping")
    task_part = job.get("task")
    if not isinstance(task_part, dict) or not isinstance(task_part.get("source"), str):
        raise JobError("job.task needs a string `source`")
    name = str(task_part.get("name") or "task")
    if job.get("settings") is not None and not isinstance(job.get("settings"), dict):
        raise JobError("job.settings is a mapping")
    settings = job_settings(job.get("settings"), worker)
    try:
        solution = solution_from_job(job.get("solution") or {}, stem=name.rsplit("/", 1)[-1])
    except SolutionError as exc:
        raise JobError(f"job.solution: {exc}") from None
    return Task(name=name, source=task_part["source"], origin="job"), solution, settings


def compile_job(job: dict, worker: dict | None = None) -> dict:
    """Build a job's solution (workspace format) and return the built extension's bytes."""
    from .extension.build import build_workspace

    try:
        task, solution, settings = _parse_job(job, worker)
    except JobError as exc:
        return {"status": "infra_error", "diagnostics": [{"file": None, "line": None, "message": f"bad job: {exc}"}],
                "artifact": None, "build_seconds": 0.0, "cache_hit": False}
    if solution.format != "workspace":
        # KernelBench files build themselves at import (load_inline); evaluate_job compiles them.
        return {"status": "built", "diagnostics": [], "artifact": None, "build_seconds": 0.0, "cache_hit": False}
    try:
        result = build_workspace(solution.files, settings)
    except Exception as exc:
        diagnostics = [{"file": None, "line": None, "message": f"harness error: {one_line(exc)}"}]
        return {"status": "infra_error", "diagnostics": diagnostics, "artifact": None, "build_seconds": 0.0,
                "cache_hit": False}
    artifact = None
    if result.status == "built":
        with open(result.so_path, "rb") as handle:
            artifact = handle.read()
    return {"status": result.status, "diagnostics": result.diagnostics, "artifact": artifact,
            "build_seconds": result.build_seconds, "cache_hit": result.cache_hit}


def evaluate_job(job: dict, worker: dict | None = None) -> dict:
    """Evaluate a job (building it unless `artifact` is given); returns the result record."""
    from .evaluation import evaluate

    try:
        task, solution, settings = _parse_job(job, worker)
    except JobError as exc:
        record = new_record(str((job.get("task") or {}).get("name", "?")) if isinstance(job, dict) else "?", "?", "?",
                            EvalSettings())
        return finish(record, "infra_error", f"bad job: {exc}")
    try:
        check_task_source(task.name, task.source)
    except TaskError as exc:
        return finish(new_record(task.name, solution.label, solution.format, settings), "task_error", str(exc))
    artifact = job.get("artifact")
    return evaluate(task, solution, settings, artifact=bytes(artifact) if artifact is not None else None)
