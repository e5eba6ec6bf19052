"""torch's own build of a workspace solution into the extension module `cuda_extension`.

The harness's own `binding.cpp` and `binding_registry.h` (cuda_agent/templates) are always compiled,
never a workspace copy, together with the workspace's kernels:
  cuda backend: kernels/*.cu and kernels/*_binding.cpp
  host backend: kernels/*.cpp (plain C++ kernels and their bindings), no CUDA at all
Headers under kernels/ (.h, .cuh, .hpp) are copied alongside. The build runs in a child
process with a timeout; its result is cached under `<cache>/build/<hash>` where the hash
covers every source byte, the templates, the backend, the arch list, the flags and the
torch/Python versions, so an unchanged solution never compiles twice (failures included).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from cuda_agent.workspace import HARNESS_FILES, TEMPLATES

from cuda_agent.jail import Bind

from ..isolation.integrity import intact, seal
from ..isolation.sandbox import Child, ChildFailed, child_guard, hand_over, own_uid
from ..settings import EvalSettings
from .diagnostics import parse_compiler_output
from .fast.stage import toolchain_binds
from .fast.toolchain import ToolchainMissing, find_toolchain
from .flags import CXX_FLAGS, NVCC_FLAGS, torch_release
from .pch import make_pch, ready_pch
from .result import BuildResult

BUILDER_VERSION = "1"
SO_NAME = "cuda_extension.so"


def build_key(sources: dict[str, bytes], settings: EvalSettings) -> str:
    """Content hash of everything that decides the built module."""
    digest = hashlib.sha256()
    meta = {
        "builder": BUILDER_VERSION,
        "backend": settings.backend,
        "arch": settings.arch_list if settings.backend == "cuda" else "",
        "cxx": CXX_FLAGS,
        "nvcc": NVCC_FLAGS,
        "torch": torch_release(),
        "python": sys.version_info[:2],
    }
    digest.update(json.dumps(meta, sort_keys=True).encode())
    for name in HARNESS_FILES:
        _field(digest, name.encode())
        _field(digest, (TEMPLATES / name).read_bytes())
    _field(digest, str(len(sources)).encode())
    for rel in sorted(sources):  # length-prefixed: no file name or content can pose as another's
        _field(digest, rel.encode())
        _field(digest, sources[rel])
    return digest.hexdigest()[:32]


def _field(digest, data: bytes) -> None:
    digest.update(len(data).to_bytes(8, "little"))
    digest.update(data)


def build_cache_dir(settings: EvalSettings) -> Path:
    return settings.cache_path() / "build"


def _cached(entry: Path) -> BuildResult | None:
    """The cache entry's result when its files match the digests the harness wrote beside them; a
    tampered or unsealed entry is removed (and rebuilt by the caller)."""
    so = entry / SO_NAME
    failed = entry / "compile_error.json"
    if not (so.exists() or failed.exists()):
        return None
    if not (intact(so) if so.exists() else intact(failed)):
        shutil.rmtree(entry, ignore_errors=True)
        return None
    if so.exists():
        return BuildResult("built", [], str(so), 0.0, True, entry.name)
    if failed.exists():
        data = json.loads(failed.read_text())
        return BuildResult("compile_error", data["diagnostics"], None, 0.0, True, entry.name, data.get("log", ""))
    return None


def build_env(settings: EvalSettings) -> dict[str, str]:
    """Environment of a compiling child: the arch list is always explicit (no GPU needed to build), and
    the compilers are the fast build's (a jailed child inherits no CXX or CUDA_HOME to find them by)."""
    env = {
        "TORCH_CUDA_ARCH_LIST": settings.arch_list,
        "TORCH_EXTENSIONS_DIR": str(settings.cache_path() / "torch_extensions"),
    }
    try:
        toolchain = find_toolchain(settings.backend)
    except ToolchainMissing:
        return env  # the build itself says what is missing
    env["CXX"] = toolchain.cxx
    if toolchain.cuda_home:
        env["CUDA_HOME"] = toolchain.cuda_home
    return env


def build_with_torch(sources: dict[str, bytes], settings: EvalSettings) -> BuildResult:
    """Compile the selected sources with torch's build, cached by content hash."""
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


def _build_locked(sources: dict[str, bytes], settings: EvalSettings, key: str, cache: Path, entry: Path) -> BuildResult:
    work = Path(tempfile.mkdtemp(prefix=f"tmp-{key}-", dir=cache))
    begin = time.perf_counter()
    try:
        src = work / "src"
        (src / "kernels").mkdir(parents=True)
        pch = ready_pch(settings)
        shutil.copy(TEMPLATES / "binding.cpp", src / "binding.cpp")
        if pch is None:
            shutil.copy(TEMPLATES / "binding_registry.h", src / "binding_registry.h")
        for rel, data in sources.items():
            target = src / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        units = [r for r in sorted(sources) if Path(r).suffix in (".cpp", ".cu")]
        compiled = [str(src / "binding.cpp")] + [str(src / r) for r in units]
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
            guard = child_guard(settings)
            binds = (Bind(str(work), writable=True),) + ((Bind(str(pch.parent)),) if pch else ())
            env = build_env(settings)
            binds += toolchain_binds(env.get("CUDA_HOME"), env.get("CXX"))
            with own_uid(guard["jail"]) as jail:
                if jail["enabled"]:
                    hand_over(work, jail["uid"])
                    if pch:  # made in a private temporary folder: readable by the jail's uid from now on
                        pch.parent.chmod(0o755)
                with Child("build", work, env=env, guard={**guard, "jail": jail}, binds=binds) as child:
                    reply = child.request(request, timeout=settings.compile_timeout_s)
        except ChildFailed as exc:
            # The build child imports the module it built, so the candidate's static initialisers run
            # there: its death or a broken reply is the candidate's compile_error, like a build that
            # outlives its limit, never an infra_error (docs/cheats.md #25). None of these is cached.
            seconds = time.perf_counter() - begin
            message = (f"compilation exceeded the {settings.compile_timeout_s:.0f} s compile timeout"
                       if exc.kind == "timeout" else f"the build failed: {exc}")
            diag = [{"file": None, "line": None, "message": message}]
            return BuildResult("compile_error", diag, None, seconds, False, key, exc.log_tail)
        seconds = time.perf_counter() - begin
        if not reply.get("ok"):
            text = reply.get("detail") or reply.get("message", "")
            if reply.get("kind") != "compile":  # a failure the build child reports as its own: see above
                diag = [{"file": None, "line": None, "message": f"the build failed: {reply.get('message', '')}"}]
                return BuildResult("compile_error", diag, None, seconds, False, key, text)
            diag = parse_compiler_output(text, roots=[str(src)] + ([str(pch.parent)] if pch else []))
            _publish(work, entry, failure={"diagnostics": diag, "log": text[-20000:]})
            return BuildResult("compile_error", diag, None, seconds, False, key, text)
        built = sorted((work / "build").glob("cuda_extension*.so"))  # never a path the child names
        if not built or built[0].is_symlink() or not built[0].is_file():
            diag = [{"file": None, "line": None, "message": "the build produced no cuda_extension library"}]
            return BuildResult("compile_error", diag, None, seconds, False, key)
        shutil.copyfile(built[0], work / SO_NAME)
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
        seal(staged / "compile_error.json")
    else:
        os.replace(work / SO_NAME, staged / SO_NAME)
        seal(staged / SO_NAME)
    try:
        os.rename(staged, entry)
    except OSError:
        pass  # another process published the same key first; its result is identical
