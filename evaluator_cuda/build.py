"""Build a workspace solution into the importable extension module `cuda_extension`.

The harness's own `binding.cpp` and `binding_registry.h` (templates/) are always compiled,
never a workspace copy, together with the workspace's kernels:
  cuda backend: kernels/*.cu and kernels/*_binding.cpp
  host backend: kernels/*.cpp (plain C++ kernels and their bindings), no CUDA at all
Headers under kernels/ (.h, .cuh, .hpp) are copied alongside. The build runs in a child
process with a timeout; its result is cached under `<cache>/build/<hash>` where the hash
covers every source byte, the templates, the backend, the arch list, the flags and the
torch/Python versions, so an unchanged solution never compiles twice (failures included).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from .diagnostics import parse_compiler_output
from .sandbox import child_guard, Child, ChildFailed
from .settings import EvalSettings

BUILDER_VERSION = "1"
TEMPLATES_DIR = Path(__file__).parent / "templates"
HARNESS_FILES = ("binding.cpp", "binding_registry.h")
HEADER_SUFFIXES = (".h", ".cuh", ".hpp", ".inl")
# reference.md §3: -O3 for the host compiler, -O3 --use_fast_math for nvcc. The C++ standard is
# left to torch (C++17 in the CUDA-Agent era, C++20 from torch 2.10 on): forcing -std=c++17
# after torch's own flag breaks torch's headers on newer releases.
CXX_FLAGS = ("-O3",)
NVCC_FLAGS = ("-O3", "--use_fast_math")
SO_NAME = "cuda_extension.so"


@dataclasses.dataclass
class BuildResult:
    status: str  # "built" | "compile_error" | "infra_error"
    diagnostics: list[dict]
    so_path: str | None
    build_seconds: float
    cache_hit: bool
    key: str = ""
    log: str = ""


def select_sources(files: dict[str, bytes], backend: str) -> dict[str, bytes]:
    """The workspace files that go into the build on `backend` (relpaths under kernels/)."""
    chosen = {}
    for rel, data in files.items():
        path = Path(rel)
        if not path.parts or path.parts[0] != "kernels" or path.name in HARNESS_FILES:
            continue
        if path.is_absolute() or ".." in path.parts or "\\" in rel:
            continue  # a path that would leave the staging folder is never written, let alone compiled
        is_binding = path.name.endswith("_binding.cpp")
        if path.suffix in HEADER_SUFFIXES or is_binding:
            chosen[rel] = data
        elif backend == "cuda" and path.suffix == ".cu":
            chosen[rel] = data
        elif backend == "host" and path.suffix == ".cpp":
            chosen[rel] = data
    return chosen


def _torch_version() -> str:
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:
        import torch

        return torch.__version__


def build_key(sources: dict[str, bytes], settings: EvalSettings) -> str:
    """Content hash of everything that decides the built module."""
    digest = hashlib.sha256()
    meta = {
        "builder": BUILDER_VERSION,
        "backend": settings.backend,
        "arch": settings.arch_list if settings.backend == "cuda" else "",
        "cxx": CXX_FLAGS,
        "nvcc": NVCC_FLAGS,
        "torch": _torch_version(),
        "python": sys.version_info[:2],
    }
    digest.update(json.dumps(meta, sort_keys=True).encode())
    for name in HARNESS_FILES:
        digest.update(name.encode() + b"\0" + (TEMPLATES_DIR / name).read_bytes() + b"\0")
    for rel in sorted(sources):
        digest.update(rel.encode() + b"\0" + sources[rel] + b"\0")
    return digest.hexdigest()[:32]


def build_cache_dir(settings: EvalSettings) -> Path:
    return settings.cache_path() / "build"


def _cached(entry: Path) -> BuildResult | None:
    so = entry / SO_NAME
    if so.exists():
        return BuildResult("built", [], str(so), 0.0, True, entry.name)
    failed = entry / "compile_error.json"
    if failed.exists():
        data = json.loads(failed.read_text())
        return BuildResult("compile_error", data["diagnostics"], None, 0.0, True, entry.name, data.get("log", ""))
    return None


def build_env(settings: EvalSettings) -> dict[str, str]:
    """Environment of a compiling child: the arch list is always explicit (no GPU needed to build)."""
    return {
        "TORCH_CUDA_ARCH_LIST": settings.arch_list,
        "TORCH_EXTENSIONS_DIR": str(settings.cache_path() / "torch_extensions"),
    }


def build_workspace(files: dict[str, bytes], settings: EvalSettings) -> BuildResult:
    """Compile a workspace's kernels (relpath -> bytes) into cuda_extension; cached by content hash."""
    sources = select_sources(files, settings.backend)
    if not any(Path(r).name.endswith("_binding.cpp") for r in sources):
        diag = [{"file": "kernels/", "line": None, "message": "no kernels/*_binding.cpp: nothing registers a function with REGISTER_BINDING"}]
        return BuildResult("compile_error", diag, None, 0.0, False)
    if settings.fast_build:
        fast = _fast_build(files, settings)
        if fast is not None:
            return fast
    key = build_key(sources, settings)
    cache = build_cache_dir(settings)
    entry = cache / key
    hit = _cached(entry)
    if hit is not None:
        return hit
    cache.mkdir(parents=True, exist_ok=True)
    # One build per key at a time across processes: a second identical request waits, then hits.
    with open(cache / f"{key}.lock", "w") as lock:
        waited = time.perf_counter()
        fcntl.flock(lock, fcntl.LOCK_EX)
        hit = _cached(entry)
        if hit is not None:
            hit.build_seconds = time.perf_counter() - waited
            return hit
        return _build_locked(sources, settings, key, cache, entry)


_RUNTIME_READY: set[str] = set()  # fast-build cache folders whose binding runtime this process has ensured


def fast_build_dir(settings: EvalSettings) -> Path:
    return settings.cache_path() / "fastbuild"


def _fast_build(files: dict[str, bytes], settings: EvalSettings) -> BuildResult | None:
    """The fast path (evaluator_cuda.fastbuild): a result, or None when the torch build must decide.

    Its libraries need the binding runtime (a torch extension built once per machine); it is
    built here, in a build child, so a candidate process never compiles harness code.
    """
    from .fastbuild.build_adapter import fast_build_workspace
    from .fastbuild.runtime import binding_runtime_ready

    result = fast_build_workspace(files, settings)
    folder = fast_build_dir(settings)
    if result is None or result.status != "built" or str(folder) in _RUNTIME_READY or binding_runtime_ready(folder):
        return result
    begin = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="runtime-") as scratch, Child("build", Path(scratch), env=build_env(settings), guard=child_guard(settings)) as child:
            reply = child.request({"cmd": "runtime", "cache_dir": str(fast_build_dir(settings))}, timeout=settings.compile_timeout_s)
    except ChildFailed as exc:
        return BuildResult("infra_error", [{"file": None, "line": None, "message": f"binding runtime: {exc}"}], None, result.build_seconds, False, result.key)
    if not reply.get("ok"):
        return BuildResult("infra_error", [{"file": None, "line": None, "message": f"binding runtime: {reply.get('message')}"}], None, result.build_seconds, False, result.key)
    result.build_seconds += time.perf_counter() - begin
    _RUNTIME_READY.add(str(fast_build_dir(settings)))
    return result


def _build_locked(sources: dict[str, bytes], settings: EvalSettings, key: str, cache: Path, entry: Path) -> BuildResult:
    work = Path(tempfile.mkdtemp(prefix=f"tmp-{key}-", dir=cache))
    begin = time.perf_counter()
    try:
        src = work / "src"
        (src / "kernels").mkdir(parents=True)
        pch = ready_pch(settings)
        shutil.copy(TEMPLATES_DIR / "binding.cpp", src / "binding.cpp")
        if pch is None:
            shutil.copy(TEMPLATES_DIR / "binding_registry.h", src / "binding_registry.h")
        for rel, data in sources.items():
            target = src / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        compiled = [str(src / "binding.cpp")] + [str(src / r) for r in sorted(sources) if Path(r).suffix in (".cpp", ".cu")]
        request = {
            "cmd": "build",
            "sources": compiled,
            "build_dir": str(work / "build"),
            "include_dirs": [str(pch.parent if pch else src)],
            "backend": settings.backend,
            "cflags": list(CXX_FLAGS) + (["-include", str(pch), "-Winvalid-pch"] if pch else []),
            "cuda_cflags": list(NVCC_FLAGS),
        }
        try:
            with Child("build", work, env=build_env(settings), guard=child_guard(settings)) as child:
                reply = child.request(request, timeout=settings.compile_timeout_s)
        except ChildFailed as exc:
            seconds = time.perf_counter() - begin
            if exc.kind == "timeout":
                diag = [{"file": None, "line": None, "message": f"compilation exceeded the {settings.compile_timeout_s:.0f} s compile timeout"}]
                return BuildResult("compile_error", diag, None, seconds, False, key, exc.log_tail)
            diag = [{"file": None, "line": None, "message": str(exc)}]
            return BuildResult("infra_error", diag, None, seconds, False, key, exc.log_tail)
        seconds = time.perf_counter() - begin
        if not reply.get("ok"):
            text = reply.get("detail") or reply.get("message", "")
            if reply.get("kind") != "compile":
                return BuildResult("infra_error", [{"file": None, "line": None, "message": reply.get("message", "")}], None, seconds, False, key, text)
            diag = parse_compiler_output(text, roots=[str(src)] + ([str(pch.parent)] if pch else []))
            _publish(work, entry, failure={"diagnostics": diag, "log": text[-20000:]})
            return BuildResult("compile_error", diag, None, seconds, False, key, text)
        shutil.copy(reply["so_path"], work / SO_NAME)
        if pch is None:
            make_pch(work / "build" / "build.ninja", settings)
        _publish(work, entry)
        final = entry / SO_NAME
        return BuildResult("built", [], str(final), seconds, False, key)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _publish(work: Path, entry: Path, failure: dict | None = None) -> None:
    """Move the result into the cache entry atomically (a concurrent identical build may win)."""
    staged = work / "entry"
    staged.mkdir()
    if failure is not None:
        (staged / "compile_error.json").write_text(json.dumps(failure))
    else:
        os.replace(work / SO_NAME, staged / SO_NAME)
    try:
        os.rename(staged, entry)
    except OSError:
        pass  # another process published the same key first; its result is identical


# ---- precompiled header of the binding registry (torch/extension.h dominates build time) ----
#
# The first successful build on a machine compiles binding_registry.h (and with it
# torch/extension.h) into a GCC precompiled header with the exact flags torch's build used, read
# from that build's build.ninja. Later builds force-include it (`-include`), which cuts each
# binding file's compile from ~26 s to a few seconds. If GCC finds the .gch unusable it falls
# back to the plain header, so a stale PCH costs time, never correctness.


def pch_folder(settings: EvalSettings) -> Path:
    digest = hashlib.sha256()
    meta = {"torch": _torch_version(), "backend": settings.backend, "cxx": CXX_FLAGS, "python": sys.version_info[:2], "compiler": os.environ.get("CXX", "c++")}
    digest.update(json.dumps(meta, sort_keys=True).encode())
    digest.update((TEMPLATES_DIR / "binding_registry.h").read_bytes())
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
    try:
        shutil.copy(TEMPLATES_DIR / "binding_registry.h", staging / "binding_registry.h")
        command = cxx + cflags + ["-x", "c++-header", str(staging / "binding_registry.h"), "-o", str(staging / "binding_registry.h.gch")] + post
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=settings.compile_timeout_s, start_new_session=True)
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
