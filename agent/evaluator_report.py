"""Reading the evaluator's result record (evaluator_cuda.service) from the agent's side.

The record is a JSON-able dict; these accessors are the one place that knows its field
names, and `format_report` turns it into the text the policy reads.
"""

from __future__ import annotations

import hashlib
from typing import Any

CORRECT = "correct"
# Statuses that say nothing about the candidate: no reward, never -1.
UNSCORED = ("infra_error", "task_error")


def files_digest(files: dict[str, bytes]) -> str:
    """A content hash of a solution's files (paths and bytes)."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.encode() + b"\x00" + len(files[path]).to_bytes(8, "little") + files[path])
    return digest.hexdigest()


def evaluation_job(task_name: str, task_source: str, files: dict[str, bytes], settings: dict[str, Any], artifact: bytes | None = None) -> dict:
    """The job dict of the evaluator service API (compile_job / evaluate_job)."""
    job = {
        "task": {"name": task_name, "source": task_source},
        "solution": {"format": "workspace", "files": dict(files)},
        "settings": dict(settings),
    }
    if artifact is not None:
        job["artifact"] = artifact
    return job


def is_correct(record: dict) -> bool:
    return record.get("status") == CORRECT


def is_infra_error(record: dict) -> bool:
    """An infrastructure or task failure (the harness, not the candidate, failed)."""
    return record.get("status") in UNSCORED


def _number(value: Any) -> float | None:
    if isinstance(value, dict):
        value = value.get("median_us", value.get("median"))
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def speedup_vs(record: dict, baseline: str) -> float | None:
    """Speed-up of the candidate over a baseline ('eager' or 'compile'), None if not timed."""
    speedups = record.get("speedup")
    if isinstance(speedups, dict) and _number(speedups.get(baseline)) is not None:
        return _number(speedups.get(baseline))
    direct = _number(record.get(f"speedup_vs_{baseline}"))
    if direct is not None:
        return direct
    candidate, base = time_us(record, "candidate"), time_us(record, baseline)
    if candidate and base:
        return base / candidate
    return None


def time_us(record: dict, which: str) -> float | None:
    """Median time in µs of 'candidate', 'eager' or 'compile', None if not timed."""
    times = record.get("times_us") or {}
    if isinstance(times, dict):
        return _number(times.get(which))
    return None


def record_reward(record: dict) -> float | None:
    """The milestone reward in the record; None for infrastructure errors."""
    if is_infra_error(record):
        return None
    reward = record.get("reward")
    return float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None


def _diagnostics_text(record: dict, limit: int = 40) -> list[str]:
    lines = [f"  {record['message']}"] if record.get("message") and not record.get("diagnostics") else []
    for item in (record.get("diagnostics") or [])[:limit]:
        if isinstance(item, dict):
            where = item.get("file") or ""
            if item.get("line"):
                where += f":{item['line']}"
            lines.append(f"  {where + ': ' if where else ''}{item.get('message', '')}")
        else:
            lines.append(f"  {item}")
    return lines


def format_compile_report(record: dict) -> str:
    status = record.get("status", "unknown")
    seconds = record.get("build_seconds")
    head = f"compile: {status}"
    if isinstance(seconds, (int, float)):
        head += f" in {seconds:.1f} s" + (" (cache hit)" if record.get("cache_hit") else "")
    return "\n".join([head, *_diagnostics_text(record)])


def format_evaluation_report(record: dict, profiled: bool) -> str:
    """What the policy reads after verify/profile: verdict, diagnostics, times and reward."""
    status = record.get("status", "unknown")
    lines = [f"{'profile' if profiled else 'verify'}: {status}"]
    lines += _diagnostics_text(record)
    if profiled and is_correct(record):
        for which in ("candidate", "eager", "compile"):
            t = time_us(record, which)
            if t is not None:
                lines.append(f"  time {which}: {t:.1f} us")
        for baseline in ("eager", "compile"):
            s = speedup_vs(record, baseline)
            if s is not None:
                lines.append(f"  speed-up vs {baseline}: {s:.3f}x")
    reward = record_reward(record)
    if reward is not None:
        lines.append(f"  reward: {reward:g}")
    if is_infra_error(record):
        lines.append("  (an evaluator infrastructure error, not a verdict on the kernel; try again)")
    return "\n".join(lines)
