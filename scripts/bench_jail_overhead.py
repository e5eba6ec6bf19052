"""What the evaluator's jail costs one evaluation on the host backend: the same evaluations with the
candidate and build children jailed and unjailed (jail_children=False), alternating, medians.

    python scripts/bench_jail_overhead.py [--runs 5]

cached: an honest axpy workspace whose build is cached (children start cold, no standby);
fresh build: the same with a new comment each run, so the fast build compiles two units and links.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from evaluator_helpers import AXPY_TASK, KERNEL, host, workspace  # noqa: E402

from evaluator_cuda.evaluation import evaluate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    cache = tempfile.mkdtemp(prefix="bench-jail-")
    results: dict = {}
    for jailed in (True, False):  # warm the caches (binding runtime, precompiled headers) once per mode
        evaluate(AXPY_TASK, workspace(), host(cache, jail_children=jailed))
    for _ in range(args.runs):
        for jailed in (True, False):
            settings = host(cache, jail_children=jailed)
            for case in ("cached", "fresh build"):
                solution = workspace()
                if case == "fresh build":
                    kernel = f"// {uuid.uuid4().hex}\n" + KERNEL.replace("OP", "+")
                    solution = workspace(kernel=kernel)
                begin = time.perf_counter()
                record = evaluate(AXPY_TASK, solution, settings)
                wall = time.perf_counter() - begin
                assert record["status"] == "correct", record["message"]
                row = results.setdefault(case, {}).setdefault("jailed" if jailed else "unjailed",
                                                             {"total_s": [], "build_s": []})
                row["total_s"].append(wall)
                row["build_s"].append(record["build"]["seconds"])
    summary = {case: {mode: {k: round(statistics.median(v), 3) for k, v in row.items()} for mode, row in modes.items()}
               for case, modes in results.items()}
    print(json.dumps({"runs": args.runs, "median": summary}, indent=1))


if __name__ == "__main__":
    main()
