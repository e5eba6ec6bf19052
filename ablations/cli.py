"""`cuda-agent ablate importance-ratio` and `cuda-agent ablate report` (JAX is imported inside the commands)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

ablate = typer.Typer(help="Ablations: run the arms of an experiment side by side and report on them.",
                     no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(ablate, name="ablate")


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def _seed_list(text: str) -> tuple[int, ...]:
    from ablations.config import AblationConfigError, seeds_from

    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise AblationConfigError(f"--seeds must be comma-separated integers, got {text!r}") from None
    return seeds_from(values)


@ablate.command("importance-ratio")
def importance_ratio(
    config: Path = typer.Option(..., help="ablation config YAML (configs/ablation_tiny.yaml, "
                                "configs/ablation_small.yaml)"),
    out: Optional[Path] = typer.Option(None, help="output folder (default: the config's output_dir)"),
    iterations: Optional[int] = typer.Option(None, help="overrides the config's iterations per arm"),
    seeds: Optional[str] = typer.Option(None, help="overrides the config's seeds (comma-separated, e.g. 0,1)"),
    resume: bool = typer.Option(True, help="continue the run the output folder holds (--no-resume: start over, "
                                "discarding it)"),
    devices: Optional[int] = typer.Option(None, help="run on the first N devices (default: all); the config's mesh "
                                          "is laid over those"),
) -> None:
    """Run every arm (sampler head, old log-probs, TIS, RFT init, value pretraining) for every seed from one
    starting checkpoint; write iterations.jsonl and report.md with its figures in the output folder.

    Resumable: each iteration's record is appended as it ends and the states are checkpointed every
    `checkpoint_every` iterations (config); running the same command again skips the finished arms and
    continues the one in progress from its last checkpoint; a run started with another config is refused.
    Exit codes: 0 done; 2 bad input; 130 stopped (SIGTERM or Ctrl-C; running again resumes).
    """
    import dataclasses

    from ablations.config import AblationConfigError, load_ablation_config
    from ablations.stopping import Stopped
    from policy_jax.checkpoint import CheckpointError
    from policy_jax.sharding import MeshConfigError, first_devices
    from policy_jax.stages import StageError

    try:
        cfg = load_ablation_config(config)
        if iterations is not None:
            if iterations < 1:
                raise AblationConfigError(f"--iterations must be >= 1, got {iterations}")
            cfg = dataclasses.replace(cfg, iterations=iterations, raw={**cfg.raw, "iterations": iterations})
        if seeds is not None:
            chosen = _seed_list(seeds)
            cfg = dataclasses.replace(cfg, seeds=chosen, raw={**cfg.raw, "seeds": list(chosen)})
        from ablations.runner import run_ablation

        run_ablation(cfg, out or Path(cfg.output_dir), say=lambda line: typer.echo(line), resume=resume,
                     devices=first_devices(devices))
    except (AblationConfigError, StageError, CheckpointError, MeshConfigError) as e:
        _fail(str(e))
    except Stopped as e:
        typer.echo(f"stopped: {e}", err=True)
        raise typer.Exit(code=130)
    except KeyboardInterrupt:  # before the run set its own handling up
        typer.echo("stopped: Ctrl-C before the run began; run the same command again", err=True)
        raise typer.Exit(code=130)


@ablate.command("report")
def report(folder: Path = typer.Argument(..., help="an ablation output folder (iterations.jsonl, ablation.json)")
           ) -> None:
    """Render report.md and its figures again from the data in FOLDER alone."""
    from ablations.config import AblationConfigError
    from ablations.report import write_report

    try:
        typer.echo(f"report: {write_report(folder)}")
    except (AblationConfigError, ValueError) as e:
        _fail(str(e))
