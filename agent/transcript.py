"""A readable transcript of an episode, and the final solution written next to it."""

from __future__ import annotations

import json
from pathlib import Path

from agent.episode import EpisodeResult
from agent.sandbox import sandbox_report


def transcript_text(result: EpisodeResult) -> str:
    """Markdown: a summary, then every message in order."""
    speedup = result.best_speedup_vs_compile
    lines = [
        f"# Episode: {result.task}",
        "",
        f"- reward: {result.reward}",
        f"- final status: {result.final_status}",
        f"- best speed-up vs torch.compile: {'n/a' if speedup is None else f'{speedup:.3f}x'}",
        f"- turns: {result.turns} (ended: {result.end_reason})",
        f"- tool calls: {result.tool_calls} {json.dumps(result.tool_counts, sort_keys=True)}; failures {result.tool_failures}; schema violations {result.schema_violations}",
        f"- redundant loop: {result.redundant_loop}",
        f"- tokens: {len(result.trajectory)} ({result.trajectory.agent_tokens} agent)",
        f"- wall {result.wall_seconds:.1f} s: policy {result.policy_seconds:.1f} s, tools {result.tool_seconds:.1f} s, evaluator {result.evaluator_seconds:.1f} s",
        f"- workspace: {result.workspace}",
        f"- command sandbox: {json.dumps(sandbox_report())}",
    ]
    if result.error:
        lines.append(f"- error: {result.error}")
    for index, message in enumerate(result.trajectory.messages):
        lines += ["", f"## [{index}] {message['role']}", "", "```", message["content"], "```"]
    return "\n".join(lines) + "\n"


def write_episode_outputs(result: EpisodeResult, directory: str | Path) -> Path:
    """transcript.md, result.json and solution/ (the final solution's files) in `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "transcript.md").write_text(transcript_text(result))
    summary = {
        "task": result.task,
        "reward": result.reward,
        "final_status": result.final_status,
        "best_speedup_vs_compile": result.best_speedup_vs_compile,
        "best_speedup_vs_eager": result.best_speedup_vs_eager,
        "turns": result.turns,
        "end_reason": result.end_reason,
        "tool_calls": result.tool_calls,
        "tool_counts": result.tool_counts,
        "schema_violations": result.schema_violations,
        "redundant_loop": result.redundant_loop,
        "wall_seconds": result.wall_seconds,
        "policy_seconds": result.policy_seconds,
        "tool_seconds": result.tool_seconds,
        "evaluator_seconds": result.evaluator_seconds,
        "timings": result.timings,
        "final_record": _jsonable(result.final_record),
        "error": result.error,
    }
    (directory / "result.json").write_text(json.dumps(summary, indent=2, default=str))
    solution = directory / "solution"
    for relpath, data in result.final_solution.items():
        target = solution / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return directory


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items() if not isinstance(v, (bytes, bytearray))}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value
