"""The result record of one evaluation: one JSON-serialisable dict.

status:
  compile_error  the candidate does not build (diagnostics: file, line, message)   reward -1
  runtime_error  it builds but raises, crashes or hangs while running               reward -1
  incorrect      it runs but an output differs, or it used forbidden torch compute  reward -1
  correct        all checks pass                                                  reward 1..3
  infra_error    the harness failed (a reference/harness process died or hung)    reward None
  task_error     the task itself is unusable (get_inputs raising, ...)            reward None
Infrastructure and task failures are never scored -1: they say nothing about the candidate.
"""

from __future__ import annotations

import platform

from .reward import milestone_reward

RECORD_VERSION = 1
STATUSES = ("compile_error", "runtime_error", "incorrect", "correct", "infra_error", "task_error")
SCORED = ("compile_error", "runtime_error", "incorrect", "correct")


def _project_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("cuda-agent")
    except Exception:
        return None


def new_record(task_name: str, candidate: str, solution_format: str, settings) -> dict:
    return {
        "record_version": RECORD_VERSION,
        "task": task_name,
        "candidate": candidate,
        "format": solution_format,
        "backend": settings.backend,
        "status": None,
        "message": "",
        "diagnostics": [],
        "reward": None,
        "times_us": {"candidate": None, "eager": None, "compile": None},
        "speedup": {"eager": None, "compile": None},
        "baseline_cache_hit": None,
        "build": {"seconds": None, "cache_hit": None, "key": None},
        "wall_s": {},
        "seeds": {"init": None, "inputs": []},
        "checks": settings.checks,
        "tolerance": {"atol": settings.atol, "rtol": settings.rtol},
        "margin": settings.margin,
        "torch_blocked": settings.block_torch,
        "versions": {"python": platform.python_version(), "cuda_agent": _project_version()},
        "device": None,
    }


def finish(record: dict, status: str, message: str = "", diagnostics: list | None = None) -> dict:
    """Set the status and the reward that follows from it (and from the times, when correct)."""
    if status not in STATUSES:
        raise ValueError(f"unknown status {status!r}")
    record["status"] = status
    record["message"] = message
    if diagnostics:
        record["diagnostics"] = list(diagnostics)
    elif message and status != "correct" and not record["diagnostics"]:
        record["diagnostics"] = [{"file": None, "line": None, "message": message}]
    if status not in SCORED:
        record["reward"] = None
        return record
    times = record["times_us"]
    median = lambda key: times[key]["median_us"] if times.get(key) else None  # noqa: E731
    t, t_eager, t_compile = median("candidate"), median("eager"), median("compile")
    for name, base in (("eager", t_eager), ("compile", t_compile)):
        record["speedup"][name] = (base / t) if (status == "correct" and t and base) else None
    record["reward"] = milestone_reward(status == "correct", t, t_eager, t_compile, record["margin"])
    return record
