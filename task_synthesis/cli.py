"""`cuda-agent data ...`: the seed-operator crawl and task synthesis (imports stay light here)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

data_app = typer.Typer(help="Training tasks: crawl seed operators, synthesise a task set.", no_args_is_help=True)

USAGE_ERROR = 2
ENDPOINT_ERROR = 3
COMPOSERS = ("programmatic", "llm")


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
    cache_dir: Optional[Path] = typer.Option(None, help="Evaluator cache folder of unjailed workers (default as for "
                                                        "bench); jailed workers keep theirs in their private /tmp."),
    unjailed_workers: bool = typer.Option(False, "--unjailed-workers",
                                          help="Run the filter's workers without the jail: candidate code runs "
                                               "as this user, with its files and network (warned of with --composer "
                                               "llm)."),
    composer: str = typer.Option("programmatic", help="programmatic | llm: who writes each task from the drawn "
                                                      "operators (llm: a model behind --base-url)."),
    base_url: Optional[str] = typer.Option(None, help="OpenAI-compatible endpoint for --composer llm, "
                                                      "e.g. http://host:8000/v1"),
    model: Optional[str] = typer.Option(None, help="Model name at the endpoint (--composer llm)."),
    api_key_env: str = typer.Option("OPENAI_API_KEY", help="Environment variable holding the endpoint's API key "
                                                           "(unset: no key is sent)."),
    request_timeout: float = typer.Option(120.0, help="Seconds one request to the endpoint may take."),
    retries: int = typer.Option(3, help="Further attempts of a request that failed in a way that may pass "
                                        "(no connection, a timeout, HTTP 408, 429 or 5xx)."),
) -> None:
    """Synthesise COUNT training tasks: compose, decontaminate, filter by execution, write parquet and a report.

    Resumable: run the same command again after a crash; only the candidates in flight are lost.
    With --composer llm a model writes each task from the same draw of operators; its code goes
    through the same screen, similarity checks and execution filter, and is never run in this process.
    The filter's workers run in a jail (no network, read-only code, a private /tmp); where the jail cannot be
    built, --composer llm is refused (--unjailed-workers overrides) and programmatic tasks run unjailed.
    Exit codes: 0 every quota met; 1 some categories fell short; 2 bad input, no jail for --composer llm,
    or workers that cannot start; 3 the LLM endpoint failed (unreachable, HTTP errors after the retries);
    130 stopped (SIGTERM or Ctrl-C; the workers and their evaluator children are ended, and running again
    resumes).
    """
    from cuda_agent.contracts import BackendError

    from .config import ConfigError, SynthesisConfig
    from .catalogue.store import CatalogueError
    from .compose.chat_client import EndpointError
    from .pipeline.journal import JournalError
    from .filter.pool import WorkersCannotStart
    from .pipeline.run import RunOptions, Stopped, Synthesis, SynthesisError
    from .pipeline.outputs import second_tries

    if backend not in ("auto", "cuda", "host"):
        _fail(f"unknown backend {backend!r} (expected auto, cuda or host)")
    llm = _chat_settings(composer, base_url, model, api_key_env, request_timeout, retries)
    try:
        settings = SynthesisConfig.load(config, scale=scale, evaluator=evaluator, compile=compile_check)
        resolved = _backend(backend)
        if resolved == "cuda" and settings.scale != "paper":
            _say(f"note: the {settings.scale} scale is sized for the host; on a GPU almost every task runs "
                 "below the 1 ms window (--scale paper gives the paper's sizes)")
        options = RunOptions(out=out, count=count, config=settings, seed=seed, workers=workers, backend=resolved,
                             eval_dir=eval_dir, cache_dir=str(cache_dir) if cache_dir else None, llm=llm,
                             unjailed_workers=unjailed_workers)
        begin = time.monotonic()
        run = Synthesis(options, progress=_say)
        if run.jail_note:
            _say(run.jail_note)
        run.run()
    except (BackendError, ConfigError, CatalogueError, JournalError, SynthesisError, WorkersCannotStart) as exc:
        _fail(str(exc))
    except EndpointError as exc:
        typer.echo(f"error: {exc}; {len(run.journal.entries)} decided candidates are in the journal, "
                   "run the same command to resume", err=True)
        raise typer.Exit(code=ENDPOINT_ERROR)
    except Stopped as exc:
        typer.echo(f"stopped: {exc}", err=True)
        raise typer.Exit(code=130)
    written = _finish(run, time.monotonic() - begin)
    _say(_start_up_line(run))
    _say(second_tries(run.journal.entries))
    short = {c: q - run.kept[c] for c, q in run.quotas.items() if run.kept[c] < q}
    typer.echo(f"{written} tasks in {out}; report in {_report_path(out)}")
    if short:
        typer.echo("short of the quota: " + ", ".join(f"{c}: {n}" for c, n in short.items()), err=True)
        raise typer.Exit(code=1)


def _chat_settings(composer: str, base_url, model, api_key_env: str, timeout_s: float, retries: int):
    """The LLM composer's endpoint settings (None for the programmatic composer); bad ones end the command."""
    if composer not in COMPOSERS:
        _fail(f"unknown composer {composer!r} (expected {' or '.join(COMPOSERS)})")
    if composer == "programmatic":
        if base_url or model:
            _fail("--base-url and --model are for --composer llm")
        return None
    if not base_url or not model:
        _fail("--composer llm needs --base-url (an OpenAI-compatible endpoint, e.g. http://host:8000/v1) and --model")
    from .compose.chat_client import ChatSettings

    try:
        return ChatSettings(base_url=base_url, model=model, api_key_env=api_key_env, timeout_s=timeout_s,
                            retries=retries)
    except ValueError as exc:
        _fail(str(exc))


def _start_up_line(run) -> str:
    times = sorted(run.pool.start_times)
    where = "jailed" if run.jailed else "unjailed"
    if not times:
        return f"workers ({where}): none started"
    median = times[len(times) // 2]
    return f"workers ({where}): {len(times)} started, start-up median {median:.2f} s, max {times[-1]:.2f} s"


def _backend(backend: str) -> str:
    """auto -> cuda when the driver shows a GPU, else host; cuda without one is a BackendError (one line)."""
    from cuda_agent.contracts import resolve_backend

    return resolve_backend(backend)


def _report_path(out: Path) -> Path:
    return out.with_name(out.stem + ".report.md")


def _finish(run, wall_s: float) -> int:
    from .pipeline.outputs import plot_similarity, write_parquet, write_report

    entries = run.journal.entries
    written = write_parquet(entries, run.o.out, run.o.backend)
    plot = plot_similarity(entries, run.o.config.similarity_threshold,
                           run.o.out.with_name(run.o.out.stem + ".similarity.png"))
    write_report(entries, run.quotas, run.o.config.composition, (wall_s, run.kept_this_session()),
                 _report_path(run.o.out), plot, run.journal_settings())
    return written


def register(app: typer.Typer) -> None:
    """Add this package's commands to the root app."""
    app.add_typer(data_app, name="data")
