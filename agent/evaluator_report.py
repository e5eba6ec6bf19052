"""Reading the evaluator's result record from the agent's side.

The record's shape and accessors are in the contract module (`cuda_agent.contracts`); this
module turns a record into the text the policy reads.
"""

from __future__ import annotations

import hashlib

from cuda_agent.contracts import UNSCORED, Status, record_reward, record_speedup, record_time_us

CORRECT = Status.CORRECT.value


def files_digest(files: dict[str, bytes]) -> str:
    """A content hash of a solution's files (paths and bytes)."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.encode() + b"\x00" + len(files[path]).to_bytes(8, "little") + files[path])
    return digest.hexdigest()


def is_correct(record: dict) -> bool:
    return record.get("status") == CORRECT


def is_infra_error(record: dict) -> bool:
    """An infrastructure or task failure (the harness, not the candidate, failed)."""
    return record.get("status") in UNSCORED  # Status is a str enum: the plain strings match


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
            t = record_time_us(record, which)
            if t is not None:
                lines.append(f"  time {which}: {t:.1f} us")
        for baseline in ("eager", "compile"):
            s = record_speedup(record, baseline)
            if s is not None:
                lines.append(f"  speed-up vs {baseline}: {s:.3f}x")
    reward = record_reward(record)
    if reward is not None:
        lines.append(f"  reward: {reward:g}")
    if is_infra_error(record):
        lines.append("  (an evaluator infrastructure error, not a verdict on the kernel; try again)")
    return "\n".join(lines)
