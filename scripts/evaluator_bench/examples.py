"""Subcommand `examples`: the evaluator on a GPU, example by example, in one call of well under 9 minutes.

For every example under examples/solutions/cuda (honest and __wrong):
  1. cold compile through evaluator_cuda.extension.build (fresh cache folder, all examples in parallel),
     then the same build again (cache hit);
  2. two evaluations through evaluator_cuda.evaluation.evaluate: the first measures the
     eager/compile baselines (cache miss), the second reuses them (the steady-state wall time);
     verdict, reward, verify and profile wall times, candidate/eager/compile median µs;
  3. for the honest ones, the same three times taken by triton.testing.do_bench (median,
     L2 flushed by do_bench) in a separate process (the timing child), side by side with ours.
With --warm-first the parts every fast build shares are built before the timed cold builds (the cold
build of a workspace on a machine that has them); --builds-only stops after step 1. With --with-pytest, then `pytest -m cuda tests/test_evaluator_*.py` (when pytest is installed).
Prints a table at the end; with $OUT set, writes $OUT/bench_evaluator_examples[_fast].json.
Exit status 0 when every honest example is correct and every __wrong one incorrect (reward -1); 2 without a GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from evaluator_bench.common import REPO, SOLUTIONS, TASKS, gpu_missing, write_out
from evaluator_bench.report import Clock, fmt
from evaluator_bench.timing import time_outside, timed

CUDA_SOLUTIONS = SOLUTIONS / "cuda"


def add_arguments(parser) -> None:
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--with-pytest", action="store_true",
                        help="also run pytest -m cuda on tests/test_evaluator_*.py")
    parser.add_argument("--fast-build", action="store_true",
                        help="build through evaluator_cuda.extension.fast first (settings.fast_build)")
    parser.add_argument("--warm-first", action="store_true",
                        help="build what every fast build shares (binding runtime, headers) before the cold builds")
    parser.add_argument("--builds-only", action="store_true", help="stop after the builds (no evaluations)")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="skip remaining do_bench runs past this many seconds")


def main(args) -> int:
    import torch

    from evaluator_cuda.settings import EvalSettings
    from evaluator_cuda.solutions import read_solution

    clock = Clock(args.budget_s)
    if gpu_missing("examples"):
        return 2
    cache = Path(tempfile.mkdtemp(prefix="cuda-agent-gpu-bench-"))
    settings = EvalSettings.for_backend("cuda", cache_dir=str(cache), fast_build=args.fast_build)
    dirs = sorted(p for p in CUDA_SOLUTIONS.iterdir()
                  if p.is_dir() and (args.only is None or p.name.split("__")[0] in args.only))
    solutions = {p.name: read_solution(p) for p in dirs}
    rows = {name: {"example": name, "task": s.stem} for name, s in solutions.items()}
    warm_s = None
    if args.warm_first:
        clock.say("building what every build shares (binding runtime, precompiled headers) with a throwaway workspace")
        warm_s, warmed = timed(lambda: _throwaway_build(next(iter(solutions.values())), settings))
        clock.say(f"shared parts built in {warm_s:.1f} s ({warmed.status}, {warmed.path} build)")
    clock.say(f"cold builds of {len(solutions)} workspaces in parallel ({torch.cuda.get_device_name()})")
    so_paths = build_all(solutions, settings, rows)
    clock.say("builds done: " + ", ".join(f"{name} {row.get('compile_cold_s')} s ({row.get('build_path')})"
                                          for name, row in rows.items()))
    if not args.builds_only:
        evaluate_all(clock, solutions, settings, rows, so_paths)
    pytest_result = run_pytest(cache) if args.with_pytest else None
    ok = all(expected_verdict(name, row) if not args.builds_only else row.get("build_status") == "built"
             for name, row in rows.items())
    print_table(rows, pytest_result)
    total = clock.elapsed()
    print(f"\nall verdicts as expected: {ok}; total {total:.0f} s")
    write_out(f"bench_evaluator_examples{'_fast' if args.fast_build else ''}.json",
              {"fast_build": args.fast_build, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "rows": rows, "pytest": pytest_result, "total_s": total, "ok": ok, "shared_parts_s": warm_s})
    return 0 if ok else 1


def _throwaway_build(solution, settings):
    """A build of `solution` with a comment added to each source: it pays for the shared parts (the binding
    runtime, the precompiled headers) in the settings' cache, and leaves no cache entry the timed builds hit."""
    from evaluator_cuda.extension.build import build_workspace

    files = {path: (data + b"\n// warm-up build\n" if path.endswith((".cu", ".cpp")) else data)
             for path, data in solution.files.items()}
    return build_workspace(files, settings)


def expected_verdict(name: str, row: dict) -> bool:
    if "__" in name:
        return row.get("status") == "incorrect" and row.get("reward") == -1
    return row.get("status") == "correct"


def build_all(solutions: dict, settings, rows: dict) -> dict:
    """Cold builds in parallel, then each again (a cache hit); the .so path of each example."""
    from evaluator_cuda.extension.build import build_workspace

    with ThreadPoolExecutor(max_workers=len(solutions)) as pool:
        cold = dict(zip(solutions, pool.map(lambda s: build_workspace(s.files, settings), solutions.values())))
    for name, result in cold.items():
        rows[name].update(build_status=result.status, compile_cold_s=round(result.build_seconds, 2),
                          build_path=result.path, fast_fallback=result.fast_fallback,
                          diagnostics=result.diagnostics[:3])
        seconds, again = timed(lambda: build_workspace(solutions[name].files, settings))
        rows[name].update(compile_cached_s=round(seconds, 4), cached_hit=again.cache_hit)
    return {name: result.so_path for name, result in cold.items()}


def evaluate_all(clock: Clock, solutions: dict, settings, rows: dict, so_paths: dict) -> None:
    """Two evaluations per example; do_bench beside them for the honest, correct ones while the budget lasts."""
    from evaluator_cuda.evaluation import evaluate
    from evaluator_cuda.tasks import load_tasks

    tasks = {t.stem: t for t in load_tasks(TASKS).tasks}
    for name, solution in solutions.items():
        first = evaluate(tasks[solution.stem], solution, settings)
        second = evaluate(tasks[solution.stem], solution, settings)
        rows[name].update(summarize(first, second))
        clock.say(f"{name}: {second['status']} reward {second['reward']} ({second['wall_s'].get('total')} s)")
        if "__" in name or second["status"] != "correct":
            continue
        if clock.remaining() < 0:
            rows[name]["do_bench_error"] = f"skipped: past the {clock.budget_s:.0f} s budget"
        else:
            rows[name].update(do_bench(solution.stem, name, so_paths[name], settings))


def summarize(first: dict, second: dict) -> dict:
    """The row's columns from the first (baselines measured) and second (baselines cached) records."""
    times = second["times_us"] if second["status"] == "correct" else first["times_us"]
    candidate = times.get("candidate") or {}
    speedup = second["speedup"] or {}
    return dict(
        status=second["status"], reward=second["reward"], message=second["message"][:200],
        eval_first_s=first["wall_s"].get("total"), eval_cached_s=second["wall_s"].get("total"),
        verify_s=second["wall_s"].get("verify"), profile_s=second["wall_s"].get("profile"),
        baselines_s=first["wall_s"].get("baselines"), baseline_hit_second=second["baseline_cache_hit"],
        ours_us=candidate.get("median_us"), eager_us=(times.get("eager") or {}).get("median_us"),
        compile_us=(times.get("compile") or {}).get("median_us"),
        speedup_eager=speedup.get("eager"), speedup_compile=speedup.get("compile"),
        spread_ours_us=[candidate.get("p25_us"), candidate.get("p75_us")],
    )


def do_bench(stem: str, name: str, so_path: str, settings) -> dict:
    """The do_bench columns of one example, timed by the timing child (or do_bench_error)."""
    spec = {"task": str(TASKS / f"{stem}.py"), "solution": str(CUDA_SOLUTIONS / name), "so_path": so_path,
            "fast_cache_dir": str(settings.cache_path() / "fastbuild"), "backend": "cuda", "baselines": True}
    spec_path = Path(tempfile.mkdtemp(prefix="do-bench-")) / f"{name}.json"
    bench = time_outside(spec, spec_path, timeout=240, env={"CUDA_AGENT_CACHE": str(settings.cache_path())})
    if bench.get("error"):
        return {"do_bench_error": bench["error"][-500:]}
    return {"do_bench_eager_us": bench["eager"]["median_us"], "do_bench_compile_us": bench["compile"]["median_us"],
            "do_bench_ours_us": bench["candidate"]["median_us"]}


def run_pytest(cache: Path) -> dict:
    try:
        import pytest  # noqa: F401
    except ImportError:
        return {"returncode": None, "tail": "pytest not installed here: cuda tests not run"}
    tests = sorted(str(p) for p in (REPO / "tests").glob("test_evaluator_*.py"))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", *tests],
                          capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "CUDA_AGENT_CACHE": str(cache)})
    return {"returncode": done.returncode, "tail": done.stdout[-1500:]}


COLUMNS = [  # (header, width, row key, digits)
    ("verdict", 14, "status", None), ("rw", 3, "reward", None), ("cold s", 7, "compile_cold_s", 1),
    ("hit s", 7, "compile_cached_s", 3), ("eval1 s", 8, "eval_first_s", 1), ("eval2 s", 8, "eval_cached_s", 1),
    ("verify", 7, "verify_s", 2), ("prof", 6, "profile_s", 2), ("|", 1, None, None),
    ("ours", 9, "ours_us", 1), ("eager", 9, "eager_us", 1), ("compile", 9, "compile_us", 1), ("|", 1, None, None),
    ("db ours", 9, "do_bench_ours_us", 1), ("db eager", 9, "do_bench_eager_us", 1),
    ("db comp", 9, "do_bench_compile_us", 1),
]


def print_table(rows: dict, pytest_result: dict | None) -> None:
    cell = lambda text, width: f"{text:{width}}" if width == 14 else f"{text:>{width}}"  # noqa: E731
    print("\n" + f"{'example':26} " + " ".join(cell(h, w) for h, w, _, _ in COLUMNS) + "  (µs)")
    for name, row in rows.items():
        values = ("|" if key is None else fmt(row.get(key), digits) for _, _, key, digits in COLUMNS)
        print(f"{name:26} " + " ".join(cell(v, w) for v, (_, w, _, _) in zip(values, COLUMNS)))
    if pytest_result:
        tail = pytest_result["tail"].strip()
        print("\npytest -m cuda:", tail.splitlines()[-1] if tail else pytest_result)
