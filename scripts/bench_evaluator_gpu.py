#!/usr/bin/env python
"""Figures of the evaluator on a GPU, in one call of well under 9 minutes.

    python scripts/bench_evaluator_gpu.py [--only STEM ...] [--fast-build] [--with-pytest] [--budget-s 420]

For every example under examples/solutions/cuda (honest and __wrong):
  1. cold compile through evaluator_cuda.extension.build (fresh cache folder, all examples in parallel),
     then the same build again (cache hit);
  2. two evaluations through evaluator_cuda.evaluation.evaluate: the first measures the
     eager/compile baselines (cache miss), the second reuses them (the steady-state wall time);
     verdict, reward, verify and profile wall times, candidate/eager/compile median µs;
  3. for the honest ones, the same three times taken by triton.testing.do_bench (median,
     L2 flushed by do_bench) in a separate process, side by side with ours.
With --with-pytest, then `pytest -m cuda tests/test_evaluator_*.py` (when pytest is installed).
Prints a table at the end; with $OUT set, writes $OUT/bench_evaluator_gpu.json.
Exit status 0 when every honest example is correct and every __wrong one incorrect (reward -1).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# The evaluator's children run `python -m evaluator_cuda.roles.child`: they need the checkout on PYTHONPATH too.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
TASKS = REPO / "examples" / "tasks"
SOLUTIONS = REPO / "examples" / "solutions" / "cuda"


def do_bench_child(task_path: str, solution_dir: str, so_path: str, out_path: str) -> None:
    """Runs in its own process: time eager, torch.compile and the candidate with triton's do_bench."""
    import torch
    import triton.testing

    from _bench_common import load_model_new, load_task
    from evaluator_cuda.settings import cache_root

    namespace = load_task(task_path)
    model_new = load_model_new(solution_dir, so_path, str(cache_root() / "fastbuild"))  # CUDA_AGENT_CACHE is set by the parent
    torch.manual_seed(0)
    init = namespace["get_init_inputs"]()
    model = namespace["Model"](*init).eval().cuda()
    candidate = model_new(*init).eval().cuda()
    candidate.load_state_dict(model.state_dict())
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in namespace["get_inputs"]()]
    compiled = torch.compile(model)
    result = {}
    with torch.no_grad():
        for name, fn in (("eager", model), ("compile", compiled), ("candidate", candidate)):
            fn(*inputs)
            torch.cuda.synchronize()
            q = triton.testing.do_bench(lambda: fn(*inputs), warmup=25, rep=100, quantiles=[0.5, 0.2, 0.8])
            result[name] = {"median_us": q[0] * 1000.0, "p20_us": q[1] * 1000.0, "p80_us": q[2] * 1000.0}
    Path(out_path).write_text(json.dumps(result))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--with-pytest", action="store_true", help="also run pytest -m cuda on tests/test_evaluator_*.py")
    parser.add_argument("--fast-build", action="store_true", help="build through evaluator_cuda.extension.fast first (settings.fast_build)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="skip remaining do_bench runs past this many seconds")
    parser.add_argument("--do-bench", nargs=4, metavar=("TASK", "SOLUTION", "SO", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.do_bench:
        do_bench_child(*args.do_bench)
        return 0

    import torch

    from evaluator_cuda.extension.build import build_workspace
    from evaluator_cuda.evaluation import evaluate
    from evaluator_cuda.settings import EvalSettings
    from evaluator_cuda.solutions import read_solution
    from evaluator_cuda.tasks import load_tasks

    begin = time.perf_counter()
    if not torch.cuda.is_available():
        print("no GPU visible: this script is for the H200", file=sys.stderr)
        return 2
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    cache = Path(tempfile.mkdtemp(prefix="cuda-agent-gpu-bench-"))
    settings = EvalSettings.for_backend("cuda", cache_dir=str(cache), fast_build=args.fast_build)
    dirs = sorted(p for p in SOLUTIONS.iterdir() if p.is_dir() and (args.only is None or p.name.split("__")[0] in args.only))
    solutions = {p.name: read_solution(p) for p in dirs}
    tasks = {t.stem: t for t in load_tasks(TASKS).tasks}
    rows = {name: {"example": name, "task": s.stem} for name, s in solutions.items()}

    print(f"[{time.perf_counter() - begin:6.1f}s] cold builds of {len(solutions)} workspaces in parallel ({torch.cuda.get_device_name()})", flush=True)
    with ThreadPoolExecutor(max_workers=len(solutions)) as pool:
        cold = dict(zip(solutions, pool.map(lambda s: build_workspace(s.files, settings), solutions.values())))
    for name, result in cold.items():
        rows[name].update(build_status=result.status, compile_cold_s=round(result.build_seconds, 2), diagnostics=result.diagnostics[:3])
        again_begin = time.perf_counter()
        again = build_workspace(solutions[name].files, settings)
        rows[name].update(compile_cached_s=round(time.perf_counter() - again_begin, 4), cached_hit=again.cache_hit)
    print(f"[{time.perf_counter() - begin:6.1f}s] builds done", flush=True)

    for name, solution in solutions.items():
        task = tasks[solution.stem]
        first = evaluate(task, solution, settings)
        second = evaluate(task, solution, settings)
        times = second["times_us"] if second["status"] == "correct" else first["times_us"]
        med = lambda key: (times.get(key) or {}).get("median_us")  # noqa: E731
        rows[name].update(
            status=second["status"], reward=second["reward"], message=second["message"][:200],
            eval_first_s=first["wall_s"].get("total"), eval_cached_s=second["wall_s"].get("total"),
            verify_s=second["wall_s"].get("verify"), profile_s=second["wall_s"].get("profile"),
            baselines_s=first["wall_s"].get("baselines"), baseline_hit_second=second["baseline_cache_hit"],
            ours_us=med("candidate"), eager_us=med("eager"), compile_us=med("compile"),
            speedup_eager=(second["speedup"] or {}).get("eager"), speedup_compile=(second["speedup"] or {}).get("compile"),
            spread_ours_us=[(times.get("candidate") or {}).get("p25_us"), (times.get("candidate") or {}).get("p75_us")],
        )
        print(f"[{time.perf_counter() - begin:6.1f}s] {name}: {second['status']} reward {second['reward']} ({second['wall_s'].get('total')} s)", flush=True)
        if "__" not in name and second["status"] == "correct" and time.perf_counter() - begin > args.budget_s:
            rows[name]["do_bench_error"] = f"skipped: past the {args.budget_s:.0f} s budget"
        elif "__" not in name and second["status"] == "correct":
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
                target = handle.name
            done = subprocess.run([sys.executable, __file__, "--do-bench", str(TASKS / f"{solution.stem}.py"), str(SOLUTIONS / name), cold[name].so_path, target],
                                  capture_output=True, text=True, timeout=240, env={**os.environ, "CUDA_AGENT_CACHE": str(cache)})
            if done.returncode == 0:
                bench = json.loads(Path(target).read_text())
                rows[name].update(do_bench_eager_us=bench["eager"]["median_us"], do_bench_compile_us=bench["compile"]["median_us"], do_bench_ours_us=bench["candidate"]["median_us"])
            else:
                rows[name]["do_bench_error"] = (done.stderr or done.stdout)[-500:]

    pytest_result = None
    if args.with_pytest:
        try:
            import pytest  # noqa: F401

            done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider"] + sorted(str(p) for p in (REPO / "tests").glob("test_evaluator_*.py")),
                                  capture_output=True, text=True, cwd=REPO, timeout=300,
                                  env={**os.environ, "CUDA_AGENT_CACHE": str(cache)})
            pytest_result = {"returncode": done.returncode, "tail": done.stdout[-1500:]}
        except ImportError:
            pytest_result = {"returncode": None, "tail": "pytest not installed here: cuda tests not run"}

    ok = all((r.get("status") == "correct") if "__" not in n else (r.get("status") == "incorrect" and r.get("reward") == -1) for n, r in rows.items())
    fmt = lambda v, f="{:.1f}": "-" if v is None else f.format(v)  # noqa: E731
    header = f"{'example':26} {'verdict':14} {'rw':>3} {'cold s':>7} {'hit s':>7} {'eval1 s':>8} {'eval2 s':>8} {'verify':>7} {'prof':>6} | {'ours':>9} {'eager':>9} {'compile':>9} | {'db ours':>9} {'db eager':>9} {'db comp':>9}  (µs)"
    print("\n" + header)
    for name, r in rows.items():
        print(f"{name:26} {str(r.get('status')):14} {fmt(r.get('reward'), '{}'):>3} {fmt(r.get('compile_cold_s')):>7} {fmt(r.get('compile_cached_s'), '{:.3f}'):>7} "
              f"{fmt(r.get('eval_first_s')):>8} {fmt(r.get('eval_cached_s')):>8} {fmt(r.get('verify_s'), '{:.2f}'):>7} {fmt(r.get('profile_s'), '{:.2f}'):>6} | "
              f"{fmt(r.get('ours_us')):>9} {fmt(r.get('eager_us')):>9} {fmt(r.get('compile_us')):>9} | {fmt(r.get('do_bench_ours_us')):>9} {fmt(r.get('do_bench_eager_us')):>9} {fmt(r.get('do_bench_compile_us')):>9}")
    if pytest_result:
        print("\npytest -m cuda:", pytest_result["tail"].strip().splitlines()[-1] if pytest_result["tail"].strip() else pytest_result)
    total = time.perf_counter() - begin
    print(f"\nall verdicts as expected: {ok}; total {total:.0f} s")
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"bench_evaluator_gpu{'_fast' if args.fast_build else ''}.json").write_text(json.dumps({"fast_build": args.fast_build, "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows, "pytest": pytest_result, "total_s": total, "ok": ok}, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
