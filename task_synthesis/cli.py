"""`cuda-agent data ...`: the seed-operator crawl and task synthesis (imports stay light here)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

data_app = typer.Typer(help="Training tasks: crawl seed operators, synthesise a task set.", no_args_is_help=True)

USAGE_ERROR = 2


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=USAGE_ERROR)


def _say(line: str) -> None:
    typer.echo(line, err=True)


@data_app.command("crawl")
def crawl(out: Path = typer.Option(None, help="Catalogue file to write (default: the packaged one).")) -> None:
    """Crawl the installed torch (and the transformers-style blocks) into the seed-operator catalogue."""
    from .catalogue import store
    from .catalogue.crawl import crawl as crawl_torch

    catalogue = crawl_torch(progress=_say)
    path = store.save(catalogue, out or store.DEFAULT_PATH)
    typer.echo(f"{len(catalogue['operators'])} operators kept, {len(catalogue['failures'])} recorded with a "
               f"reason, in {path}")


@data_app.command("synthesize")
def synthesize(
    out: Path = typer.Option(..., help="The parquet file to write (Ops-6K layout); its journal sits beside it."),
    count: int = typer.Option(..., help="How many tasks to keep."),
    config: Optional[Path] = typer.Option(None, help="Settings yaml (default: the paper's values, "
                                                     "configs/task_synthesis.yaml documents them)."),
    eval_dir: Optional[Path] = typer.Option(None, help="Evaluation programs to decontaminate against "
                                                       "(a KernelBench-style folder, a .py or a parquet)."),
    workers: int = typer.Option(2, help="Worker processes running the execution filter."),
    backend: str = typer.Option("auto", help="auto | cuda | host: where the evaluator runs the tasks."),
    scale: Optional[str] = typer.Option(None, help="Input sizes: small | medium | paper (default from the config)."),
    seed: int = typer.Option(0, help="Seed of the candidate stream (a resume must use the same one)."),
    evaluator: Optional[bool] = typer.Option(None, "--evaluator/--no-evaluator",
                                             help="Run the evaluator's reference self-check in isolated children."),
    compile_check: Optional[bool] = typer.Option(None, "--compile/--no-compile",
                                                 help="Require the evaluator's torch.compile baseline to run."),
    cache_dir: Optional[Path] = typer.Option(None, help="Evaluator cache folder (default as for bench)."),
) -> None:
    """Synthesise COUNT training tasks: compose, decontaminate, filter by execution, write parquet and a report.

    Resumable: run the same command again after a crash; only the candidates in flight are lost.
    Exit codes: 0 every quota met; 1 some categories fell short; 2 bad input; 130 stopped (SIGTERM or
    Ctrl-C; the workers and their evaluator children are ended, and running again resumes).
    """
    from .config import ConfigError, SynthesisConfig
    from .catalogue.store import CatalogueError
    from .pipeline.journal import JournalError
    from .pipeline.run import RunOptions, Stopped, Synthesis, SynthesisError

    if backend not in ("auto", "cuda", "host"):
        _fail(f"unknown backend {backend!r} (expected auto, cuda or host)")
    try:
        settings = SynthesisConfig.load(config, scale=scale, evaluator=evaluator, compile=compile_check)
        resolved = _backend(backend)
        options = RunOptions(out=out, count=count, config=settings, seed=seed, workers=workers, backend=resolved,
                             eval_dir=eval_dir, cache_dir=str(cache_dir) if cache_dir else None)
        begin = time.monotonic()
        run = Synthesis(options, progress=_say)
        run.run()
    except (ConfigError, CatalogueError, JournalError, SynthesisError) as exc:
        _fail(str(exc))
    except Stopped as exc:
        typer.echo(f"stopped: {exc}", err=True)
        raise typer.Exit(code=130)
    written = _finish(run, time.monotonic() - begin)
    short = {c: q - run.kept[c] for c, q in run.quotas.items() if run.kept[c] < q}
    typer.echo(f"{written} tasks in {out}; report in {_report_path(out)}")
    if short:
        typer.echo("short of the quota: " + ", ".join(f"{c}: {n}" for c, n in short.items()), err=True)
        raise typer.Exit(code=1)


def _backend(backend: str) -> str:
    if backend != "auto":
        return backend
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "host"
    except ImportError:
        return "host"


def _report_path(out: Path) -> Path:
    return out.with_name(out.stem + ".report.md")


def _finish(run, wall_s: float) -> int:
    from .pipeline.outputs import plot_similarity, write_parquet, write_report

    entries = run.journal.entries
    written = write_parquet(entries, run.o.out, run.o.backend)
    plot = plot_similarity(entries, run.o.config.similarity_threshold,
                           run.o.out.with_name(run.o.out.stem + ".similarity.png"))
    write_report(entries, run.quotas, run.o.config.composition, wall_s, _report_path(run.o.out), plot,
                 run.journal_settings())
    return written


def register(app: typer.Typer) -> None:
    """Add this package's commands to the root app."""
    app.add_typer(data_app, name="data")
