"""`speed --dry-run`: the variant tasks, the generated load_inline file (static checks, nvcc/g++ compile of the
sources load_inline writes) and the workspace fast build, checked without a device; nothing is run."""

from __future__ import annotations

from pathlib import Path

from evaluator_bench.common import SOLUTIONS, load_task
from evaluator_bench.kernelbench_form import dry_run_kernelbench_cuda, write_kernelbench
from evaluator_bench.report import Clock, fmt
from evaluator_bench.speed_builds import compile_kernelbench, compile_workspace
from evaluator_bench.speed_cases import Case, task_sizes, write_variant_task


def dry_run(cases: list[Case], backend: str, settings, work: Path) -> int:
    clock = Clock()
    print(f"dry run ({backend}): nothing is run on a device; work folder {work}", flush=True)
    ok = all([check_task(case, work) for case in cases])
    for index, stem in enumerate(sorted({c.stem for c in cases})):
        ok &= check_stem(stem, backend, settings, work, empty_cache=index == 0)
    print(f"dry run {'OK' if ok else 'FAILED'} in {clock.elapsed():.0f} s", flush=True)
    return 0 if ok else 1


def check_task(case: Case, work: Path) -> bool:
    """The variant task loads as one task with the rewritten constant."""
    from evaluator_cuda.tasks import load_tasks

    path = write_variant_task(case, work / "tasks")
    loaded = load_tasks(path)
    sizes = task_sizes(path)
    name, value = next(iter(case.constants.items()))
    good = not loaded.problems and len(loaded.tasks) == 1 and load_task(path)[name] == value
    print(f"  task {case.name:14} {'ok' if good else 'BAD'}  {case.constants}  inputs {sizes['input_shapes']} -> "
          f"{sizes['output_shape']}  {sizes['input_bytes'] / 1e6:.0f} MB in, {sizes['output_bytes'] / 1e6:.0f} MB out; "
          f"bandwidth bound {sizes['sol_us']:.0f} µs (target {case.target_us} µs)", flush=True)
    return good


def check_stem(stem: str, backend: str, settings, work: Path, empty_cache: bool) -> bool:
    """The KernelBench file's format and static checks, the workspace fast build, the file's sources compiled."""
    from evaluator_cuda.isolation.static_checks import check_solution_sources
    from evaluator_cuda.solutions import read_solution

    kb_path = write_kernelbench(stem, backend, work / "kernelbench")
    kb = read_solution(kb_path)
    workspace = read_solution(SOLUTIONS / backend / stem)
    findings = check_solution_sources(kb.files) + check_solution_sources(workspace.files)
    ok = kb.format == "kernelbench" and not findings
    print(f"  {stem}: kernelbench file {kb_path} format {kb.format}, static checks "
          f"{'clean (workspace and file)' if not findings else [f.message for f in findings]}", flush=True)
    row = compile_workspace(stem, backend, settings, empty_cache=empty_cache)
    ok &= row.get("status") == "built"
    print(f"  {stem}: workspace fast build ({backend}, arch {settings.arch_list}): {row.get('status')} "
          "cold(empty cache) "
          f"{fmt(row.get('cold_empty_cache_s'), 1)} s, candidate-cold {fmt(row.get('cold_s'), 2)} s, cached "
          f"{fmt(row.get('cached_s'), 4)} s, new process {fmt(row.get('cached_new_process_s'), 3)} s "
          f"{row.get('error', '')}", flush=True)
    return ok & (compile_cuda_file(stem, kb_path, settings) if backend == "cuda" else build_host_file(stem, kb_path))


def compile_cuda_file(stem: str, kb_path: Path, settings) -> bool:
    result = dry_run_kernelbench_cuda(kb_path, settings)
    units = ", ".join(f"{n} {'ok' if u['ok'] else 'FAILED'} {u['seconds']} s" for n, u in result["units"].items())
    print(f"  {stem}: kernelbench sources as load_inline writes them ({result['name']}): {units}; launchers "
          f"{result.get('launchers')} defined in cuda.cu: {result.get('launchers_defined')}"
          + (f" ({result['note']})" if result.get("note") else ""), flush=True)
    for name, unit in result["units"].items():
        if not unit["ok"]:
            print(f"    {name}: {unit['log']}")
    return result["ok"]


def build_host_file(stem: str, kb_path: Path) -> bool:
    row = compile_kernelbench(stem, kb_path)
    print(f"  {stem}: kernelbench load_inline (host): {row['status']} cold {fmt(row.get('cold_s'), 1)} s", flush=True)
    return row["status"] == "built"
