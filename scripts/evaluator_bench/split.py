"""Subcommand `split`: where one evaluation's wall time goes, with the outputs judged on the GPU and on the CPU.

For each chosen example (default: all six), the honest solution under examples/solutions/<backend> is
evaluated once with the baselines measured (cold), then twice with them cached, alternating the judge:
on the device in the verdict process (settings.judge_on_device, the default) and on its CPU. Each
cached evaluation keeps its total wall time, its verification split (record["verify_steps_s"]) and the
split of its candidate calls (record["calls_split_us"]: the child's phases and the channel). Prints a
table at the end; with $OUT set, writes $OUT/bench_evaluator_split.json. Exit status 0 when every
evaluation was `correct`, 1 otherwise, 2 for an unknown example or a cuda run without a GPU.
"""

from __future__ import annotations

import sys
import tempfile

from evaluator_bench.common import SOLUTIONS, TASKS, write_out
from evaluator_bench.report import Clock, fmt

JUDGES = {"device": True, "cpu": False}  # label: settings.judge_on_device


def add_arguments(parser) -> None:
    parser.add_argument("--only", nargs="*", default=None, help="example task stems (default: every example)")
    parser.add_argument("--backend", default="cuda", choices=("cuda", "host"))
    parser.add_argument("--budget-s", type=float, default=300.0, help="skip the remaining examples past this")


def main(args) -> int:
    import torch

    if args.backend == "cuda" and not torch.cuda.is_available():
        print("no GPU visible: `bench_evaluator.py split` needs one (or --backend host)", file=sys.stderr)
        return 2
    from evaluator_cuda.tasks import load_tasks

    tasks = {t.stem: t for t in load_tasks(TASKS).tasks}
    only = args.only or sorted(tasks)
    unknown = [stem for stem in only if stem not in tasks]
    if unknown:
        print(f"no example task named {', '.join(unknown)} (examples: {', '.join(sorted(tasks))})", file=sys.stderr)
        return 2
    clock = Clock(args.budget_s)
    cache = tempfile.mkdtemp(prefix="cuda-agent-split-")
    rows = []
    for stem in only:
        if clock.remaining() <= 0:
            clock.say(f"budget spent: {stem} skipped")
            continue
        rows.append(_example(clock, tasks[stem], args.backend, cache))
    _print_table(rows)
    write_out("bench_evaluator_split.json", {"rows": rows, "backend": args.backend})
    ok = all(run["status"] == "correct" for row in rows for run in row["runs"].values())
    return 0 if ok and rows else 1


def _example(clock: Clock, task, backend: str, cache: str) -> dict:
    """The honest solution: cold, then cached with each judge."""
    from evaluator_cuda.evaluation import children_kept_warm, evaluate
    from evaluator_cuda.settings import EvalSettings
    from evaluator_cuda.solutions import read_solution

    solution = read_solution(SOLUTIONS / backend / task.stem)
    runs = {}
    with children_kept_warm():
        for label, on_device in (("cold", True), *((f"cached_{k}", v) for k, v in JUDGES.items())):
            settings = EvalSettings.for_backend(backend, cache_dir=cache, judge_on_device=on_device)
            record = evaluate(task, solution, settings)
            runs[label] = {"status": record["status"], "reward": record.get("reward"),
                           "total_s": (record.get("wall_s") or {}).get("total"), "wall_s": record.get("wall_s"),
                           "judged_on": record.get("judged_on"), "steps_s": record.get("verify_steps_s"),
                           "calls_us": record.get("calls_split_us"), "message": record.get("message", "")[:200]}
            clock.say(f"{task.stem} {label}: {record['status']}, reward {record.get('reward')}, "
                      f"{fmt(runs[label]['total_s'], 2)} s, judged on {record.get('judged_on')}")
            clock.say(f"  steps {runs[label]['steps_s']}")
            clock.say(f"  calls {runs[label]['calls_us']}")
    return {"task": task.stem, "runs": runs}


def _print_table(rows: list[dict]) -> None:
    print(f"{'task':18s} {'cold s':>7s} {'cached s':>8s} {'cpu-judged s':>12s} {'judge s':>7s} {'cpu judge s':>11s}  "
          "calls: median µs per call (round trip, channel, call)")
    for row in rows:
        runs = row["runs"]
        cold, device, cpu = (runs.get(k) or {} for k in ("cold", "cached_device", "cached_cpu"))
        calls = device.get("calls_us") or {}
        print(f"{row['task']:18s} {fmt(cold.get('total_s'), 2):>7s} {fmt(device.get('total_s'), 2):>8s} "
              f"{fmt(cpu.get('total_s'), 2):>12s} {fmt((device.get('steps_s') or {}).get('judge'), 2):>7s} "
              f"{fmt((cpu.get('steps_s') or {}).get('judge'), 2):>11s}  {fmt(calls.get('round_trip'), 0)} "
              f"{fmt(calls.get('channel'), 0)} {fmt(calls.get('call'), 0)}")
