"""Where a training command's metric records go: JSON lines and, optionally, TensorBoard scalars.

A record is a flat dict. Records with an "event" key (a stage starting, a checkpoint resumed) are
kept in the JSON lines only; the others are scalars at the record's step (`step_key`: "step" for
the stages, "iteration" for the on-policy loop), tagged `<stage>/<name>` when they name a stage.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .tfevents import EventFileWriter


class MetricsSink:
    def __init__(self, jsonl: str | Path | None = None, tensorboard_dir: str | Path | None = None,
                 step_key: str = "step"):
        self.step_key = step_key
        self._lines = open(jsonl, "a") if jsonl else None
        self._events = EventFileWriter(tensorboard_dir) if tensorboard_dir else None

    def write(self, record: dict[str, Any]) -> None:
        if self._lines is not None:
            self._lines.write(json.dumps(record, sort_keys=True, default=_plain) + "\n")
            self._lines.flush()
        if self._events is not None and "event" not in record and self.step_key in record:
            prefix = f"{record['stage']}/" if isinstance(record.get("stage"), str) else ""
            values = {prefix + key: value for key, value in record.items() if key not in (self.step_key, "stage")}
            self._events.scalars(int(record[self.step_key]), values)

    def close(self) -> None:
        for sink in (self._lines, self._events):
            if sink is not None:
                sink.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _plain(value: Any):
    """A JSON form of what json cannot write itself: numbers (numpy, jax scalars) as floats, else text."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)
