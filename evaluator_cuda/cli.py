"""Subcommands of this package for the `cuda-agent` command (imports stay light here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

workspace_app = typer.Typer(help="CUDA-Agent workspaces.", no_args_is_help=True)


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def _settings(backend: str, repeats: Optional[int], warmup: Optional[int], profile: bool, cache_dir: Optional[Path],
              fast_build: bool = True):
    from .bench.run import resolve_backend
    from .settings import EvalSettings

    overrides = {"profile": profile, "fast_build": fast_build}
    if repeats is not None:
        overrides["repeats"] = repeats
    if warmup is not None:
        overrides["warmup"] = warmup
    if cache_dir is not None:
        overrides["cache_dir"] = str(cache_dir)
    try:
        return EvalSettings.for_backend(resolve_backend(backend), **overrides)
    except ValueError as exc:
        _fail(str(exc))


def _one_task(task_path: Path, name: Optional[str]):
    from .tasks import TaskError, load_tasks

    try:
        task_set = load_tasks(task_path)
    except (FileNotFoundError, TaskError) as exc:
        _fail(str(exc))
    if name:
        chosen = [t for t in task_set.tasks if t.name == name or t.stem == name]
        if not chosen:
            problem = next((p for p in task_set.problems if p.task_name in (name,)), None)
            _fail(str(problem) if problem else f"no task named {name!r} in {task_path}")
        return chosen[0]
    if len(task_set.tasks) != 1:
        if task_set.problems and not task_set.tasks:
            _fail(str(task_set.problems[0]))
        _fail(f"{task_path} holds {len(task_set.tasks)} tasks; pick one with --name")
    return task_set.tasks[0]


def bench(
    tasks: Path = typer.Argument(
        ..., help="A task .py file, a KernelBench-style folder or a parquet file with a `code` column."),
    solutions: Optional[Path] = typer.Option(
        None, "--solutions", "-s",
        help="Folder of solutions (<stem>/ workspaces or <stem>.py files); none: self-check."),
    backend: str = typer.Option("auto", help="auto | cuda | host (host: C++ kernels on the CPU)."),
    out: Optional[Path] = typer.Option(None, help="Report folder (default reports/bench-<time>)."),
    repeats: Optional[int] = typer.Option(None, help="Timed calls per measurement."),
    warmup: Optional[int] = typer.Option(None, help="Untimed warm-up calls."),
    profile: bool = typer.Option(True, help="Time candidates and baselines (--no-profile: verdicts only)."),
    cache_dir: Optional[Path] = typer.Option(
        None, help="Cache folder (default $CUDA_AGENT_CACHE or ~/.cache/cuda-agent)."),
    fast_build: bool = typer.Option(
        True, help="Slim-header fast build first (--no-fast-build: always the torch build)."),
) -> None:
    """Evaluate a task set (and its solutions) and print the KernelBench-style table."""
    import time

    from .bench.run import run_bench

    if not tasks.exists():
        _fail(f"no such task file or folder: {tasks}")
    if solutions is not None and not solutions.is_dir():
        _fail(f"no such solutions folder: {solutions}")
    settings = _settings(backend, repeats, warmup, profile, cache_dir, fast_build)
    out = out or Path("reports") / time.strftime("bench-%Y%m%d-%H%M%S")
    try:
        result = run_bench(tasks, solutions, settings, out)
    except Exception as exc:  # e.g. an unreadable parquet file
        _fail(f"{type(exc).__name__}: {exc}")
    typer.echo(f"wall time {result.wall_s:.1f} s")
    if result.problems:
        raise typer.Exit(code=1)


def evaluate(
    task: Path = typer.Argument(..., help="The task (.py, folder or parquet; use --name for one of many)."),
    solution: Path = typer.Argument(
        ..., help="A workspace folder (model_new.py + kernels/) or a KernelBench ModelNew .py file."),
    name: Optional[str] = typer.Option(None, help="Task name inside a folder or parquet file."),
    backend: str = typer.Option("auto", help="auto | cuda | host."),
    repeats: Optional[int] = typer.Option(None),
    warmup: Optional[int] = typer.Option(None),
    profile: bool = typer.Option(True),
    cache_dir: Optional[Path] = typer.Option(None),
    fast_build: bool = typer.Option(
        True, help="Slim-header fast build first (--no-fast-build: always the torch build)."),
) -> None:
    """Evaluate one solution for one task and print its result record as JSON."""
    from .evaluation import evaluate as evaluate_candidate
    from .solutions import SolutionError, read_solution

    the_task = _one_task(task, name)
    try:
        the_solution = read_solution(solution)
    except SolutionError as exc:
        _fail(str(exc))
    record = evaluate_candidate(the_task, the_solution,
                                _settings(backend, repeats, warmup, profile, cache_dir, fast_build))
    typer.echo(json.dumps(record, indent=1))
    if record["status"] in ("infra_error", "task_error"):
        raise typer.Exit(code=1)


@workspace_app.command("init")
def workspace_init(
    task: Path = typer.Argument(..., help="The task (.py, or a folder/parquet with --name)."),
    folder: Path = typer.Argument(..., help="Where to lay out the workspace (must be new or empty)."),
    name: Optional[str] = typer.Option(None, help="Task name inside a folder or parquet file."),
) -> None:
    """Lay out a fresh CUDA-Agent workspace (model.py, model_new.py, kernels/, SKILL.md) for a task."""
    from cuda_agent.workspace import WorkspaceError, init_workspace

    the_task = _one_task(task, name)
    try:
        init_workspace(the_task.source, folder)
    except WorkspaceError as exc:
        _fail(str(exc))
    typer.echo(f"workspace for {the_task.name} in {folder}")


def register(app: typer.Typer) -> None:
    """Add this package's commands to the root app."""
    app.command("bench")(bench)
    app.command("evaluate")(evaluate)
    app.add_typer(workspace_app, name="workspace")
    from .extension.fast.cli import register as register_fast_build

    register_fast_build(app)
