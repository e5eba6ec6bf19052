"""The precompiled header of the binding registry for torch's build.

torch/extension.h dominates build time. The first successful build on a machine compiles
binding_registry.h (and with it torch/extension.h) into a GCC precompiled header with the exact
flags torch's build used, read from that build's build.ninja. Later builds force-include it
(`-include`), which halves each binding file's compile (28 s to 15 s on a 2-core machine; the
.gch is about 0.8 GB). If GCC finds the .gch unusable it falls back to the plain header, so a
stale PCH costs time, never correctness. The build's own include folder is left out of the flags
(the header is compiled from the harness's copy); any other flag that is not plain refuses it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from cuda_agent.workspace import TEMPLATES

from ..settings import EvalSettings
from .flags import CXX_FLAGS, torch_release


def pch_folder(settings: EvalSettings) -> Path:
    digest = hashlib.sha256()
    meta = {"torch": torch_release(), "backend": settings.backend, "cxx": CXX_FLAGS, "python": sys.version_info[:2],
            "compiler": os.environ.get("CXX", "c++")}
    digest.update(json.dumps(meta, sort_keys=True).encode())
    digest.update((TEMPLATES / "binding_registry.h").read_bytes())
    return settings.cache_path() / "pch" / digest.hexdigest()[:24]


def ready_pch(settings: EvalSettings) -> Path | None:
    """The header to force-include if its precompiled form exists, else None."""
    header = pch_folder(settings) / "binding_registry.h"
    return header if (header.parent / "binding_registry.h.gch").exists() else None


def _ninja_variables(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        if " = " in line and not line.startswith((" ", "\t", "rule", "build")):
            name, _, value = line.partition(" = ")
            values[name.strip()] = value.strip()
    return values


_COMPILERS = {"c++", "g++", "gcc", "cc", "clang++", "clang"}
_SAFE_FLAG_PREFIXES = ("-D", "-U", "-std=", "-O", "-W", "-g", "-fPIC", "-fvisibility", "-fopenmp", "-fno-", "-m",
                       "-pthread", "-I/", "-isystem")


def _safe_command(cxx: list[str], flags: list[str], untrusted_roots: tuple[str, ...]) -> bool:
    """Whether the compiler and flags read from a build.ninja may run outside the jail: the build
    child that wrote the file ran candidate code, so only a known compiler and plain flags pass
    (no plugins, wrappers, spec files or response files), and no include folder of the build."""
    if len(cxx) != 1 or os.path.basename(cxx[0]) not in _COMPILERS:
        return False
    after_isystem = False
    for flag in flags:
        if after_isystem:
            after_isystem = False
            if not flag.startswith("/") or any(flag.startswith(root) for root in untrusted_roots):
                return False
            continue
        if flag == "-isystem":
            after_isystem = True
            continue
        if not flag.startswith(_SAFE_FLAG_PREFIXES) or flag.startswith(("-fplugin", "-mno-red-zone=")):
            return False
        path = flag[2:] if flag.startswith("-I") else flag[len("-isystem"):] if flag.startswith("-isystem") else ""
        if path and any(path.startswith(root) for root in untrusted_roots):
            return False
    return True


def _without_own_includes(flags: list[str], work: str) -> list[str]:
    """The flags less `-I` of the build's own folders: the header is compiled from a trusted copy
    and needs only torch's folders (the sources the build wrote are never read for it)."""
    return [f for f in flags if not (f.startswith("-I") and Path(os.path.normpath(f[2:])).is_relative_to(work))]


def make_pch(ninja_file: Path, settings: EvalSettings) -> bool:
    """Compile the registry header into a .gch with the flags of a build that just succeeded."""
    import shlex
    import subprocess

    folder = pch_folder(settings)
    if (folder / "binding_registry.h.gch").exists() or not ninja_file.exists():
        return False
    try:
        variables = _ninja_variables(ninja_file)
        cxx = shlex.split(variables.get("cxx", "c++"))
        cflags = shlex.split(variables.get("cflags", ""))
        post = shlex.split(variables.get("post_cflags", ""))
    except (OSError, ValueError):
        return False
    work = str(ninja_file.parent.parent)
    cflags = _without_own_includes(cflags, work)
    if not _safe_command(cxx, cflags + post, (work, str(settings.cache_path()))):
        return False
    folder.parent.mkdir(parents=True, exist_ok=True)
    lock = open(folder.parent / f"{folder.name}.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        return False  # another process is making it
    if (folder / "binding_registry.h.gch").exists():
        lock.close()
        return False
    staging = Path(tempfile.mkdtemp(prefix="pch-", dir=settings.cache_path()))
    staging.chmod(0o755)  # a jailed build child (another uid) reads the header through a read-only bind
    try:
        shutil.copy(TEMPLATES / "binding_registry.h", staging / "binding_registry.h")
        command = cxx + cflags + ["-x", "c++-header", str(staging / "binding_registry.h"), "-o",
                                  str(staging / "binding_registry.h.gch")] + post
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=settings.compile_timeout_s, start_new_session=True)
        if done.returncode != 0:
            return False
        try:
            os.rename(staging, folder)
        except OSError:
            return False
        return True
    except (OSError, subprocess.TimeoutExpired):
        return False
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        lock.close()
