"""`cuda-agent fast-build`: build a workspace solution through the fast path and report (imports stay light).

    cuda-agent fast-build SOLUTION_DIR [--backend auto|cuda|host] [--arch 9.0] [--cache DIR] [--json]
    cuda-agent fast-build --warm-up [--backend auto|cuda|host]  # precompile the shared parts and the runtime

evaluator_cuda/cli.py adds these with `from .extension.fast.cli import register as register_fast_build`.
Exit status: 0 built, 1 the candidate's compile error, 2 usage error (or no toolchain for the backend),
3 the solution needs the full torch build.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def _usable_backend(backend: str) -> str:
    """`auto` resolved on this machine; a backend whose compilers are missing refused with one line."""
    from cuda_agent.contracts import AUTO_BACKEND, BACKENDS

    from ...settings import resolve_backend
    from .toolchain import ToolchainMissing, find_toolchain

    if backend == AUTO_BACKEND:
        backend = resolve_backend(backend)
    if backend not in BACKENDS:
        typer.echo(f"error: unknown backend {backend!r} (expected auto, cuda or host)", err=True)
        raise typer.Exit(2)
    try:
        find_toolchain(backend)
    except ToolchainMissing as exc:
        typer.echo(f"error: backend {backend}: {exc}", err=True)
        raise typer.Exit(2)
    return backend


def register(app: typer.Typer) -> None:
    """Add the fast-build command to the root app."""

    @app.command("fast-build")
    def fast_build(
        solution: Optional[Path] = typer.Argument(None, help="Workspace folder (with kernels/)."),
        backend: str = typer.Option(
            "auto", help="auto | cuda | host (auto: cuda when a GPU is visible, else host; cuda needs nvcc)."),
        arch: Optional[str] = typer.Option(None, help="TORCH_CUDA_ARCH_LIST (default: env or 9.0)."),
        cache: Optional[Path] = typer.Option(None, help="Cache folder (default ~/.cache/cuda-agent/fastbuild)."),
        warm_up: bool = typer.Option(False, "--warm-up", help="Build the shared parts and the binding runtime."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    ) -> None:
        """Compile a workspace solution the fast way (slim headers, parallel, cached by content).

        Exit codes: 0 built; 1 the candidate's compile error; 2 usage error or no toolchain for the
        backend; 3 the solution needs the full torch build.
        """
        from .builder import build_fast, warm_up as warm_up_build

        backend = _usable_backend(backend)
        if warm_up:
            result = warm_up_build(backend, cache, arch)
            from .binding_runtime import ensure_binding_runtime

            ensure_binding_runtime(cache)
        elif solution is None or not (solution / "kernels").is_dir():
            typer.echo(f"error: {solution} is not a workspace folder (no kernels/ inside)", err=True)
            raise typer.Exit(2)
        else:
            result = build_fast(solution, backend, cache, arch)
        record = {"status": result.status, "so_path": result.so_path, "seconds": round(result.seconds, 3),
                  "cache_hit": result.cache_hit, "fallback_reason": result.fallback_reason,
                  "diagnostics": result.diagnostics, "units": result.units}
        if as_json:
            typer.echo(json.dumps(record, indent=2))
        else:
            typer.echo(f"{result.status} in {result.seconds:.2f} s{' (cached)' if result.cache_hit else ''}"
                       + (f": {result.so_path}" if result.ok else ""))
            if result.fallback_reason:
                typer.echo(f"needs the full torch build: {result.fallback_reason}")
            for d in result.diagnostics[:20]:
                where = f"{d['file']}:{d['line']}: " if d.get("file") else ""
                typer.echo(f"  {where}{d['message']}")
        raise typer.Exit(0 if result.ok else (3 if result.fallback_reason else 1))
