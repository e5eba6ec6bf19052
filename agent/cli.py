"""Subcommands of this package for the `cuda-agent` command (imports stay light here)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this package's commands to the root app."""
