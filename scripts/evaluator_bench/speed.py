"""Subcommand `speed`: evaluation speed and timing agreement, the workspace build and the load_inline build side
by side (compile time, evaluation wall time, spread and agreement with do_bench), in one run bounded by --budget-s.

Two forms of the same kernel are measured in the same run:
  workspace    the CUDA-Agent workspace (examples/solutions/<backend>/<stem>), built by the evaluator's
               default fast build (evaluator_cuda.extension.build_workspace, settings.fast_build)
  kernelbench  a KernelBench single file generated here from the same .cu/.cpp kernel and binding
               sources: ModelNew with torch.utils.cpp_extension.load_inline (format "kernelbench")

1. Compile time of each form: workspace cold with an empty cache (shared parts and the binding
   runtime too, once per machine; first solution only), candidate-cold (new source bytes, shared parts
   warm), cached in the same process and in a fresh process; kernelbench cold (empty
   TORCH_EXTENSIONS_DIR), cached in the same process and in a fresh process (torch imported first).
2. For each case (a task with a size rewritten, in a temp folder; speed_cases.py) and each form: evaluate()
   once (fills the eager/torch.compile baseline cache), then --evals (5) more with cached baselines, inside
   evaluator_cuda.evaluation.children_kept_warm() (the worker's steady state: the next evaluation's
   children start ahead). Per evaluation: verify, profile and total wall seconds (record wall_s) and our
   candidate median µs; the spread of the medians ((max-min)/median); eager and torch.compile medians
   from the record.
3. In the timing child (a separate process, none of the evaluator's state): triton.testing.do_bench
   (L2 flushed, median) of the same ModelNew call on an input of the same size; the ratio ours/do_bench.
   On the host backend a perf_counter median stands in for do_bench.
Goals, as PASS/FAIL columns: verify + profile <= 3 s (median of the cached-baseline evaluations; stated
for ~1 ms kernels), spread <= 2 % (stated for kernels >= 100 µs), ours within 3 % of do_bench; compile
candidate-cold <= 3 s, cached <= 0.3 s.

    TORCH_CUDA_ARCH_LIST=9.0 python scripts/bench_evaluator.py speed          # on the H200 (480 s + the last step)
    python scripts/bench_evaluator.py speed --backend host --quick             # on a CPU machine (small sizes)
    python scripts/bench_evaluator.py speed --backend cuda --dry-run           # no GPU: sources and builds only
Prints each step as it finishes and a table at the end; writes $OUT/bench_evaluator_speed.json when OUT is set.
Exit status 1 when an evaluation failed (a budget skip is not a failure), 2 for --backend cuda without a GPU.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

from evaluator_bench.common import SOLUTIONS, gpu_missing, write_out
from evaluator_bench.kernelbench_form import write_kernelbench
from evaluator_bench.report import Clock, fmt
from evaluator_bench.speed_builds import compile_kernelbench, compile_workspace
from evaluator_bench.speed_cases import DEFAULT_CASES, QUICK_CASES, Case, all_cases, task_sizes, write_variant_task
from evaluator_bench.speed_evaluations import BudgetClock, evaluate_form
from evaluator_bench.speed_report import print_tables
from evaluator_bench.timing import time_outside


def add_arguments(parser) -> None:
    parser.add_argument("--backend", choices=["cuda", "host"], default=None, help="default: cuda when a GPU is visible")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes (softmax_small, softmax_4x); implied on the host backend")
    parser.add_argument("--cases", nargs="*", default=None,
                        help="case names (default: the H200 cases, or the quick ones)")
    parser.add_argument("--evals", type=int, default=5, help="evaluations with cached baselines per case and form")
    parser.add_argument("--budget-s", type=float, default=480.0,
                        help="skip what is left (with a note) past this many seconds")
    parser.add_argument("--dry-run", action="store_true", help="check sources and builds only (no device needed)")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (tasks, generated files, caches)")


def main(args, parser) -> int:
    import torch

    from evaluator_cuda.settings import EvalSettings

    backend = args.backend or ("cuda" if torch.cuda.is_available() else "host")
    if backend == "cuda" and not args.dry_run and gpu_missing("speed --backend cuda", "--dry-run"):
        return 2
    known = all_cases()
    names = args.cases or (QUICK_CASES if args.quick or backend == "host" else DEFAULT_CASES)
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; known: {sorted(known)}")
    clock = BudgetClock(args.budget_s)
    work = Path(tempfile.mkdtemp(prefix="bench_evaluator_speed-"))
    for sub in ("tasks", "kernelbench"):
        (work / sub).mkdir()
    settings = EvalSettings.for_backend(backend, cache_dir=str(work / "cache"))
    set_build_env(settings)
    try:
        if args.dry_run:
            from evaluator_bench.speed_dry_run import dry_run

            return dry_run([known[n] for n in names], backend, settings, work)
        return run(args, [known[n] for n in names], settings, work, clock)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def set_build_env(settings) -> None:
    """Children get these from the evaluator; the compile-time and timing children of `speed` need the same."""
    from evaluator_cuda.extension.torch_build import build_env

    os.environ.update(build_env(settings))
    if settings.backend == "cuda" and not os.environ.get("CUDA_HOME"):
        from evaluator_cuda.extension.fast.toolchain import find_cuda_home

        home = find_cuda_home()  # torch's own guess from a wrapper nvcc on PATH can miss the toolkit's headers
        if home:
            os.environ["CUDA_HOME"] = home


def run(args, cases: list[Case], settings, work: Path, clock: BudgetClock) -> int:
    import torch

    backend = settings.backend
    device = "cuda (named by the first record)" if backend == "cuda" else "cpu"  # no CUDA context in this process
    results = {"backend": backend, "device": device, "torch": torch.__version__, "cpus": os.cpu_count(),
               "budget_s": args.budget_s, "settings": settings.to_dict(),
               "cases": [dataclasses.asdict(c) for c in cases], "compile": [], "evaluations": [], "notes": []}
    clock.say(f"backend {backend} ({device}), cases {[c.name for c in cases]}, budget {args.budget_s:.0f} s, "
              f"work {work}")
    stems = list(dict.fromkeys(c.stem for c in cases))
    kb_paths = {stem: write_kernelbench(stem, backend, work / "kernelbench") for stem in stems}
    built = compile_all(clock, stems, kb_paths, settings, results["compile"])
    for case in cases:
        run_case(args, clock, case, kb_paths, built, settings, work, results)
    results["total_s"] = clock.elapsed()
    print_tables(results)
    print(f"\ntotal {results['total_s']:.0f} s (budget {args.budget_s:.0f} s)")
    write_out("bench_evaluator_speed.json", results)
    return 1 if any(r.get("error") for r in results["evaluations"]) else 0  # a budget skip is not a failure


def compile_all(clock: Clock, stems: list[str], kb_paths: dict, settings, rows: list) -> dict:
    """Both forms of each stem built and timed; {(stem, form): the .so path (workspace) or True (kernelbench)}."""
    built = {}
    for index, stem in enumerate(stems):
        row = compile_workspace(stem, settings.backend, settings, empty_cache=index == 0)
        built[stem, "workspace"] = row.get("so_path")
        rows.append(row)
        clock.say(f"compile {stem} workspace: {row.get('status')} empty cache "
                  f"{fmt(row.get('cold_empty_cache_s'), 2)} s, candidate-cold {fmt(row.get('cold_s'), 2)} s, "
                  f"cached {fmt(row.get('cached_s'), 4)} s, new process "
                  f"{fmt(row.get('cached_new_process_s'), 3)} s {row.get('error', '')}")
        row = compile_kernelbench(stem, kb_paths[stem])
        built[stem, "kernelbench"] = row["status"] == "built"
        rows.append(row)
        clock.say(f"compile {stem} kernelbench (load_inline): {row['status']} cold {fmt(row.get('cold_s'), 2)} s, "
                  f"cached {fmt(row.get('cached_s'), 3)} s, new process {fmt(row.get('cached_new_process_s'), 3)} s")
    return built


def run_case(args, clock: BudgetClock, case: Case, kb_paths: dict, built: dict, settings, work: Path,
             results: dict) -> None:
    """Both forms of one case: evaluations, then the timing child beside them."""
    from evaluator_cuda.solutions import read_solution
    from evaluator_cuda.tasks import load_tasks

    task_path = write_variant_task(case, work / "tasks")
    task = load_tasks(task_path).tasks[0]
    sizes = task_sizes(task_path)
    clock.say(f"case {case.name}: {case.constants}, {sizes['input_bytes'] / 1e6:.0f} MB in + "
              f"{sizes['output_bytes'] / 1e6:.0f} MB out, bandwidth bound {sizes['sol_us']:.1f} µs")
    notes = results["notes"]
    forms = (("workspace", SOLUTIONS / settings.backend / case.stem), ("kernelbench", kb_paths[case.stem]))
    for form, solution_path in forms:
        if clock.remaining() <= 0:
            skipped = f"skipped, the {args.budget_s:.0f} s budget is spent"
            notes.append(f"{case.name} {form}: {skipped}")
            clock.say(notes[-1])
            results["evaluations"].append({"case": case.name, "format": form, "skipped": skipped})
            continue
        if not built.get((case.stem, form)):
            results["evaluations"].append({"case": case.name, "format": form,
                                           "skipped": f"the {form} form did not build", "error": "build"})
            continue
        io_bytes = sizes["input_bytes"] + sizes["output_bytes"]
        solution = read_solution(solution_path)
        row = evaluate_form(clock, case, form, task, solution, settings, args.evals, io_bytes, notes)
        row["sizes"] = sizes
        if (row.get("first") or {}).get("status") and results["device"].startswith("cuda ("):
            results["device"] = row["first"].get("device") or results["device"]
        if row.get("n"):
            so_path = built[case.stem, "workspace"] if form == "workspace" else None
            add_outside_timing(clock, row, task_path, solution_path, so_path, settings, work, notes)
        results["evaluations"].append(row)


def add_outside_timing(clock: Clock, row: dict, task_path: Path, solution_path: Path, so_path: str | None, settings,
                       work: Path, notes: list) -> None:
    """row["measured"]: the timing child's candidate timing (do_bench or perf_counter), and the ratio ours/it."""
    name = f"{row['case']} {row['format']}"
    if clock.remaining() < 20:
        measured = {"error": f"skipped: {clock.remaining():.0f} s of budget left"}
    else:
        spec = {"task": str(task_path), "solution": str(solution_path), "so_path": so_path,
                "fast_cache_dir": str(settings.cache_path() / "fastbuild"), "backend": settings.backend}
        answer = time_outside(spec, work / f"measure_{row['case']}_{row['format']}.json", min(300.0, clock.remaining()))
        measured = answer.get("candidate") or answer
    row["measured"] = measured
    row["ratio"] = row["ours_us"] / measured["median_us"] if measured.get("median_us") else None
    if measured.get("error"):
        notes.append(f"{name}: outside timing: {measured['error'][-200:]}")
    clock.say(f"{name}: ours {fmt(row['ours_us'])} µs (spread {fmt((row['spread'] or 0) * 100, 2)} %), "
              f"{measured.get('tool', 'outside')}: {fmt(measured.get('median_us'))} µs, ratio {fmt(row['ratio'], 3)} "
              f"{measured.get('error', '')[-300:]}")
