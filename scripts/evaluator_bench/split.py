"""Subcommand `split`: where one evaluation's wall time goes, two settings side by side.

For each chosen example (default: all six), the honest solution under examples/solutions/<backend> is
evaluated once with the baselines measured (cold), then with them cached, alternating two variants
`--rounds` times each: with `--vary judge` (the default) the outputs judged on the device in the verdict
process (settings.judge_on_device, the default) and on its CPU; with `--vary commit` large outputs
committed by digest and fetched only for checked calls (settings.commit_output_bytes at
settings.COMMIT_OUTPUT_BYTES, the cuda default) and every output sent with its call; with `--vary seeds`
each call's input set made in the candidate child from the call's seed (settings.inputs_from_seeds, the
default) and every set's bytes sent; with `--vary seeds_commit` both made sets and committed outputs
against both sent; with `--vary standby` the next evaluation's children started when this one takes its
own (settings.next_children_start "at_start", its timed work waiting until they are warm) and after its
timed calls (the default), and with `--vary overlap` "overlapping" (no wait) against "at_start": these two
run each variant's rounds back to back (what one evaluation starts, the next one takes), as does
`--vary trace_order`: the candidate child's kernel trace started before its CUDA context against after it
(settings.kernel_trace_start), and `--vary pairs`: two pairs kept starting ahead, each evaluation starting
the next at its own start without waiting (settings.standby_pairs 2, "overlapping"), against one pair started
after the timed calls; `standby` and `overlap` keep one pair. Each cached evaluation
keeps its total wall time, its verification split (record["verify_steps_s"]), the split of its
candidate calls (record["calls_split_us"]: the child's phases and the channel) and where its children's
start went (record["children_start_s"]: seconds from the pair's start to each child's serve, warm, trace
and ready). Prints a table at the
end; with $OUT set, writes $OUT/bench_evaluator_split.json. Exit status 0 when every evaluation was
`correct`, 1 otherwise, 2 for an unknown example or a cuda run without a GPU.
"""

from __future__ import annotations

import statistics
import sys
import tempfile

from evaluator_bench.common import SOLUTIONS, TASKS, gpu_missing, write_out
from evaluator_bench.report import Clock, fmt
from evaluator_cuda.settings import COMMIT_OUTPUT_BYTES

VARIANTS = {  # --vary: label -> settings overrides, the default first
    "judge": {"device": {"judge_on_device": True}, "cpu": {"judge_on_device": False}},
    "commit": {"committed": {"commit_output_bytes": COMMIT_OUTPUT_BYTES}, "sent": {"commit_output_bytes": None}},
    "seeds": {"made": {"inputs_from_seeds": True}, "sent": {"inputs_from_seeds": False}},
    "seeds_commit": {"made_committed": {"inputs_from_seeds": True, "commit_output_bytes": COMMIT_OUTPUT_BYTES},
                     "sent": {"inputs_from_seeds": False, "commit_output_bytes": None}},
    "standby": {"at_start": {"standby_pairs": 1, "next_children_start": "at_start"},
                "after_timing": {"standby_pairs": 1, "next_children_start": "after_timing"}},
    "overlap": {"overlapping": {"standby_pairs": 1, "next_children_start": "overlapping"},
                "at_start": {"standby_pairs": 1, "next_children_start": "at_start"}},
    "pairs": {"two_overlapping": {"standby_pairs": 2, "next_children_start": "overlapping"},
              "one_after_timing": {"standby_pairs": 1, "next_children_start": "after_timing"}},
    "trace_order": {"before_context": {"kernel_trace_start": "before_context"},
                    "after_context": {"kernel_trace_start": "after_context"}},
}
# Variants that change what the next evaluation finds: each runs its rounds back to back, not alternated
IN_BLOCKS = ("standby", "overlap", "pairs", "trace_order")


def add_arguments(parser) -> None:
    parser.add_argument("--only", nargs="*", default=None, help="example task stems (default: every example)")
    parser.add_argument("--backend", default="cuda", choices=("cuda", "host"))
    parser.add_argument("--budget-s", type=float, default=300.0, help="skip the remaining examples past this")
    parser.add_argument("--vary", default="judge", choices=sorted(VARIANTS), help="the two settings compared")
    parser.add_argument("--rounds", type=int, default=1, help="cached evaluations of each variant, alternated")


def main(args) -> int:
    if args.backend == "cuda" and gpu_missing("split", "--backend host"):
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
        rows.append(_example(clock, tasks[stem], args.backend, cache, VARIANTS[args.vary], args.rounds,
                             args.vary in IN_BLOCKS))
    _print_table(rows, list(VARIANTS[args.vary]))
    if args.vary in IN_BLOCKS:
        _print_rounds(rows, list(VARIANTS[args.vary]))
    write_out("bench_evaluator_split.json", {"rows": rows, "backend": args.backend, "vary": args.vary})
    ok = all(run["status"] == "correct" for row in rows for run in row["runs"].values())
    return 0 if ok and rows else 1


def _example(clock: Clock, task, backend: str, cache: str, variants: dict, rounds: int, in_blocks: bool) -> dict:
    """The honest solution: cold, then cached, the variants alternated (or each in a block of rounds)."""
    from evaluator_cuda.evaluation import children_kept_warm, evaluate
    from evaluator_cuda.settings import EvalSettings
    from evaluator_cuda.solutions import read_solution

    solution = read_solution(SOLUTIONS / backend / task.stem)
    order = ([(r, k) for k in variants for r in range(rounds)] if in_blocks
             else [(r, k) for r in range(rounds) for k in variants])
    plan = [("cold", {})] + [(f"cached_{k}" + (f"_{r}" if r else ""), variants[k]) for r, k in order]
    runs = {}
    with children_kept_warm():
        for label, overrides in plan:
            record = evaluate(task, solution, EvalSettings.for_backend(backend, cache_dir=cache, **overrides))
            runs[label] = {"status": record["status"], "reward": record.get("reward"),
                           "total_s": (record.get("wall_s") or {}).get("total"), "wall_s": record.get("wall_s"),
                           "judged_on": record.get("judged_on"), "steps_s": record.get("verify_steps_s"),
                           "calls_us": record.get("calls_split_us"), "message": record.get("message", "")[:200],
                           "children_warm_s": record.get("children_warm_s"),
                           "children_start_s": record.get("children_start_s"),
                           "speedup_eager": (record.get("speedup") or {}).get("eager"),
                           "next_children": {k: record.get(k) for k in ("next_children_started_s",
                                                                        "next_children_wait_s")}}
            clock.say(f"{task.stem} {label}: {record['status']}, reward {record.get('reward')}, "
                      f"{fmt(runs[label]['total_s'], 2)} s, judged on {record.get('judged_on')}")
            clock.say(f"  steps {runs[label]['steps_s']}")
            clock.say(f"  calls {runs[label]['calls_us']}")
            clock.say(f"  children: taken {runs[label]['children_warm_s']} s after their start; "
                      f"marks {runs[label]['children_start_s']}; next pair {runs[label]['next_children']}; "
                      f"eager/ours {fmt(runs[label]['speedup_eager'], 3)}")
    return {"task": task.stem, "runs": runs}


def _runs_of(runs: dict, variant: str) -> list[dict]:
    """A variant's cached evaluations in the order they ran (labelled cached_<variant>, cached_<variant>_<round>)."""
    prefix = f"cached_{variant}"
    return [r for label, r in runs.items()
            if label == prefix or (label.startswith(prefix + "_") and label[len(prefix) + 1:].isdigit())]


def _median_of(runs: dict, variant: str, field: str):
    """The median of one field over a variant's cached evaluations (None when none has it)."""
    values = [r[field] for r in _runs_of(runs, variant) if r.get(field)]
    return statistics.median(values) if values else None


def _median_total(runs: dict, variant: str):
    return _median_of(runs, variant, "total_s")


def _print_table(rows: list[dict], variants: list[str]) -> None:
    first, second = variants
    print(f"{'task':18s} {'cold s':>7s} {first + ' s':>12s} {second + ' s':>12s} {'judge s':>7s}  "
          f"{'eager/ours':>13s}  calls ({first}): median µs per call (round trip, channel, call, digest)")
    for row in rows:
        runs = row["runs"]
        cached = runs.get(f"cached_{first}") or {}
        calls = cached.get("calls_us") or {}
        print(f"{row['task']:18s} {fmt((runs.get('cold') or {}).get('total_s'), 2):>7s} "
              f"{fmt(_median_total(runs, first), 2):>12s} {fmt(_median_total(runs, second), 2):>12s} "
              f"{fmt((cached.get('steps_s') or {}).get('judge'), 2):>7s}  "
              f"{fmt(_median_of(runs, first, 'speedup_eager'), 3):>6s}/"
              f"{fmt(_median_of(runs, second, 'speedup_eager'), 3):<6s}  "
              f"{fmt(calls.get('round_trip'), 0)} "
              f"{fmt(calls.get('channel'), 0)} {fmt(calls.get('call'), 0)} {fmt(calls.get('digest'), 0)}")


def _print_rounds(rows: list[dict], variants: list[str]) -> None:
    """Each variant's evaluations back to back, in order: the first may find a pair started long before,
    the later ones show what a worker evaluating without pause waits."""
    print("\nback to back, each evaluation's total in order (s):")
    for row in rows:
        print(f"  {row['task']:18s} " + "; ".join(
            f"{variant}: " + ", ".join(fmt(r.get("total_s"), 2) for r in _runs_of(row["runs"], variant))
            for variant in variants))
