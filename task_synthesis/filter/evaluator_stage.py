"""The evaluator's stage of the filter: the task's own reference self-check, in isolated children.

Through the evaluator's public API only: `evaluate(task, reference_solution(stem), settings)` is
what `cuda-agent bench` runs for a task without solutions. The reference child builds the task
from secret seeds and rejects a random or input-independent task (`task_error` with
`task_degenerate`); the candidate child (here the task's own Model, jailed) must come out
`correct`; with profiling on, the reference child also times the eager and `torch.compile`
baselines, and a compile that fails is a rejection. What the API does not report (a peak memory
of the children) the in-process stage estimates instead. A record that names a (CUDA)
out-of-memory error anywhere is stage `gpu_memory`, whatever its status: the run's workers and
their children share the GPU, so the run tries the candidate again later.
"""

from __future__ import annotations


def evaluator_settings(backend: str, compile_baseline: bool, cache_dir: str | None = None,
                       lighter: dict | None = None) -> dict:
    """The evaluator's settings of the self-check; `lighter`: the run's lighter timing (config.evaluation)."""
    from evaluator_cuda.settings import EvalSettings

    overrides = {**(lighter or {}), "profile": compile_baseline}
    if cache_dir:
        overrides["cache_dir"] = cache_dir
    return EvalSettings.for_backend(backend, **overrides).to_dict()


def _check_gpu_memory(record: dict) -> None:
    """Rejected at `gpu_memory` when the record's message, compile error or degenerate reason is out of memory."""
    from .execution import Rejected
    from .gpu_memory import out_of_memory

    for field in ("message", "compile_baseline_error", "task_degenerate"):
        text = str(record.get(field) or "")
        if out_of_memory(text):
            raise Rejected("gpu_memory", f"the evaluator's {record.get('status')} ({field}): {text[:200]}")


def check_with_evaluator(name: str, source: str, settings: dict) -> dict:
    """The evaluator's verdict on the task's reference; returns its times, raises Rejected."""
    from evaluator_cuda.evaluation import evaluate
    from evaluator_cuda.settings import EvalSettings
    from evaluator_cuda.solutions import reference_solution
    from evaluator_cuda.tasks import Task

    from .execution import Rejected

    task = Task(name=name, source=source, origin="task_synthesis")
    record = evaluate(task, reference_solution(task.stem), EvalSettings.from_dict(settings))
    _check_gpu_memory(record)
    if record.get("task_degenerate"):
        raise Rejected("evaluator", f"degenerate: {record['task_degenerate']}")
    if record["status"] != "correct":
        raise Rejected("evaluator", f"{record['status']}: {(record.get('message') or '')[:200]}")
    if record.get("compile_baseline_error"):
        raise Rejected("compile", record["compile_baseline_error"][:200])
    times = record.get("times_us") or {}
    eager, compiled = times.get("eager") or {}, times.get("compile") or {}
    if settings.get("profile") and not compiled:
        raise Rejected("compile", "no torch.compile time was measured")
    wall = record.get("wall_s") or {}
    return {"evaluator_eager_us": eager.get("median_us"), "evaluator_compile_us": compiled.get("median_us"),
            "evaluator_wall_s": wall.get("total"), "evaluator_verify_s": wall.get("verify"),
            "evaluator_profile_s": wall.get("profile"), "evaluator_baselines_s": wall.get("baselines")}
