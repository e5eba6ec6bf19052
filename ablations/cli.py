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


@ablate.command("importance-ratio")
def importance_ratio(
    config: Path = typer.Option(..., help="ablation config YAML (configs/ablation_tiny.yaml, "
                                "configs/ablation_small.yaml)"),
    out: Optional[Path] = typer.Option(None, help="output folder (default: the config's output_dir)"),
    iterations: Optional[int] = typer.Option(None, help="overrides the config's iterations per arm"),
    overwrite: bool = typer.Option(False, help="replace the data already in the output folder"),
) -> None:
    """Run every arm (sampler head, old log-probs, TIS, RFT init, value pretraining) for every seed from one
    starting checkpoint; write iterations.jsonl and report.md with its figures in the output folder."""
    import dataclasses

    from ablations.config import AblationConfigError, load_ablation_config
    from policy_jax.stages import StageError

    try:
        cfg = load_ablation_config(config)
        if iterations is not None:
            if iterations < 1:
                raise AblationConfigError(f"--iterations must be >= 1, got {iterations}")
            cfg = dataclasses.replace(cfg, iterations=iterations, raw={**cfg.raw, "iterations": iterations})
        from ablations.runner import run_ablation

        run_ablation(cfg, out or Path(cfg.output_dir), say=lambda line: typer.echo(line), overwrite=overwrite)
    except (AblationConfigError, StageError) as e:
        _fail(str(e))


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
