"""The result record of one evaluation: one JSON-serialisable dict.

Its statuses, which of them are scored, and the reward rule are the contract module's
(cuda_agent/contracts.py, docs/evaluation.md). Infrastructure and task failures are never
scored -1: they say nothing about the candidate (reward None).
"""

from __future__ import annotations

import platform

from cuda_agent.contracts import Status, is_scored, milestone_reward

RECORD_VERSION = 1
_STATUSES = frozenset(Status)  # a str enum: the plain status strings are members


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
        "baseline_recheck": None,
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
    if status not in _STATUSES:
        raise ValueError(f"unknown status {status!r}")
    record["status"] = status
    record["message"] = message
    if diagnostics:
        record["diagnostics"] = list(diagnostics)
    elif message and status != "correct" and not record["diagnostics"]:
        record["diagnostics"] = [{"file": None, "line": None, "message": message}]
    if not is_scored(status):
        record["reward"] = None
        return record
    times = record["times_us"]
    median = lambda key: times[key]["median_us"] if times.get(key) else None  # noqa: E731
    t, t_eager, t_compile = median("candidate"), median("eager"), median("compile")
    for name, base in (("eager", t_eager), ("compile", t_compile)):
        record["speedup"][name] = (base / t) if (status == "correct" and t and base) else None
    record["reward"] = milestone_reward(status == "correct", t, t_eager, t_compile, record["margin"])
    if record.get("speedup_withheld") and record["reward"] is not None:
        record["reward"] = min(record["reward"], 1)  # times it cannot trust earn no speed-up reward
    if record.get("reward_cap") and record["reward"] is not None:
        record["reward"] = min(record["reward"], record["reward_cap"])  # what the noise cannot have made
    return record
