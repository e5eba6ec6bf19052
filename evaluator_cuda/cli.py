"""Subcommands of this package for the `cuda-agent` command (imports stay light here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

workspace_app = typer.Typer(help="CUDA-Agent workspaces.", no_args_is_help=True)


def _fail(message: str) -> None:
    from .exit_codes import USAGE_ERROR

    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=USAGE_ERROR)


def _settings(backend: str, repeats: Optional[int], warmup: Optional[int], profile: bool, cache_dir: Optional[Path],
              fast_build: bool = True, timeout: Optional[float] = None, refresh_baselines: bool = False):
    from .settings import EvalSettings, resolve_backend

    overrides = {"profile": profile, "fast_build": fast_build, "refresh_baselines": refresh_baselines}
    if repeats is not None:
        overrides["repeats"] = repeats
    if warmup is not None:
        overrides["warmup"] = warmup
    if cache_dir is not None:
        overrides["cache_dir"] = str(cache_dir)
    if timeout is not None:
        if timeout <= 0:
            _fail("--timeout must be a positive number of seconds")
        overrides["child_timeout_s"] = timeout
    try:
        return EvalSettings.for_backend(resolve_backend(backend), **overrides)
    except ValueError as exc:
        _fail(str(exc))


def _refuse(problem) -> None:
    from .exit_codes import TASK_REFUSED

    typer.echo(f"refused: {problem}", err=True)
    raise typer.Exit(code=TASK_REFUSED)


def _one_task(task_path: Path, name: Optional[str]):
    from .tasks import TaskError, load_tasks

    try:
        task_set = load_tasks(task_path)
    except FileNotFoundError as exc:
        _fail(str(exc))
    except TaskError as exc:
        _refuse(exc)
    if name:
        chosen = [t for t in task_set.tasks if t.name == name or t.stem == name]
        if not chosen:
            problem = next((p for p in task_set.problems if p.task_name in (name,)), None)
            _refuse(problem) if problem else _fail(f"no task named {name!r} in {task_path}")
        return chosen[0]
    if len(task_set.tasks) != 1:
        if task_set.problems and not task_set.tasks:
            _refuse(task_set.problems[0])
        _fail(f"{task_path} holds {len(task_set.tasks)} tasks; pick one with --name")
    return task_set.tasks[0]


BACKEND_HELP = "auto | cuda | host (auto: cuda when a GPU is visible, else host, C++ kernels on the CPU)."
REPEATS_HELP = "Timed calls per measurement (default: 30 on cuda, 5 on host)."
WARMUP_HELP = "Untimed warm-up calls before the timed ones (default: 5 on cuda, 2 on host)."
PROFILE_HELP = "Time candidates and baselines (--no-profile: verdicts only, reward at most 1)."
CACHE_HELP = "Cache folder for builds and baselines (default $CUDA_AGENT_CACHE or ~/.cache/cuda-agent)."
FAST_BUILD_HELP = "Slim-header fast build first (--no-fast-build: always the torch build)."
REFRESH_HELP = ("Measure the eager and torch.compile baselines anew instead of reading the cache, and cache the "
                "new ones.")


def bench(
    tasks: Path = typer.Argument(
        ..., help="A task .py file, a KernelBench-style folder or a parquet file with a `code` column."),
    solutions: Optional[Path] = typer.Option(
        None, "--solutions", "-s",
        help="Folder of solutions (<stem>/ workspaces or <stem>.py files); none: self-check."),
    backend: str = typer.Option("auto", help=BACKEND_HELP),
    out: Optional[Path] = typer.Option(None, help="Report folder (default reports/bench-<time>)."),
    repeats: Optional[int] = typer.Option(None, help=REPEATS_HELP),
    warmup: Optional[int] = typer.Option(None, help=WARMUP_HELP),
    profile: bool = typer.Option(True, help=PROFILE_HELP),
    cache_dir: Optional[Path] = typer.Option(None, help=CACHE_HELP),
    fast_build: bool = typer.Option(True, help=FAST_BUILD_HELP),
    timeout: Optional[float] = typer.Option(
        None, help="Seconds one request to a sandboxed child may take (default 300)."),
    refresh_baselines: bool = typer.Option(False, "--refresh-baselines", help=REFRESH_HELP),
) -> None:
    """Evaluate a task set (and its solutions) and print the KernelBench-style table.

    Exit codes: 0 all correct; 1 a candidate failed its verdict; 2 usage error;
    3 a task was refused; 4 infrastructure failure (the harness failed).
    """
    import time

    from .bench.run import run_bench
    from .exit_codes import INFRA_FAILURE, exit_code

    if not tasks.exists():
        _fail(f"no such task file or folder: {tasks}")
    if solutions is not None and not solutions.is_dir():
        _fail(f"no such solutions folder: {solutions}")
    settings = _settings(backend, repeats, warmup, profile, cache_dir, fast_build, timeout, refresh_baselines)
    out = out or Path("reports") / time.strftime("bench-%Y%m%d-%H%M%S")
    try:
        result = run_bench(tasks, solutions, settings, out)
    except Exception as exc:  # e.g. an unreadable parquet file
        typer.echo(f"error: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(code=INFRA_FAILURE)
    typer.echo(f"wall time {result.wall_s:.1f} s")
    raise typer.Exit(code=exit_code([r["status"] for r in result.main_records], len(result.refused)))


def _say_on_stderr():
    """A progress listener that prints each step of an evaluation on stderr, with the time so far."""
    import time

    begin = time.monotonic()

    def say(step: str) -> None:
        typer.echo(f"[{time.monotonic() - begin:5.1f} s] {step} ...", err=True)

    return say


def evaluate(
    task: Path = typer.Argument(..., help="The task (.py, folder or parquet; use --name for one of many)."),
    solution: Path = typer.Argument(
        ..., help="A workspace folder (model_new.py + kernels/) or a KernelBench ModelNew .py file."),
    name: Optional[str] = typer.Option(None, help="Task name inside a folder or parquet file."),
    backend: str = typer.Option("auto", help=BACKEND_HELP),
    repeats: Optional[int] = typer.Option(None, help=REPEATS_HELP),
    warmup: Optional[int] = typer.Option(None, help=WARMUP_HELP),
    profile: bool = typer.Option(True, help=PROFILE_HELP),
    cache_dir: Optional[Path] = typer.Option(None, help=CACHE_HELP),
    fast_build: bool = typer.Option(True, help=FAST_BUILD_HELP),
    timeout: Optional[float] = typer.Option(
        None, help="Seconds one request to a sandboxed child may take, e.g. a hanging candidate (default 300)."),
    refresh_baselines: bool = typer.Option(False, "--refresh-baselines", help=REFRESH_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines on stderr."),
) -> None:
    """Evaluate one solution for one task and print its result record as JSON (progress on stderr).

    Exit codes: 0 correct; 1 the candidate failed its verdict; 2 usage error;
    3 the task was refused; 4 infrastructure failure (the harness failed).
    """
    import contextlib

    from .evaluation import evaluate as evaluate_candidate
    from .exit_codes import exit_code
    from .progress import listening
    from .solutions import SolutionError, read_solution

    the_task = _one_task(task, name)
    try:
        the_solution = read_solution(solution)
    except SolutionError as exc:
        _fail(str(exc))
    settings = _settings(backend, repeats, warmup, profile, cache_dir, fast_build, timeout, refresh_baselines)
    with contextlib.nullcontext() if quiet else listening(_say_on_stderr()):
        record = evaluate_candidate(the_task, the_solution, settings)
    typer.echo(json.dumps(record, indent=1))
    raise typer.Exit(code=exit_code([record["status"]]))


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
