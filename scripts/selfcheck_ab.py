#!/usr/bin/env python
"""The self-check (each task's own Model as the candidate) with one evaluator setting two ways, alternating.

  python scripts/selfcheck_ab.py SETTING=A SETTING=B [--tasks STEM ...] [--rounds 2] [--backend cuda]
  e.g. python scripts/selfcheck_ab.py jail_children=true jail_children=false --tasks 6_Swish 3_ReLU

Each round benches the chosen tasks of examples/kernelbench_level1 once with each value, in a fresh
baseline cache every time (so baselines are measured anew and the children are new processes), and
prints eager / candidate per task as it goes; the table at the end gives each value's ratios side by side
and how many are within the band. Values are JSON (true, false, 0, 2097152, "text"). Exit status 0 when
every evaluation ran, 1 when one was not `correct`, 2 for bad arguments or a missing task file. With $OUT
set, writes $OUT/selfcheck_ab.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LEVEL1 = REPO / "examples" / "kernelbench_level1" / "level1"
DEFAULT_TASKS = ["1_Square_matrix_multiplication", "3_ReLU", "6_Swish", "13_Conv2d_square_input", "14_MSE_loss"]


def parse_setting(text: str) -> tuple[str, object]:
    """`name=value` with a JSON value; a bare word that is not JSON is taken as a string."""
    name, sep, raw = text.partition("=")
    if not sep or not name:
        raise ValueError(f"expected SETTING=VALUE, got {text!r}")
    try:
        return name, json.loads(raw)
    except ValueError:
        return name, raw


def ratio_of(record: dict) -> float | None:
    speedup = (record.get("speedup") or {}).get("eager")
    return float(speedup) if record.get("status") == "correct" and isinstance(speedup, (int, float)) else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first", help="SETTING=VALUE of the first way")
    parser.add_argument("second", help="SETTING=VALUE of the second way")
    parser.add_argument("--tasks", nargs="*", default=DEFAULT_TASKS, help="task stems under " + str(LEVEL1))
    parser.add_argument("--rounds", type=int, default=2, help="rounds, each benching both ways (default 2)")
    parser.add_argument("--backend", default="cuda", help="evaluator backend (default cuda)")
    parser.add_argument("--band", type=float, default=0.03, help="half-width of the band around 1 (default 0.03)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from evaluator_cuda.settings import EvalSettings

    try:
        ways = [parse_setting(args.first), parse_setting(args.second)]
        for name, value in ways:
            EvalSettings.from_dict({"backend": args.backend, name: value})
    except (ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    missing = [stem for stem in args.tasks if not (LEVEL1 / f"{stem}.py").exists()]
    if missing:
        print(f"error: no task file for {', '.join(missing)} under {LEVEL1}", file=sys.stderr)
        return 2
    ratios, failed = run_rounds(args, ways)
    print_table(ratios, ways, args.band)
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"]) / "selfcheck_ab.json"
        out.parent.mkdir(parents=True, exist_ok=True)  # $OUT need not exist yet
        out.write_text(json.dumps({"ways": [f"{n}={json.dumps(v)}" for n, v in ways], "ratios": ratios}, indent=1))
    return 1 if failed else 0


def run_rounds(args, ways: list[tuple[str, object]]) -> tuple[dict, int]:
    """{way label: {task: [eager / candidate per round]}} and the number of evaluations not `correct`."""
    from evaluator_cuda.bench.run import run_bench
    from evaluator_cuda.settings import EvalSettings

    begin, failed = time.perf_counter(), 0
    ratios: dict = {f"{n}={json.dumps(v)}": {} for n, v in ways}
    with tempfile.TemporaryDirectory(prefix="selfcheck-ab-") as scratch:
        tasks = Path(scratch) / "level1"
        tasks.mkdir()
        for stem in args.tasks:
            shutil.copy(LEVEL1 / f"{stem}.py", tasks / f"{stem}.py")
        for round_index in range(args.rounds):
            order = ways if round_index % 2 == 0 else list(reversed(ways))
            for name, value in order:
                label = f"{name}={json.dumps(value)}"
                run_dir = Path(tempfile.mkdtemp(dir=scratch))
                settings = EvalSettings.for_backend(args.backend, cache_dir=str(run_dir / "cache"), **{name: value})
                print(f"[{time.perf_counter() - begin:6.1f}s] round {round_index + 1}: {label}", flush=True)
                run_bench(tasks, None, settings, run_dir / "out")
                records = json.loads((run_dir / "out" / "report.json").read_text())["records"]
                for record in records:
                    ratio = ratio_of(record)
                    failed += ratio is None
                    ratios[label].setdefault(record["task"], []).append(ratio)
                    print(f"[{time.perf_counter() - begin:6.1f}s]   {record['task']}: "
                          + (f"{ratio:.3f}x" if ratio is not None else str(record.get("status"))), flush=True)
    return ratios, failed


def print_table(ratios: dict, ways: list, band: float) -> None:
    labels = list(ratios)
    tasks = list(dict.fromkeys(task for label in labels for task in ratios[label]))
    print(f"{'task':44s} " + "  ".join(f"{label[:28]:>28s}" for label in labels))
    for task in tasks:
        cells = []
        for label in labels:
            values = ratios[label].get(task, [])
            cells.append(" / ".join("-" if v is None else f"{v:.3f}" for v in values) or "-")
        print(f"{task:44s} " + "  ".join(f"{cell:>28s}" for cell in cells))
    for label in labels:
        values = [v for task_values in ratios[label].values() for v in task_values]
        inside = sum(v is not None and abs(v - 1.0) <= band for v in values)
        known = [v for v in values if v is not None]
        median = f"{statistics.median(known):.3f}" if known else "-"
        print(f"{label}: within ±{100 * band:.1f} %: {inside} of {len(values)}; median ratio {median}")


if __name__ == "__main__":
    sys.exit(main())
