"""`cuda-agent bench TASKS [--solutions DIR]`: evaluate a task set and report it KernelBench-style.

With no solutions the reference itself is the candidate (a harness self-check: every task
should come out correct with speed-ups near 1x). Extra candidates `<stem>__<variant>` get
rows of their own but do not enter the summary, which counts one candidate per task.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from ..settings import EvalSettings
from ..solutions import SolutionError, discover_solutions, read_solution, reference_solution
from ..tasks import load_tasks
from ..verdict.record import finish, new_record


@dataclasses.dataclass
class BenchResult:
    records: list[dict]
    main_records: list[dict]
    metrics: dict
    problems: list[str]
    paths: dict
    wall_s: float
    refused: list[dict] = dataclasses.field(default_factory=list)  # one row per refused task, with its reason


def plan_candidates(tasks, solutions_dir: Path | None, backend: str) -> list[tuple]:
    """[(task, path-or-None, is_main)]: the evaluations to run, main candidate first per task."""
    plan = []
    found = discover_solutions(solutions_dir, backend) if solutions_dir else {}
    for task in tasks:
        if solutions_dir is None:
            plan.append((task, None, True))
            continue
        paths = found.get(task.stem, [])
        if not paths:
            plan.append((task, "missing", True))
        for i, path in enumerate(paths):
            plan.append((task, path, i == 0 and "__" not in path.name))
    return plan


def _one_line_result(done: int, total: int, record: dict) -> str:
    """What a finished evaluation printed as it ends (logs and pipes see progress too)."""
    speedup = record.get("speedup", {}).get("eager")
    extra = f", {speedup:.2f}x eager" if isinstance(speedup, (int, float)) else ""
    message = f": {record['message'][:100]}" if record["status"] != "correct" and record.get("message") else ""
    return (f"[{done}/{total}] {record['candidate']}: {record['status']}, reward {record['reward']}{extra} "
            f"({record['wall_s']['total']:.1f} s){message}")


def refused_record(task_name: str, reason: str) -> dict:
    """A row for a task the benchmark refused (malformed, or a degenerate reference): shown, never scored."""
    return {"task": task_name, "candidate": task_name, "status": "task_error", "reward": None, "message": reason,
            "times_us": {}, "speedup": {}}


def _refusal(task_name: str, message: str) -> tuple[str, dict]:
    """The problem line and the refused row of a task, from a task_error message."""
    reason = message.removeprefix(f"task {task_name}: ")
    return f"task {task_name}: {reason}", refused_record(task_name, reason)


def run_bench(tasks_path: str | Path, solutions_dir: str | Path | None, settings: EvalSettings, out_dir: Path,
              console=None) -> BenchResult:
    from .metrics import bench_metrics
    from .report import print_tables, write_reports

    if console is None:
        console = _console()
    begin = time.perf_counter()
    task_set = load_tasks(tasks_path)
    refused = [_refusal(p.task_name, p.problem)[1] for p in task_set.problems]
    problems = [str(p) for p in task_set.problems]
    for line in problems:
        console.print(f"[red]{line}[/red]", highlight=False)
    solutions_path = Path(solutions_dir) if solutions_dir else None
    plan = plan_candidates(task_set.tasks, solutions_path, settings.backend)
    records, main_records = _evaluate_plan(plan, solutions_path, settings, console, problems, refused)
    metrics = bench_metrics(main_records)
    metrics["refused"] = len(refused)
    meta = _report_meta(tasks_path, solutions_dir, settings, records, time.perf_counter() - begin)
    shown = records + refused
    print_tables(console, shown, metrics)
    paths = write_reports(out_dir, shown, main_records + refused, metrics, meta, problems)
    console.print(f"reports: {paths['json']}  {paths['markdown']}" + (f"  {paths['plot']}" if paths["plot"] else ""),
                  highlight=False)
    return BenchResult(records, main_records, metrics, problems, paths, time.perf_counter() - begin, refused)


def _evaluate_plan(plan, solutions_path, settings, console, problems: list, refused: list) -> tuple[list, list]:
    """Run the planned evaluations with a progress bar that names the task and its current step."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..evaluation import children_kept_warm
    from ..progress import listening

    records, main_records, bad_tasks, refreshed = [], [], set(), set()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    # With more than one evaluation, each next one's children start warming while the last ends.
    with children_kept_warm(len(plan) > 1), Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task("evaluating", total=len(plan))
        current = {"task": ""}
        def show(step: str) -> None:
            progress.update(bar, description=f"{current['task']}: {step}")

        with listening(show):
            for task, path, is_main in plan:
                if task.name in bad_tasks:
                    progress.advance(bar)
                    continue
                current["task"] = task.name
                show("starting")
                record = _record_of(task, path, solutions_path, _refresh_once(settings, task.name, refreshed))
                if (record.get("wall_s") or {}).get("baselines") is not None:
                    refreshed.add(task.name)  # a later candidate of this task reads what was measured now
                progress.advance(bar)
                if record["status"] == "task_error":
                    bad_tasks.add(task.name)
                    line, row = _refusal(task.name, record["message"])
                    problems.append(line)
                    refused.append(row)
                    progress.console.print(f"[red]{line}[/red]", highlight=False)
                    continue
                records.append(record)
                progress.console.print(_one_line_result(len(records) + len(bad_tasks), len(plan), record),
                                       highlight=False, markup=False)
                if is_main:
                    main_records.append(record)
        progress.update(bar, description="done")
    return records, main_records


def _refresh_once(settings: EvalSettings, task_name: str, refreshed: set) -> EvalSettings:
    """--refresh-baselines measures a task's baselines anew once per run, not for each of its candidates."""
    if settings.refresh_baselines and task_name in refreshed:
        return dataclasses.replace(settings, refresh_baselines=False)
    return settings


def _console():
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # logs and pipes: do not squeeze the table to 80 columns
    return console


def _record_of(task, path, solutions_path: Path | None, settings: EvalSettings) -> dict:
    """The record of one planned evaluation: the reference as the candidate (path None), a missing
    or unreadable solution (compile_error), or the solution's evaluation."""
    from ..evaluation import evaluate

    if path is None:
        return evaluate(task, reference_solution(task.stem), settings)
    if path == "missing":
        return finish(new_record(task.name, task.stem, "none", settings), "compile_error",
                      f"no solution for task {task.name} in {solutions_path}")
    try:
        solution = read_solution(path)
    except SolutionError as exc:
        return finish(new_record(task.name, path.name, "?", settings), "compile_error", str(exc))
    return evaluate(task, solution, settings)


def _report_meta(tasks_path, solutions_dir, settings: EvalSettings, records: list[dict], wall_s: float) -> dict:
    device = next((r.get("device") for r in records if r.get("device")), None)
    versions = next((r["versions"] for r in records if (r.get("versions") or {}).get("torch")), None)
    return {
        "tasks_path": str(tasks_path),
        "solutions": str(solutions_dir) if solutions_dir else None,
        "backend": settings.backend,
        "device": device or _this_device(settings),
        "torch": (versions or {}).get("torch") or _torch_version(),
        "versions": versions or _versions(),
        "settings": settings.to_dict(),
        "wall_s": round(wall_s, 3),
    }


def _torch_version() -> str:
    import torch

    return torch.__version__


def _versions() -> dict:
    """This process's versions, for a run that evaluated nothing (every task refused)."""
    import platform

    import torch

    from ..verdict.record import _project_version

    return {"python": platform.python_version(), "cuda_agent": _project_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda}


def _this_device(settings: EvalSettings) -> str:
    """The device's name as the reference child would say it, for a run that evaluated nothing."""
    from ..roles.reference import device_name

    return device_name(settings.device_type())
