"""Subcommand `compile-pool`: inductor's compile workers in the reference child, a pool or none, side by side.

Every chosen example's self-check (the task's own Model as the candidate) is evaluated with its baselines
measured, each in a process of its own with a fresh evaluator cache and fresh inductor and triton caches,
so that every torch.compile starts cold, as it does for a new task. Two modes, `settings.compile_threads`:
  pool  0: torch's default, a pool of compile workers (one per CPU, up to 32) started by every evaluation;
  one   1: the kernels compiled in the reference child itself.
Each round runs the examples one at a time, then all of them at once (the way a synthesis run's
workers evaluate side by side), the modes alternating in order from round to round. Reported per mode:
the medians of the compile's first call (`compile_first_call_s`), of the baselines' and of the whole
evaluation's wall time, one at a time and all at once, and the wall time of each batch. With $OUT set,
writes $OUT/bench_evaluator_compile_pool.json. Exit status 0 when every evaluation was `correct`, 1
otherwise, 2 for an unknown example.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evaluator_bench.common import REPO, TASKS, write_out
from evaluator_bench.report import Clock, fmt

MODES = {"pool": 0, "one": 1}
DEFAULT_ONLY = ["elementwise_chain", "row_softmax", "layernorm", "gemm_bias_gelu", "row_l2_norm", "maxpool2d"]


def add_arguments(parser) -> None:
    parser.add_argument("--only", nargs="*", default=DEFAULT_ONLY, help="example task stems")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both modes")
    parser.add_argument("--backend", default="auto", help="auto | cuda | host")
    parser.add_argument("--budget-s", type=float, default=400.0, help="no new batch is started past this")
    parser.add_argument("--child-timeout-s", type=float, default=240.0, help="limit of one evaluation's process")


def main(args) -> int:
    unknown = [stem for stem in args.only if not (TASKS / f"{stem}.py").exists()]
    if unknown:
        print(f"no example task named {', '.join(unknown)}", file=sys.stderr)
        return 2
    clock = Clock(args.budget_s)
    runs: list[dict] = []
    for round_index in range(args.rounds):
        order = list(MODES) if round_index % 2 == 0 else list(MODES)[::-1]
        for mode in order:
            for together in (False, True):
                if clock.remaining() <= 0:
                    clock.say(f"budget spent: round {round_index + 1} {mode} skipped")
                    continue
                runs.append(_batch(clock, args, mode, together))
    summary = _summary(runs)
    _print_table(summary)
    write_out("bench_evaluator_compile_pool.json", {"runs": runs, "summary": summary, "cpus": os.cpu_count()})
    statuses = [e["status"] for run in runs for e in run["evaluations"]]
    return 0 if statuses and all(s == "correct" for s in statuses) else 1


def _batch(clock: Clock, args, mode: str, together: bool) -> dict:
    """The chosen examples, each in its own process, one at a time or all at once."""
    how = "all at once" if together else "one at a time"
    clock.say(f"mode {mode}: {len(args.only)} self-checks {how}")
    begin = time.perf_counter()
    if together:
        with concurrent.futures.ThreadPoolExecutor(len(args.only)) as pool:
            evaluations = list(pool.map(lambda stem: _evaluate(args, stem, mode), args.only))
    else:
        evaluations = [_evaluate(args, stem, mode) for stem in args.only]
    wall = time.perf_counter() - begin
    for e in evaluations:
        clock.say(f"  {e['task']}: {e['status']}, compile first call {fmt(e.get('compile_first_call_s'), 2)} s, "
                  f"baselines {fmt(e.get('baselines_s'), 2)} s, total {fmt(e.get('total_s'), 2)} s")
    clock.say(f"  batch {wall:.1f} s")
    return {"mode": mode, "together": together, "wall_s": wall, "evaluations": evaluations}


def _evaluate(args, stem: str, mode: str) -> dict:
    """One self-check in a fresh process with fresh caches; its figures, or its failure."""
    scratch = tempfile.mkdtemp(prefix=f"compile-pool-{mode}-{stem}-")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{scratch}/inductor", "TRITON_CACHE_DIR": f"{scratch}/triton",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), str(REPO / "scripts"), os.environ.get("PYTHONPATH", ""))
                                         if p)}
    spec = {"task": str(TASKS / f"{stem}.py"), "backend": args.backend, "cache_dir": f"{scratch}/cache",
            "compile_threads": MODES[mode]}
    try:
        done = subprocess.run([sys.executable, __file__, json.dumps(spec)], env=env, capture_output=True, text=True,
                              timeout=args.child_timeout_s)
    except subprocess.TimeoutExpired:
        return {"task": stem, "status": f"timeout after {args.child_timeout_s:.0f} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"task": stem, "status": f"exit {done.returncode}: {done.stderr.strip()[-300:]}"}
    return {"task": stem, **json.loads(lines[-1])}


def _child(spec: dict) -> dict:
    """Runs in the evaluation's own process: the self-check, its figures as one JSON line."""
    from evaluator_cuda.evaluation import evaluate
    from evaluator_cuda.settings import EvalSettings
    from evaluator_cuda.solutions import reference_solution
    from evaluator_cuda.tasks import Task

    path = Path(spec["task"])
    task = Task(name=path.stem, source=path.read_text(), origin="bench")
    settings = EvalSettings.for_backend(spec["backend"], cache_dir=spec["cache_dir"],
                                        compile_threads=spec["compile_threads"])
    record = evaluate(task, reference_solution(task.stem), settings)
    wall = record.get("wall_s") or {}
    return {"status": record["status"], "compile_first_call_s": wall.get("compile_first_call"),
            "compile_error": record.get("compile_baseline_error"), "baselines_s": wall.get("baselines"),
            "total_s": wall.get("total")}


def _median(values) -> float | None:
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(values) if values else None


def _summary(runs: list[dict]) -> list[dict]:
    rows = []
    for mode in MODES:
        for together in (False, True):
            chosen = [run for run in runs if run["mode"] == mode and run["together"] == together]
            evaluations = [e for run in chosen for e in run["evaluations"]]
            rows.append({"mode": mode, "together": together, "n": len(evaluations),
                         "batch_s": _median(run["wall_s"] for run in chosen),
                         **{key: _median(e.get(key) for e in evaluations)
                            for key in ("compile_first_call_s", "baselines_s", "total_s")}})
    return rows


def _print_table(rows: list[dict]) -> None:
    print(f"{'mode':5s} {'batch':13s} {'n':>3s} {'compile 1st s':>13s} {'baselines s':>11s} {'total s':>8s} "
          f"{'batch s':>8s}   (medians)")
    for row in rows:
        how = "all at once" if row["together"] else "one at a time"
        print(f"{row['mode']:5s} {how:13s} {row['n']:3d} {fmt(row['compile_first_call_s'], 2):>13s} "
              f"{fmt(row['baselines_s'], 2):>11s} {fmt(row['total_s'], 2):>8s} {fmt(row['batch_s'], 1):>8s}")


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))))
