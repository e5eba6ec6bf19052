"""Trajectories on disk: one parquet row per episode, ready for RFT's filters and PPO.

Columns: tokens list<int32>, loss_mask list<int8> (1 = agent token), rollout_logprobs
list<float32> (0 where mask is 0), reward float64 (NaN: infrastructure failure, no reward),
turns, tool_calls, schema_violations int32, redundant_loop bool, task, final_status,
end_reason string, best_speedup_vs_compile / best_speedup_vs_eager float64 (NaN: none),
tool_counts (JSON), messages (JSON), wall_seconds, evaluator_seconds float64.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

from agent.episode import EpisodeResult


def _schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("tokens", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.int8())),
            ("rollout_logprobs", pa.list_(pa.float32())),
            ("reward", pa.float64()),
            ("turns", pa.int32()),
            ("tool_calls", pa.int32()),
            ("schema_violations", pa.int32()),
            ("redundant_loop", pa.bool_()),
            ("task", pa.string()),
            ("final_status", pa.string()),
            ("end_reason", pa.string()),
            ("best_speedup_vs_compile", pa.float64()),
            ("best_speedup_vs_eager", pa.float64()),
            ("tool_counts", pa.string()),
            ("messages", pa.string()),
            ("wall_seconds", pa.float64()),
            ("evaluator_seconds", pa.float64()),
        ]
    )


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else float(value)


def episode_row(result: EpisodeResult) -> dict[str, Any]:
    t = result.trajectory
    return {
        "tokens": list(t.tokens),
        "loss_mask": list(t.loss_mask),
        "rollout_logprobs": list(t.rollout_logprobs),
        "reward": _nan_if_none(result.reward),
        "turns": result.turns,
        "tool_calls": result.tool_calls,
        "schema_violations": result.schema_violations,
        "redundant_loop": result.redundant_loop,
        "task": result.task,
        "final_status": result.final_status,
        "end_reason": result.end_reason,
        "best_speedup_vs_compile": _nan_if_none(result.best_speedup_vs_compile),
        "best_speedup_vs_eager": _nan_if_none(result.best_speedup_vs_eager),
        "tool_counts": json.dumps(result.tool_counts, sort_keys=True),
        "messages": json.dumps(t.messages),
        "wall_seconds": result.wall_seconds,
        "evaluator_seconds": result.evaluator_seconds,
    }


def write_trajectories(results: Sequence[EpisodeResult], path: str | Path) -> Path:
    """Write the episodes to a parquet file (parent directories are created)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [episode_row(r) for r in results]
    schema = _schema()
    table = pa.Table.from_pylist(rows, schema=schema) if rows else schema.empty_table()
    pq.write_table(table, path)
    return path


def read_trajectories(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a trajectory file as dicts (lists as Python lists)."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trajectory file not found: {path}")
    return pq.read_table(path).to_pylist()
