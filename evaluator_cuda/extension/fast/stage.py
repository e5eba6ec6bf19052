"""Where a fast build happens: the content-addressed cache, the staging folder and the compiler runs.

The cache holds objects under obj/<key[:2]>/<key>.o (compile errors as <key>.error.json beside
them) and libraries under lib/<key>/, each sealed with its digest (isolation/integrity.py). A
build writes into a fresh staging folder under stage/, which is all a jailed compiler sees: the
sources, the harness, the precompiled header and, for the link, copies of the objects.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

from cuda_agent.jail import SYSTEM_DIRS, Bind

from ...isolation.integrity import digest_path, seal
from .compile_errors import INCLUDE_DIR

# Limits of one compiler process group (a hostile source can make a compiler loop, eat memory or write a huge file).
COMPILER_MEMORY_BYTES = 24 * 1024**3  # address space; nvcc's cicc/ptxas stay far below this on real kernels
COMPILER_FILE_BYTES = 2 * 1024**3


class BuildCache:
    """Objects and libraries on disk under their content hash; failures as JSON next to them."""

    def __init__(self, root: Path):
        self.root = root

    def object_path(self, key: str) -> Path:
        return self.root / "obj" / key[:2] / f"{key}.o"

    def failure_path(self, key: str) -> Path:
        return self.root / "obj" / key[:2] / f"{key}.error.json"

    def library_dir(self, key: str) -> Path:
        return self.root / "lib" / key

    def publish(self, staged: Path, final: Path) -> None:
        """The file and, first, its digest (integrity.py): a reader never finds the file unsealed."""
        final.parent.mkdir(parents=True, exist_ok=True)
        seal(staged)
        os.replace(digest_path(staged), digest_path(final))
        os.replace(staged, final)  # atomic; a concurrent identical build writes identical bytes

    def write_json(self, final: Path, data: dict) -> None:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(data))
        self.publish(tmp, final)


def default_cache_dir() -> Path:
    from ...settings import cache_root

    return cache_root() / "fastbuild"


@contextlib.contextmanager
def staging_folder(cache: BuildCache, key: str):
    """A fresh folder under the cache's stage/ for one build, removed afterwards."""
    stage_root = cache.root / "stage"
    stage_root.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f"{key[:12]}-", dir=stage_root))
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def clean_log(text: str, stage: Path) -> str:
    """Compiler output with the staging folder and the slim-header folder shown as short names."""
    return text.replace(str(stage) + "/", "").replace(str(INCLUDE_DIR) + "/", "<slim-torch>/")


def _limit_compiler(pid: int) -> None:
    """Memory and file-size limits on a started compiler (prlimit: no preexec_fn, which is unsafe with threads)."""
    try:
        resource.prlimit(pid, resource.RLIMIT_AS, (COMPILER_MEMORY_BYTES, COMPILER_MEMORY_BYTES))
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (COMPILER_FILE_BYTES, COMPILER_FILE_BYTES))
    except (OSError, ValueError):
        pass  # already exited, or limits not allowed here: the timeout still applies


def toolchain_binds(cuda_home: str | None, cxx: str | None = None) -> tuple[Bind, ...]:
    """What a jailed compiler or build child must see besides the system folders, read-only: the CUDA
    toolkit's real folder (/usr/local/cuda may point outside them) and the installation the C++
    compiler belongs to when it lies elsewhere (the GPU machine's CXX is /opt/gcc/bin/g++)."""
    folders = [os.path.realpath(cuda_home)] if cuda_home else []
    if cxx:
        real = os.path.realpath(shutil.which(cxx) or cxx)
        prefix = os.path.dirname(os.path.dirname(real))
        if prefix != "/" and not any(_under(real, system) for system in SYSTEM_DIRS):
            folders.append(prefix)
    return tuple(Bind(folder) for folder in dict.fromkeys(folders))


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def run_compiler(cmd: list[str], cwd: Path, timeout: float, jail: dict | None = None,
                 extra_binds: tuple = ()) -> tuple[int, str]:
    """Run a compiler in its own process group with memory/file limits; the whole group dies on timeout.

    `jail` (sandbox.child_guard()["jail"] with a uid of its own, enabled): the compiler runs on a
    candidate's sources, so it runs in the jail, seeing only `cwd` (its staging folder, writable)
    besides the system and `extra_binds` (read-only: the CUDA toolkit)."""
    env = None
    if jail and jail.get("enabled"):
        from ...isolation.sandbox import jailed_command

        cmd, env = jailed_command(jail, cmd, (Bind(str(cwd), writable=True), *extra_binds), str(cwd),
                                  COMPILER_MEMORY_BYTES, COMPILER_FILE_BYTES)
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=env)
    if env is None:  # the jail sets its own limits
        _limit_compiler(proc.pid)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        return 124, f"error: compilation exceeded the {timeout:.0f} s compile timeout"
    return proc.returncode, out


def stage_copy(source: Path, target: Path) -> str:
    target.parent.mkdir(exist_ok=True)
    shutil.copyfile(source, target)
    return str(target)


def stage_pch(header: Path, stage: Path) -> Path:
    """The precompiled header (and its .gch) copied into the staging folder, read by the jailed compiler."""
    folder = stage / "pch"
    if not (folder / header.name).exists():
        folder.mkdir(exist_ok=True)
        for path in (header, header.with_name(header.name + ".gch")):
            if path.exists():
                shutil.copyfile(path, folder / path.name)
    return folder / header.name
