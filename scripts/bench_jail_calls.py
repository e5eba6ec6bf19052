"""What the evaluator's jail costs each candidate call on a GPU: the honest example solutions evaluated
with the candidate and build children jailed and unjailed (jail_children), alternating, baselines cached.

    python scripts/bench_jail_calls.py [--only row_softmax gemm_bias_gelu] [--rounds 2] [--budget-s 150]

Per mode and example, the medians over the rounds of: the candidate's median device time per call,
the calls' round trip and channel (record["calls_split_us"]), the load step and the evaluation's
total. Prints progress and a JSON summary; with $OUT set, writes $OUT/bench_jail_calls.json. Exit
status 0 when every evaluation was `correct`, 1 otherwise, 2 without a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from evaluator_bench.common import SOLUTIONS, TASKS, put_checkout_on_path, write_out  # noqa: E402

MODES = {"jailed": True, "unjailed": False}


def _figures(record: dict) -> dict:
    calls = record.get("calls_split_us") or {}
    candidate = (record.get("times_us") or {}).get("candidate") or {}
    return {"device_us": candidate.get("median_us"), "round_trip_us": calls.get("round_trip"),
            "channel_us": calls.get("channel"), "load_s": (record.get("verify_steps_s") or {}).get("load"),
            "total_s": (record.get("wall_s") or {}).get("total")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=["row_softmax", "gemm_bias_gelu"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--budget-s", type=float, default=150.0)
    args = parser.parse_args()
    put_checkout_on_path()
    import torch

    if not torch.cuda.is_available():
        print("no GPU visible: bench_jail_calls.py is for the H200", file=sys.stderr)
        return 2
    from evaluator_cuda.evaluation import evaluate
    from evaluator_cuda.settings import EvalSettings
    from evaluator_cuda.solutions import read_solution
    from evaluator_cuda.tasks import load_tasks

    begin, cache = time.perf_counter(), tempfile.mkdtemp(prefix="bench-jail-calls-")
    tasks = {t.stem: t for t in load_tasks(TASKS).tasks}
    rows: dict = {}
    ok = True
    for round_index in range(-1, args.rounds):  # round -1 fills the caches (builds, baselines)
        for stem in args.only:
            for mode, jailed in MODES.items():
                if time.perf_counter() - begin > args.budget_s:
                    print(f"budget spent at round {round_index}, {stem}, {mode}", flush=True)
                    break
                settings = EvalSettings.for_backend("cuda", cache_dir=cache, jail_children=jailed)
                record = evaluate(tasks[stem], read_solution(SOLUTIONS / "cuda" / stem), settings)
                ok = ok and record["status"] == "correct"
                figures = _figures(record)
                print(f"[{time.perf_counter() - begin:6.1f}s] round {round_index} {stem} {mode}: "
                      f"{record['status']} {figures}", flush=True)
                if round_index >= 0:
                    rows.setdefault(stem, {}).setdefault(mode, []).append(figures)
    summary = {stem: {mode: {k: statistics.median(r[k] for r in runs if r[k] is not None)
                             for k in runs[0] if any(r[k] is not None for r in runs)}
                      for mode, runs in modes.items()} for stem, modes in rows.items()}
    print(json.dumps(summary, indent=1))
    write_out("bench_jail_calls.json", {"summary": summary, "rows": rows})
    return 0 if ok and rows else 1


if __name__ == "__main__":
    sys.exit(main())
