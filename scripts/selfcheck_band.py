#!/usr/bin/env python
"""How many tasks of a self-check bench (no solutions: each task's own Model is the candidate) have
their eager / candidate ratio within a band around 1.

  python scripts/selfcheck_band.py OUT/report.json [--band 0.03]

Prints one line per task (status, eager / candidate, the two medians and their spreads; on CUDA also the
ratio of the calls' plain medians, beside the pair-mean medians the reward uses) and a last
line `within ±3.0 %: N of M`. Exit 0 when every task is correct and within the band, 1 when some are
not, 2 when the report cannot be read or holds no record.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def ratio_line(record: dict) -> tuple[float | None, str]:
    """(eager / candidate or None, the task's line)."""
    name = record.get("task", "?")
    speedup = (record.get("speedup") or {}).get("eager")
    times = record.get("times_us") or {}
    if record.get("status") != "correct" or not isinstance(speedup, (int, float)) or not math.isfinite(speedup):
        return None, f"{name}: {record.get('status')} ({record.get('message') or 'no eager ratio'})"[:200]
    spread = "  ".join(f"{kind} {times[kind].get('median_us', float('nan')):.1f} µs "
                       f"±{100 * (times[kind].get('median_rel_se') or 0.0):.1f} %"
                       for kind in ("candidate", "eager") if isinstance(times.get(kind), dict))
    plain = [(times.get(kind) or {}).get("call_median_us") for kind in ("eager", "candidate")]
    if all(isinstance(v, (int, float)) and v > 0 for v in plain):  # CUDA: the calls' plain medians beside
        spread += f"  (plain medians {plain[0] / plain[1]:.3f}x)"
    return float(speedup), f"{name}: {speedup:.3f}x  {spread}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=Path, help="report.json written by `cuda-agent bench --out`")
    parser.add_argument("--band", type=float, default=0.03, help="half-width of the band around 1 (default 0.03)")
    args = parser.parse_args(argv)
    try:
        records = json.loads(args.report.read_text())["records"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: cannot read records from {args.report}: {exc}", file=sys.stderr)
        return 2
    if not records:
        print(f"error: {args.report} holds no record", file=sys.stderr)
        return 2
    within = 0
    for record in records:
        ratio, line = ratio_line(record)
        inside = ratio is not None and abs(ratio - 1.0) <= args.band
        within += inside
        print(("  " if inside else "! ") + line)
    print(f"within ±{100 * args.band:.1f} %: {within} of {len(records)}")
    return 0 if within == len(records) else 1


if __name__ == "__main__":
    sys.exit(main())
