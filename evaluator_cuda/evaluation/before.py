"""Before the children: the static checks of the sources, the build, and the read-only copies the
candidate sees (the solution and the built extension)."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..extension.build import build_workspace
from ..extension.diagnostics import located
from ..isolation.static_checks import check_solution_sources
from ..progress import say
from ..settings import EvalSettings
from ..solutions import Solution
from ..tasks import Task
from ..verdict.fault import Verdict, rejection


def check_sources(solution: Solution, settings: EvalSettings) -> list:
    """Reject a solution whose sources hold a forbidden form, before anything is built. Returns the
    findings that wait for the build: calls of names torch lacks, most likely typos the compiler names."""
    if solution.format == "reference" or not settings.static_checks:
        return []
    findings = check_solution_sources(solution.files)
    if any(f.reason != "unknown_torch_name" for f in findings):
        reject_findings(findings)
    return findings


def reject_findings(findings: list) -> None:
    """The rejection of static findings, each a diagnostic with its file and line."""
    diagnostics = [located(f.message) for f in findings]
    first = next((f for f in findings if f.reason != "unknown_torch_name"), findings[0])
    reason = "torch_compute_cpp" if first.reason == "unknown_torch_name" else first.reason
    raise rejection(reason, first.message, diagnostics)


def built_extension(solution: Solution, settings: EvalSettings, artifact: bytes | None, workdir: Path,
                    record: dict) -> Path | None:
    """The built extension (None: the solution builds none itself): the artifact a compile job
    made, or a build now. The build's facts go into the record; a failed build is the verdict."""
    if solution.format != "workspace":
        return None
    if artifact is not None:
        path = workdir / "cuda_extension.so"
        path.write_bytes(artifact)
        record["build"].update(seconds=0.0, cache_hit=True, key="artifact")
        return path
    say("building the extension (a first build takes longer)")
    built = build_workspace(solution.files, settings)
    record["build"].update(seconds=round(built.build_seconds, 4), cache_hit=built.cache_hit, key=built.key,
                           path=built.path or None, fast_fallback=built.fast_fallback)
    record["wall_s"]["build"] = round(built.build_seconds, 4)
    if built.status != "built":
        raise Verdict(built.status, built.diagnostics[0]["message"] if built.diagnostics else "build failed",
                      built.diagnostics)
    return Path(built.so_path)


def extension_copy(extension: Path | None, folder: Path, settings: EvalSettings) -> tuple[Path | None, Path | None]:
    """The built extension (and, for a fast-built one, the binding runtime) copied into the
    folder the candidate sees read-only: the cache entry itself stays outside its view."""
    if extension is None:
        return None, None
    from ..extension.fast.binding_runtime import RUNTIME_NAME, is_fast_extension, runtime_dir

    copy = folder / extension.name
    shutil.copyfile(extension, copy)
    copy.chmod(0o444)
    runtime = None
    if is_fast_extension(str(extension)):
        built = runtime_dir(settings.cache_path() / "fastbuild") / f"{RUNTIME_NAME}.so"
        if built.exists():
            runtime = folder / built.name
            shutil.copyfile(built, runtime)
            runtime.chmod(0o444)
    return copy, runtime


def read_only_copy(solution: Solution, task: Task, folder: Path) -> Path:
    """The candidate's copy of its solution (and the task): files 0444, folders 0555. The
    candidate child's own logs live one level up, outside this folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for rel, data in solution.files.items():
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    (folder / "model.py").write_text(task.source)
    for path in sorted(folder.rglob("*"), reverse=True):
        path.chmod(0o555 if path.is_dir() else 0o444)
    folder.chmod(0o555)
    return folder

