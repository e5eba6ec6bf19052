"""Paths of the checkout, a task and a candidate loaded outside the evaluator, the JSON written to $OUT, and the
one line a GPU subcommand gives on a machine without one.

The loaders are used in the benchmarks' own processes (timing child, compile checks, dry run), never in the
evaluator: the evaluator loads candidates only in its sandboxed candidate child.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "bench_evaluator.py"
TASKS = REPO / "examples" / "tasks"
SOLUTIONS = REPO / "examples" / "solutions"


def put_checkout_on_path() -> None:
    """The checkout importable here and in every child: the evaluator's children run
    `python -m evaluator_cuda.roles.child`, so PYTHONPATH names the checkout too."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


def gpu_missing(subcommand: str, otherwise: str | None = None) -> bool:
    """True, after one line on stderr, when no GPU is visible to a subcommand that needs one (`otherwise`:
    what it can do here instead)."""
    import torch

    if torch.cuda.is_available():
        return False
    print(f"no GPU visible: `bench_evaluator.py {subcommand}` needs one" + (f" (or {otherwise})" if otherwise else ""),
          file=sys.stderr)
    return True


def load_task(task_path: str | Path) -> dict:
    """The namespace of a task file (Model, get_inputs, get_init_inputs, its constants)."""
    from evaluator_cuda.tasks import exec_task

    task_path = Path(task_path)
    return exec_task(task_path.stem, task_path.read_text())


def load_model_new(solution: str | Path, so_path: str | None = None, fast_cache_dir: str | None = None):
    """The ModelNew class of a solution.

    A workspace folder: its built extension (torch- or fast-built `so_path`) is imported as
    `cuda_extension` first, then `model_new.py`. A KernelBench file: the file itself, which
    builds or loads its own extension (load_inline) when it is imported.
    """
    solution = Path(solution)
    if solution.is_dir():
        from evaluator_cuda.roles.candidate import load_extension_module

        load_extension_module(so_path, fast_cache_dir)
        sys.path.insert(0, str(solution))
        entry = solution / "model_new.py"
    else:
        entry = solution
    spec = importlib.util.spec_from_file_location("model_new", str(entry))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ModelNew


def write_out(name: str, data: dict) -> Path | None:
    """$OUT/<name> as JSON when OUT is set (the folder made if needed); the path written, or None."""
    out = os.environ.get("OUT")
    if not out:
        return None
    path = Path(out) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str))
    print(f"wrote {path}")
    return path
