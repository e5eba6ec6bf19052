"""Root of the `cuda-agent` command.

Each package contributes its subcommands through a `register(app)` function in its own
`cli.py`. Those modules keep their imports light (torch, JAX and pyzmq are imported inside
the commands), so `cuda-agent --help` stays fast and a TPU host without torch can still run
the policy commands.
"""

from __future__ import annotations

import importlib

import typer

from cuda_agent.cli_style import plain_help

app = typer.Typer(
    name="cuda-agent",
    help="Train LLM agents to write fast CUDA kernels, and grade those kernels honestly.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_PACKAGES = ("evaluator_cuda", "bridge", "policy_jax", "agent", "task_synthesis", "ablations")


def _register_all() -> None:
    for package in _PACKAGES:
        module = importlib.import_module(f"{package}.cli")
        module.register(app)


_register_all()


@app.command("version")
def version() -> None:
    """Print the versions of the project and of the frameworks it finds."""
    from importlib.metadata import PackageNotFoundError, version as pkg_version

    for name in ("cuda-agent", "torch", "jax", "flax", "pyzmq"):
        try:
            typer.echo(f"{name} {pkg_version(name)}")
        except PackageNotFoundError:
            typer.echo(f"{name} (not installed)")


@app.command("metrics-report")
def metrics_report(
    metrics_file: str = typer.Argument(..., help="The JSON lines a train or train-loop run wrote (--log-file)."),
    out: str = typer.Option("metrics-report", help="Folder for report.md and one figure per stage."),
) -> None:
    """Curves and a table of a training run's metrics, written from its JSON lines alone."""
    from cuda_agent.metrics_report import ReportError, write_report

    typer.echo(f"reading {metrics_file}", err=True)
    try:
        report = write_report(metrics_file, out)
    except ReportError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2)
    typer.echo(str(report))


plain_help(app)  # last: every command above shows its help the plain way


def main() -> None:
    app()


if __name__ == "__main__":
    main()
