"""Candidate solutions in their two formats, plus the harness self-check.

- "workspace" (CUDA-Agent layout): a folder with `model_new.py` (class ModelNew) and
  `kernels/` (*.cu / *.cpp kernels with extern "C" launchers, *_binding.cpp bindings).
- "kernelbench": one `.py` file whose `ModelNew` builds its own extension with load_inline.
- "reference": no files; the task's own `Model` is the candidate (a harness self-check).

A solutions folder holds `<stem>/` or `<stem>.py` for task `<stem>`, and extra candidates
`<stem>__<variant>` reported as `<stem>[<variant>]`. If it has a subfolder named after the
active backend (`cuda`, `host`), that subfolder is used.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from cuda_agent.contracts import SOLUTION_FORMATS, WORKSPACE_ENTRY, JobError, read_solution_job


class SolutionError(Exception):
    """A solution that cannot be read; str() is one line."""


@dataclasses.dataclass(frozen=True)
class Solution:
    format: str  # "workspace" | "kernelbench" | "reference"
    files: dict  # relpath -> bytes
    entry: str = ""  # the file defining ModelNew
    stem: str = ""  # task stem it answers
    variant: str = ""  # "" for the main candidate, e.g. "wrong"

    @property
    def label(self) -> str:
        return f"{self.stem}[{self.variant}]" if self.variant else self.stem

    def to_job(self) -> dict:
        return {"format": self.format, "files": dict(self.files), "entry": self.entry}


def split_stem(name: str) -> tuple[str, str]:
    """`softmax__wrong` -> (`softmax`, `wrong`); `softmax` -> (`softmax`, ``)."""
    stem, sep, variant = name.partition("__")
    return (stem, variant) if sep else (name, "")


def reference_solution(stem: str = "") -> Solution:
    return Solution(format="reference", files={}, entry="", stem=stem)


def read_solution(path: str | Path) -> Solution:
    """Read a workspace folder or a KernelBench single file into a Solution (the contract
    module's reader: which files of a workspace count)."""
    path = Path(path)
    stem, variant = split_stem(path.stem if path.is_file() else path.name)
    try:
        job = read_solution_job(path)
    except JobError as exc:
        raise SolutionError(str(exc)) from None
    return Solution(job["format"], job["files"], job["entry"], stem, variant)


def solution_from_job(job_solution: dict, stem: str = "") -> Solution:
    fmt = job_solution.get("format")
    if fmt not in SOLUTION_FORMATS:
        raise SolutionError(f"unknown solution format {fmt!r}")
    files = {str(k): bytes(v) for k, v in (job_solution.get("files") or {}).items()}
    entry = job_solution.get("entry") or ""
    if fmt == "workspace":
        entry = entry or WORKSPACE_ENTRY
    elif fmt == "kernelbench" and not entry:
        py = [k for k in files if k.endswith(".py")]
        if len(py) != 1:
            raise SolutionError("a kernelbench solution is exactly one .py file")
        entry = py[0]
    if fmt != "reference" and entry not in files:
        raise SolutionError(f"solution has no {entry}")
    for rel in files:
        if rel.startswith("/") or ".." in Path(rel).parts:
            raise SolutionError(f"solution file path {rel!r} leaves the workspace")
    return Solution(fmt, files, entry, stem)


def solutions_root(folder: str | Path, backend: str) -> Path:
    folder = Path(folder)
    return folder / backend if (folder / backend).is_dir() else folder


def discover_solutions(folder: str | Path, backend: str) -> dict[str, list[Path]]:
    """Map task stem -> candidate paths (main candidate first, then variants by name)."""
    root = solutions_root(folder, backend)
    found: dict[str, list[Path]] = {}
    for entry in sorted(root.iterdir()):
        if entry.name.startswith((".", "_")) and not entry.name.startswith("__"):
            continue
        if entry.is_dir() and (entry / WORKSPACE_ENTRY).is_file() or entry.is_file() and entry.suffix == ".py":
            stem, _ = split_stem(entry.stem if entry.is_file() else entry.name)
            found.setdefault(stem, []).append(entry)
    for stem in found:
        found[stem].sort(key=lambda p: (split_stem(p.stem if p.is_file() else p.name)[1] != "", p.name))
    return found
