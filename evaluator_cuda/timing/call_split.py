"""Where the wall time of a candidate's calls goes, for the record (`calls_split_us`).

Each call's answer carries the candidate child's own split (inputs to the device, set-up,
the call, the checks after it, the copy out); the parent adds the round trip it measured.
What the round trip holds beyond the child's split is the channel: encoding, the socket,
decoding. Every figure is the median over the calls. The candidate's process reports its
own split, so it is bookkeeping only: no verdict or reward reads it.
"""

from __future__ import annotations

import math
import statistics

PHASES = ("inputs", "setup", "call", "checks", "copy_out", "digest")


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def summarize_split(splits: list, round_trips: list[float]) -> dict | None:
    """{phase: median µs, "round_trip": median µs, "channel": median of round trip minus the
    child's phases} over the calls; None without calls. Missing or non-numeric figures are skipped."""
    if not round_trips:
        return None
    summary: dict[str, float] = {}
    for phase in PHASES:
        values = [_number(s.get(phase)) for s in splits if isinstance(s, dict)]
        values = [v for v in values if v is not None]
        if values:
            summary[phase] = round(statistics.median(values), 1)
    summary["round_trip"] = round(statistics.median(round_trips), 1)
    channel = []
    for split, trip in zip(splits, round_trips):
        inside = [_number(split.get(p)) for p in PHASES] if isinstance(split, dict) else [None]
        if all(v is not None for v in inside):
            channel.append(trip - sum(inside))
    if channel:
        summary["channel"] = round(statistics.median(channel), 1)
    return summary
