#!/usr/bin/env python
"""Check and time the CUDA example solutions on a GPU (run on the H200; one call, < 8 minutes).

    python scripts/check_examples_gpu.py [--skip-evaluator | --evaluator-only] [--only NAME ...] [--budget-s 450]

Phase 1 builds every examples/solutions/cuda/<name>/ workspace the way the harness does
(templates/binding.cpp + kernels/*.cu + kernels/*_binding.cpp -> module `cuda_extension`), all in
parallel, each in its own child process and fresh build folder (cold build time).
Phase 2, one solution at a time in a child process: reloads the build (cached time), checks the
candidate against the task's Model on 5 random input sets (assert_close, atol = rtol = 1e-2),
and for the honest solutions times Model eager, torch.compile(Model) and ModelNew with
triton.testing.do_bench (L2 flushed before each call; median and 20/80 % quantiles, in us).
Phase 3 (unless --skip-evaluator): builds each solution with evaluator_cuda.service.compile_job (in
parallel), then runs evaluate_job with that artifact, one at a time, and records the evaluator's
verdict, its own times, reward and wall times, for comparison with do_bench. No new evaluation
starts after --budget-s seconds (so one call stays under the device tool's limit).

Prints a table at the end; with $OUT set, writes $OUT/check_examples_gpu.json.
Exit status: 0 when every honest solution is correct and every __wrong one incorrect.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TASKS = REPO / "examples" / "tasks"
SOLUTIONS = REPO / "examples" / "solutions" / "cuda"
TEMPLATES = REPO / "evaluator_cuda" / "templates"
CHECKS = 5
TOLERANCE = 1e-2
MARGIN = 0.05  # reference.md §6: "more than 5% faster"
ARCH_LIST = "9.0"


def task_path(solution: Path) -> Path:
    return TASKS / f"{solution.name.split('__')[0]}.py"


def is_wrong(solution: Path) -> bool:
    return "__" in solution.name


# ------------------------------------------------------------------------- child side


def _sources(solution: Path) -> list[str]:
    kernels = solution / "kernels"
    return [str(TEMPLATES / "binding.cpp"), *map(str, sorted(kernels.glob("*.cu"))),
            *map(str, sorted(kernels.glob("*_binding.cpp")))]


def _load_extension(solution: Path, build_dir: Path):
    from torch.utils.cpp_extension import load

    module = load(
        name="cuda_extension",
        sources=_sources(solution),
        extra_include_paths=[str(TEMPLATES)],
        extra_cflags=["-O3"],
        extra_cuda_cflags=["-O3", "--use_fast_math"],
        build_directory=str(build_dir),
        verbose=False,
    )
    sys.modules["cuda_extension"] = module
    return module


def _import_file(path: Path, name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def child_build(solution: Path, build_dir: Path) -> dict:
    start = time.perf_counter()
    _load_extension(solution, build_dir)
    return {"build_cold_s": time.perf_counter() - start}


def _bench_us(fn) -> dict:
    import triton.testing

    median, low, high = triton.testing.do_bench(fn, warmup=25, rep=200, quantiles=[0.5, 0.2, 0.8])
    return {"median_us": median * 1e3, "p20_us": low * 1e3, "p80_us": high * 1e3}


def child_check(solution: Path, build_dir: Path, time_it: bool) -> dict:
    import torch

    start = time.perf_counter()
    _load_extension(solution, build_dir)
    report = {"build_cached_s": time.perf_counter() - start}
    task = _import_file(task_path(solution), "example_task")
    candidate = _import_file(solution / "model_new.py", "example_model_new")
    device = torch.device("cuda")
    torch.manual_seed(0)
    reference = task.Model(*task.get_init_inputs()).to(device).eval()
    model_new = candidate.ModelNew(*task.get_init_inputs()).to(device).eval()
    model_new.load_state_dict(reference.state_dict(), strict=True)

    mismatches = []
    start = time.perf_counter()
    with torch.no_grad():
        for check in range(CHECKS):
            torch.manual_seed(1000 + check)
            inputs = [t.to(device) for t in task.get_inputs()]
            expected = reference(*inputs)
            got = model_new(*[t.clone() for t in inputs])
            torch.cuda.synchronize()
            try:
                torch.testing.assert_close(got, expected, atol=TOLERANCE, rtol=TOLERANCE)
            except AssertionError as exc:
                first_lines = " ".join(str(exc).split("\n")[:3])
                mismatches.append({"check": check, "message": first_lines[:300]})
    report["verify_s"] = time.perf_counter() - start
    report["correct"] = not mismatches
    report["mismatches"] = mismatches
    if not time_it:
        return report

    torch.manual_seed(2000)
    inputs = [t.to(device) for t in task.get_inputs()]
    compiled = torch.compile(reference)
    with torch.no_grad():
        start = time.perf_counter()
        compiled(*inputs)
        torch.cuda.synchronize()
        report["compile_first_call_s"] = time.perf_counter() - start
        report["eager"] = _bench_us(lambda: reference(*inputs))
        report["compile"] = _bench_us(lambda: compiled(*inputs))
        report["candidate"] = _bench_us(lambda: model_new(*inputs))
    return report


def child_main(argv: list[str]) -> None:
    mode, solution, build_dir = argv[0], Path(argv[1]), Path(argv[2])
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", ARCH_LIST)
    if mode == "build":
        report = child_build(solution, build_dir)
    else:
        report = child_check(solution, build_dir, time_it=(mode == "check+time"))
    print("REPORT " + json.dumps(report), flush=True)


# ------------------------------------------------------------------------- parent side


def run_child(mode: str, solution: Path, build_dir: Path, timeout: float) -> dict:
    env = {**os.environ, "TORCH_CUDA_ARCH_LIST": os.environ.get("TORCH_CUDA_ARCH_LIST", ARCH_LIST), "MAX_JOBS": "4"}
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", mode, str(solution), str(build_dir)],
                              capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"{mode}: timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - start
    lines = [line[7:] for line in proc.stdout.splitlines() if line.startswith("REPORT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
        return {"error": f"{mode}: child exited {proc.returncode}: " + " | ".join(tail)[-1200:], "wall_s": wall}
    return {**json.loads(lines[-1]), f"{mode}_wall_s": wall}


def milestone_reward(correct: bool, t: float, t_eager: float, t_compile: float) -> int:
    """reference.md §6, kept here so the script has no project imports beyond the examples."""
    if not correct:
        return -1
    beats = lambda base: (base - t) / base > MARGIN  # noqa: E731
    if beats(t_eager) and beats(t_compile):
        return 3
    if beats(t_eager):
        return 2
    return 1


def _evaluator_job(solution: Path) -> dict:
    files = {str(p.relative_to(solution)): p.read_bytes() for p in sorted(solution.rglob("*")) if p.is_file()}
    return {"task": {"name": task_path(solution).stem, "source": task_path(solution).read_text()},
            "solution": {"format": "workspace", "files": files},
            "settings": {"backend": "cuda"}}


def evaluator_pass(solutions: list[Path], deadline: float) -> dict[str, dict]:
    """Each solution through the project's evaluator (service API): builds in parallel, then one
    evaluation at a time with the prebuilt artifact. Stops starting evaluations after `deadline`."""
    try:
        sys.path.insert(0, str(REPO))
        from evaluator_cuda.service import compile_job, evaluate_job
    except Exception as exc:  # the evaluator is optional for this script
        return {"_error": {"error": f"evaluator not importable: {type(exc).__name__}: {exc}"}}
    jobs = {s.name: _evaluator_job(s) for s in solutions}

    def build(name: str) -> tuple[str, dict, float]:
        start = time.perf_counter()
        try:
            return name, compile_job(jobs[name]), time.perf_counter() - start
        except Exception as exc:
            return name, {"status": "infra_error", "diagnostics": [{"message": f"{type(exc).__name__}: {exc}"}]}, 0.0

    with ThreadPoolExecutor(max_workers=min(8, len(solutions))) as pool:
        built = {name: (rep, sec) for name, rep, sec in pool.map(build, jobs)}
    results = {}
    for solution in solutions:
        compiled, build_wall = built[solution.name]
        entry = {"build_status": compiled.get("status"), "build_seconds": compiled.get("build_seconds"),
                 "build_wall_s": build_wall}
        if time.perf_counter() > deadline:
            results[solution.name] = {**entry, "error": "skipped: time budget spent"}
            continue
        job = dict(jobs[solution.name])
        if compiled.get("status") == "built" and compiled.get("artifact"):
            job["artifact"] = compiled["artifact"]
        start = time.perf_counter()
        try:
            record = evaluate_job(job)
        except Exception as exc:
            results[solution.name] = {**entry, "error": f"{type(exc).__name__}: {exc}"}
            continue
        results[solution.name] = {**entry, "wall_s": time.perf_counter() - start, "record": record}
        print(f"  evaluator {solution.name}: {record.get('status')} reward={record.get('reward')} "
              f"({time.perf_counter() - start:.1f} s)", flush=True)
    return results


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: list[dict]) -> None:
    header = ["solution", "expect", "verdict", "build s", "cached s", "verify s", "eager us", "compile us",
              "ours us", "x eager", "x compile", "reward", "evaluator: status reward ours/eager/compile us, wall"]
    table = [header]
    for r in rows:
        ev = r.get("evaluator") or {}
        rec = ev.get("record") or {}
        times = rec.get("times_us") if isinstance(rec.get("times_us"), dict) else {}
        median = lambda key: (times.get(key) or {}).get("median_us")  # noqa: E731
        if not ev:
            ev_text = "-"
        elif "error" in ev:
            ev_text = ev["error"][:60]
        else:
            ev_text = (f"{rec.get('status')} r={rec.get('reward')} {_fmt(median('candidate'), '.1f')}/"
                       f"{_fmt(median('eager'), '.1f')}/{_fmt(median('compile'), '.1f')} us, {_fmt(ev.get('wall_s'), '.1f')} s")
        table.append([
            r["solution"], r["expect"], r.get("verdict", "?"), _fmt(r.get("build_cold_s"), ".1f"),
            _fmt(r.get("build_cached_s"), ".2f"), _fmt(r.get("verify_s"), ".2f"),
            _fmt(r.get("eager_us"), ".1f"), _fmt(r.get("compile_us"), ".1f"), _fmt(r.get("candidate_us"), ".1f"),
            _fmt(r.get("speedup_eager"), ".2f"), _fmt(r.get("speedup_compile"), ".2f"), _fmt(r.get("reward"), "d"),
            ev_text,
        ])
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    for i, row in enumerate(table):
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--skip-evaluator", action="store_true", help="skip phase 3 (the project's evaluator)")
    parser.add_argument("--evaluator-only", action="store_true", help="run phase 3 only")
    parser.add_argument("--budget-s", type=float, default=450.0,
                        help="start no new evaluator run after this many seconds (default 450)")
    parser.add_argument("--only", nargs="*", default=None, help="solution names to run (default: all)")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("check_examples_gpu: no CUDA GPU visible; run this on the GPU machine", file=sys.stderr)
        return 2
    solutions = sorted(p for p in SOLUTIONS.iterdir() if p.is_dir())
    if args.only:
        solutions = [p for p in solutions if p.name in set(args.only)]
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="examples-gpu-"))
    builds = {s.name: root / s.name for s in solutions}

    if args.evaluator_only:
        built = {s.name: {"error": "not run (--evaluator-only)"} for s in solutions}
    else:
        print(f"phase 1: building {len(solutions)} solutions in parallel under {root}", flush=True)
        with ThreadPoolExecutor(max_workers=min(8, len(solutions))) as pool:
            built = dict(zip([s.name for s in solutions],
                             pool.map(lambda s: run_child("build", s, builds[s.name], 400), solutions)))
    for name, rep in built.items():
        print(f"  {name}: " + (rep["error"] if "error" in rep else f"built in {rep['build_cold_s']:.1f} s"), flush=True)

    print("phase 2: verify (5 input sets) and time with triton.testing.do_bench", flush=True)
    rows = []
    for solution in solutions:
        row = {"solution": solution.name, "expect": "incorrect" if is_wrong(solution) else "correct"}
        if args.evaluator_only:
            rows.append(row)
            continue
        row.update({k: v for k, v in built[solution.name].items() if k != "error"})
        if "error" in built[solution.name]:
            row.update(verdict="compile_error", error=built[solution.name]["error"])
            rows.append(row)
            continue
        mode = "check" if is_wrong(solution) else "check+time"
        rep = run_child(mode, solution, builds[solution.name], 300)
        if "error" in rep:
            row.update(verdict="runtime_error", error=rep["error"])
        else:
            row.update({k: v for k, v in rep.items() if k not in ("eager", "compile", "candidate")})
            row["verdict"] = "correct" if rep["correct"] else "incorrect"
            for key in ("eager", "compile", "candidate"):
                if key in rep:
                    row[f"{key}_us"] = rep[key]["median_us"]
                    row[f"{key}_quantiles_us"] = [rep[key]["p20_us"], rep[key]["p80_us"]]
            if "candidate_us" in row:
                row["speedup_eager"] = row["eager_us"] / row["candidate_us"]
                row["speedup_compile"] = row["compile_us"] / row["candidate_us"]
                row["reward"] = milestone_reward(rep["correct"], row["candidate_us"], row["eager_us"], row["compile_us"])
            elif not rep["correct"]:
                row["reward"] = -1
        print(f"  {solution.name}: {row['verdict']}" + (f" ({row['error']})" if "error" in row else ""), flush=True)
        rows.append(row)

    if not args.skip_evaluator:
        print("phase 3: the project's evaluator (evaluator_cuda.service.evaluate_job)", flush=True)
        evaluated = evaluator_pass(solutions, started + args.budget_s)
        if "_error" in evaluated:
            print("  " + evaluated["_error"]["error"], flush=True)
        for row in rows:
            row["evaluator"] = evaluated.get(row["solution"]) or evaluated.get("_error")

    total = time.perf_counter() - started
    if args.evaluator_only:  # the evaluator's verdicts decide
        for row in rows:
            record = (row.get("evaluator") or {}).get("record") or {}
            row["verdict"] = record.get("status", "?")
            row["reward"] = record.get("reward")
    ok = all(r.get("verdict") == r["expect"] for r in rows)
    print()
    print(f"device: {torch.cuda.get_device_name(0)}  torch {torch.__version__}  python {platform.python_version()}  "
          f"total {total:.0f} s  all as expected: {ok}")
    print_table(rows)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                  "python": platform.python_version(), "total_s": total, "all_as_expected": ok, "rows": rows}
        path = Path(out) / "check_examples_gpu.json"
        path.write_text(json.dumps(report, indent=2, default=str))
        print(f"wrote {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
    else:
        sys.exit(main())
