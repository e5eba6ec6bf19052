"""Subcommand `trace`: what the kernel trace costs the timed calls, on a GPU, and the self-check ratio.

For each chosen example (default: elementwise_chain, row_softmax, layernorm), with the kernel trace on
(the default) and off (settings.kernel_attribution = False), each mode in a fresh cache:
  1. the harness self-check (the task's own Model as the candidate, never traced, so the two modes are two
     samples of one path): evaluated once (baselines measured) and once more (baselines cached); eager
     median / candidate median, which an unbiased harness keeps within 3 % of 1;
  2. the honest solution under examples/solutions/cuda, baselines cached: its median, so that the two
     modes side by side give the trace's overhead on the timed calls.
The cached evaluations' verification split (record["verify_steps_s"]) is kept. Prints a table at the end;
with $OUT set, writes $OUT/bench_evaluator_trace.json. Exit status 0 when every evaluation was `correct`,
1 otherwise, 2 without a GPU or for an unknown example.
"""

from __future__ import annotations

import sys
import tempfile

from evaluator_bench.common import SOLUTIONS, TASKS, gpu_missing, write_out
from evaluator_bench.report import Clock, fmt

DEFAULT_ONLY = ["elementwise_chain", "row_softmax", "layernorm"]
LABELS = ("self_cold", "self_cached", "honest")  # the evaluations of each example and mode, in order


def add_arguments(parser) -> None:
    parser.add_argument("--only", nargs="*", default=DEFAULT_ONLY, help="example task stems")
    parser.add_argument("--budget-s", type=float, default=300.0, help="skip the remaining examples past this")


def main(args) -> int:
    import torch

    if gpu_missing("trace"):
        return 2
    from evaluator_cuda.tasks import load_tasks

    clock = Clock(args.budget_s)
    tasks = {t.stem: t for t in load_tasks(TASKS).tasks}
    unknown = [stem for stem in args.only if stem not in tasks]
    if unknown:
        print(f"no example task named {', '.join(unknown)} (examples: {', '.join(sorted(tasks))})", file=sys.stderr)
        return 2
    rows = []
    for traced in (True, False):
        settings = _settings(traced)
        for stem in args.only:
            if clock.remaining() <= 0:
                clock.say(f"budget spent: {stem} with the trace {'on' if traced else 'off'} skipped")
                continue
            rows.append(_example(clock, tasks[stem], settings, traced))
    _print_table(rows)
    write_out("bench_evaluator_trace.json", {"rows": rows, "device": torch.cuda.get_device_name()})
    statuses = [row[label]["status"] for row in rows for label in LABELS]
    return 0 if all(s == "correct" for s in statuses) else 1


def _settings(traced: bool):
    from evaluator_cuda.settings import EvalSettings

    cache = tempfile.mkdtemp(prefix=f"cuda-agent-trace-{'on' if traced else 'off'}-")
    return EvalSettings.for_backend("cuda", cache_dir=cache, kernel_attribution=traced)


def _example(clock: Clock, task, settings, traced: bool) -> dict:
    """Self-check twice (cold, cached baselines) and the honest solution once, one mode."""
    from evaluator_cuda.evaluation import children_kept_warm, evaluate
    from evaluator_cuda.solutions import read_solution, reference_solution

    stem, mode = task.stem, "on" if traced else "off"
    solutions = {"self_cold": reference_solution(stem), "self_cached": reference_solution(stem),
                 "honest": read_solution(SOLUTIONS / "cuda" / stem)}
    row: dict = {"task": stem, "trace": mode}
    with children_kept_warm():
        for label in LABELS:
            clock.say(f"{stem}: {label}, trace {mode}")
            record = evaluate(task, solutions[label], settings)
            times = record.get("times_us") or {}
            ours = (times.get("candidate") or {}).get("median_us")
            eager = (times.get("eager") or {}).get("median_us")
            row[label] = {"status": record["status"], "reward": record.get("reward"), "ours_us": ours,
                          "eager_us": eager, "ratio": (eager / ours) if ours and eager else None,
                          "total_s": (record.get("wall_s") or {}).get("total"),
                          "steps_s": record.get("verify_steps_s"), "withheld": record.get("speedup_withheld")}
            clock.say(f"  {record['status']} ours {fmt(ours)} µs, eager {fmt(eager)} µs, "
                      f"{fmt((record.get('wall_s') or {}).get('total'))} s")
    return row


def _print_table(rows: list[dict]) -> None:
    print(f"{'task':18s} {'trace':5s} {'self cold':>9s} {'self cached':>11s} {'honest us':>9s} {'cached s':>8s}  "
          "verify split of the cached self-check (s)")
    for row in rows:
        cold, cached, honest = (row.get(k) or {} for k in LABELS)
        split = " ".join(f"{k} {v:.2f}" for k, v in (cached.get("steps_s") or {}).items())
        print(f"{row['task']:18s} {row['trace']:5s} {fmt(cold.get('ratio'), 3):>9s} {fmt(cached.get('ratio'), 3):>11s} "
              f"{fmt(honest.get('ours_us')):>9s} {fmt(cached.get('total_s'), 2):>8s}  {split}")
