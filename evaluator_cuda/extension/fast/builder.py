"""The fast build: a workspace solution compiled unit by unit, in parallel, cached by content hash.

    cuda backend:  kernels/*.cu          nvcc, alone, no torch headers (as today)
                   kernels/*_binding.cpp g++ against the slim headers in include/ (no torch: ~1 s)
    host backend:  kernels/*.cpp         g++ against the slim headers (bindings and plain kernels)
    always:        harness/fast_module.cpp (the fast build's binding.cpp: the exported entry points)
linked into one shared library that evaluator_cuda.extension.fast.binding_runtime loads as `cuda_extension`.

Every object is cached under its own content hash (source, the kernels' headers, flags, compiler
versions, slim-header hash), and the linked library under the hash of the whole solution, so an
unchanged solution is a hash lookup and a one-file edit recompiles one file. Compile errors are
cached as well. When a binding needs torch API the slim headers lack, the result says so
(`fallback_reason`) and the caller builds the full torch way.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cuda_agent.jail import Bind

from ...isolation.integrity import digest_path, intact, seal
from ..diagnostics import parse_compiler_output
from ..flags import CXX_FLAGS, NVCC_FLAGS  # the torch build's flags
from ..sources import HEADER_SUFFIXES, select_sources  # one rule for both build paths
from .compile_errors import INCLUDE_DIR, link_gap_reason, shim_gap_reason
from .toolchain import (
    EXTENSION_DEFINES,
    TORCH_NVCC_DEFINES,
    Toolchain,
    ToolchainMissing,
    arch_flags,
    digest_of,
    find_toolchain,
    resolve_arch_list,
)

FAST_BUILDER_VERSION = "1"
HARNESS_SOURCE = Path(__file__).parent / "harness" / "fast_module.cpp"
HARNESS_REL = "<harness>/fast_module.cpp"
SO_NAME = "cuda_extension.so"
EXPORTED_SYMBOLS = ("cuda_agent_fast_attach", "cuda_agent_fast_bindings", "cuda_agent_fast_free_result",
                    "PyInit_cuda_extension")
DEFAULT_COMPILE_TIMEOUT_S = 300.0
_PCH_LOCK = threading.Lock()


@dataclasses.dataclass
class FastBuildResult:
    """Outcome of one fast build.

    ok: the library at so_path is ready. Not ok with fallback_reason set: the slim path cannot serve this
    solution; build it the full torch way. Not ok without a reason: a genuine compile error (diagnostics).
    """

    ok: bool
    so_path: str | None
    diagnostics: list[dict]
    seconds: float
    cache_hit: bool
    fallback_reason: str | None = None
    key: str = ""
    log: str = ""
    units: list[dict] = dataclasses.field(default_factory=list)  # [{"file", "seconds", "cache_hit"}]

    @property
    def status(self) -> str:
        """"built", "compile_error" or "fallback"."""
        if self.ok:
            return "built"
        return "fallback" if self.fallback_reason else "compile_error"


@dataclasses.dataclass(frozen=True)
class CompileUnit:
    rel: str  # workspace-relative path ("kernels/op.cu") or HARNESS_REL
    role: str  # "kernel" | "binding" | "harness"
    compiler: str  # "nvcc" | "cxx"
    source: bytes


def read_solution(solution_dir: Path) -> dict[str, bytes]:
    """relpath -> bytes for every file under solution_dir/kernels."""
    root = Path(solution_dir)
    kernels = root / "kernels"
    if not kernels.is_dir():
        return {}
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(kernels.rglob("*")) if p.is_file()}


def plan_units(sources: dict[str, bytes], backend: str) -> list[CompileUnit]:
    """The compile units of a solution, harness first."""
    units = [CompileUnit(HARNESS_REL, "harness", "cxx", HARNESS_SOURCE.read_bytes())]
    for rel in sorted(sources):
        path = Path(rel)
        if path.suffix in HEADER_SUFFIXES:
            continue
        if path.name.endswith("_binding.cpp"):
            units.append(CompileUnit(rel, "binding", "cxx", sources[rel]))
        elif path.suffix == ".cu":
            units.append(CompileUnit(rel, "kernel", "nvcc", sources[rel]))
        else:
            units.append(CompileUnit(rel, "kernel", "cxx", sources[rel]))
    return units


@functools.lru_cache(maxsize=1)
def slim_headers_digest() -> str:
    """Hash of the slim headers and the harness source (part of every key)."""
    parts: list[bytes | str] = []
    for path in sorted(INCLUDE_DIR.rglob("*")) + [HARNESS_SOURCE]:
        if path.is_file():
            parts += [path.relative_to(INCLUDE_DIR.parent).as_posix(), path.read_bytes()]
    return digest_of(*parts)


def cxx_flags(toolchain: Toolchain, backend: str) -> list[str]:
    flags = [f"-std={toolchain.cxx_standard}", *CXX_FLAGS, "-fPIC", "-fvisibility=hidden"]
    flags += [f"-I{INCLUDE_DIR}", *EXTENSION_DEFINES]
    if backend == "cuda":
        flags += [f"-I{toolchain.cuda_include()}", "-DCUDA_AGENT_FAST_CUDA"]
    return flags


PCH_HEADER = INCLUDE_DIR / "cuda_agent_fast_all.h"


def ensure_precompiled_header(cache_root: Path, flags: list[str], toolchain: Toolchain,
                              timeout_s: float) -> Path | None:
    """The slim headers precompiled with `flags` (built once per toolchain and flag set), or None if g++ cannot.

    Returns the header path to force-include (`-include`); g++ picks up the .gch next to it and, should the
    flags ever disagree, silently parses the header instead (same meaning, only slower).
    """
    key = digest_of(toolchain.identity(), " ".join(flags), slim_headers_digest())
    folder = cache_root / "pch" / key
    header = folder / PCH_HEADER.name
    gch = folder / (PCH_HEADER.name + ".gch")
    if gch.exists() and header.exists():
        return header
    with _PCH_LOCK:
        if gch.exists() and header.exists():
            return header
        folder.mkdir(parents=True, exist_ok=True)
        if not header.exists():
            tmp_header = folder / f".{PCH_HEADER.name}.{os.getpid()}.tmp"
            shutil.copy(PCH_HEADER, tmp_header)
            os.replace(tmp_header, header)
        tmp_gch = folder / f".{gch.name}.{os.getpid()}.tmp"
        code, _ = _run([toolchain.cxx, *flags, "-x", "c++-header", str(header), "-o", str(tmp_gch)], folder, timeout_s)
        if code != 0 or not tmp_gch.exists():
            tmp_gch.unlink(missing_ok=True)
            return None
        os.replace(tmp_gch, gch)
    return header


def nvcc_flags(toolchain: Toolchain, arch_list: str) -> list[str]:
    flags = [f"-std={toolchain.cxx_standard}", *NVCC_FLAGS, *TORCH_NVCC_DEFINES, "-Xcompiler", "-fPIC"]
    return flags + [f"-I{INCLUDE_DIR}", *EXTENSION_DEFINES, *arch_flags(arch_list)]


def link_libraries(toolchain: Toolchain, backend: str, sources: dict[str, bytes]) -> list[str]:
    if backend != "cuda":
        return []
    lib = toolchain.cuda_lib()
    libs = [f"-L{lib}", f"-Wl,-rpath,{lib}", "-lcudart"]
    if any(b"cublas" in data for data in sources.values()):
        libs.append("-lcublas")  # docs/paper.md §3: cuBLAS is allowed for GEMMs
    return libs


class _Cache:
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


def _clean_log(text: str, stage: Path) -> str:
    """Compiler output with the staging folder and the slim-header folder shown as short names."""
    return text.replace(str(stage) + "/", "").replace(str(INCLUDE_DIR) + "/", "<slim-torch>/")


# Limits of one compiler process group (a hostile source can make a compiler loop, eat memory or write a huge file).
COMPILER_MEMORY_BYTES = 24 * 1024**3  # address space; nvcc's cicc/ptxas stay far below this on real kernels
COMPILER_FILE_BYTES = 2 * 1024**3


def _limit_compiler(pid: int) -> None:
    """Memory and file-size limits on a started compiler (prlimit: no preexec_fn, which is unsafe with threads)."""
    try:
        resource.prlimit(pid, resource.RLIMIT_AS, (COMPILER_MEMORY_BYTES, COMPILER_MEMORY_BYTES))
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (COMPILER_FILE_BYTES, COMPILER_FILE_BYTES))
    except (OSError, ValueError):
        pass  # already exited, or limits not allowed here: the timeout still applies


def _run(cmd: list[str], cwd: Path, timeout: float, jail: dict | None = None) -> tuple[int, str]:
    """Run a compiler in its own process group with memory/file limits; the whole group dies on timeout.

    `jail` (sandbox.child_guard()["jail"], enabled): the compiler runs on a candidate's sources, so
    it runs in the jail, seeing only `cwd` (its staging folder, writable) besides the system."""
    env = None
    if jail and jail.get("enabled"):
        from ...isolation.sandbox import jailed_command

        cmd, env = jailed_command(jail, cmd, (Bind(str(cwd), writable=True),), str(cwd), COMPILER_MEMORY_BYTES,
                                  COMPILER_FILE_BYTES)
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


def _hand_over(stage: Path, uid: int) -> None:
    """The staging folder to the jailed compiler's uid (it writes its objects there)."""
    for path in [stage, *stage.rglob("*")]:
        os.chown(path, uid, uid, follow_symlinks=False)


def _stage_copy(source: Path, target: Path) -> str:
    target.parent.mkdir(exist_ok=True)
    shutil.copyfile(source, target)
    return str(target)


def _stage_pch(header: Path, stage: Path) -> Path:
    """The precompiled header (and its .gch) copied into the staging folder, read by the jailed compiler."""
    folder = stage / "pch"
    if not (folder / header.name).exists():
        folder.mkdir(exist_ok=True)
        for path in (header, header.with_name(header.name + ".gch")):
            if path.exists():
                shutil.copyfile(path, folder / path.name)
    return folder / header.name


def build_fast(
    solution: Path | str | dict[str, bytes],
    backend: str = "cuda",
    cache_dir: Path | str | None = None,
    arch_list: str | None = None,
    jobs: int | None = None,
    timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S,
    use_pch: bool = True,
    lookup_only: bool = False,
    jail: dict | None = None,
) -> FastBuildResult | None:
    """Build a workspace solution (a folder, or {relpath: bytes}) into a fast-path cuda_extension library.

    use_pch: force-include the precompiled slim headers into bindings (built on first use, then shared).
    lookup_only: return the cached library if there is one, else None without compiling anything (lets a
    caller answer cache hits in-process and send misses to a sandboxed build child).
    jail: sandbox.child_guard()["jail"]: compile and link the candidate's units in the jail (the staging
    folder is all they see of the cache: the precompiled header and cached objects are copied in).
    """
    begin = time.perf_counter()
    files = solution if isinstance(solution, dict) else read_solution(Path(solution))
    sources = select_sources(files, backend)
    if not any(Path(rel).name.endswith("_binding.cpp") for rel in sources):
        message = "no kernels/*_binding.cpp: nothing registers a function with REGISTER_BINDING"
        return FastBuildResult(False, None, [{"file": "kernels/", "line": None, "message": message}],
                               time.perf_counter() - begin, False)
    try:
        toolchain = find_toolchain(backend)
    except ToolchainMissing as exc:
        return FastBuildResult(False, None, [], time.perf_counter() - begin, False, fallback_reason=str(exc))
    arch = resolve_arch_list(arch_list) if backend == "cuda" else ""
    cache = _Cache(Path(cache_dir) if cache_dir else default_cache_dir())
    units = plan_units(sources, backend)
    headers = [(rel, data) for rel, data in sorted(sources.items()) if Path(rel).suffix in HEADER_SUFFIXES]
    header_parts = [part for rel, data in headers for part in (rel, data)]
    common = [FAST_BUILDER_VERSION, backend, toolchain.identity(), slim_headers_digest()]
    flags = {"cxx": cxx_flags(toolchain, backend)}
    if backend == "cuda":
        flags["nvcc"] = nvcc_flags(toolchain, arch)
    unit_keys = {
        u.rel: digest_of(*common, " ".join(flags[u.compiler]), u.rel, u.source,
                         *(header_parts if u.role != "harness" else []))
        for u in units
    }
    libs = link_libraries(toolchain, backend, sources)
    key = digest_of(*common, arch, " ".join(libs), *[unit_keys[u.rel] for u in units])
    library = cache.library_dir(key) / SO_NAME
    if library.exists() and intact(library):
        return FastBuildResult(True, str(library), [], time.perf_counter() - begin, True, key=key,
                               units=[{"file": u.rel, "seconds": 0.0, "cache_hit": True} for u in units])
    if lookup_only:
        return None

    stage_root = cache.root / "stage"
    stage_root.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f"{key[:12]}-", dir=stage_root))
    jailed = bool(jail and jail.get("enabled"))
    try:
        for rel, data in sources.items():
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            (stage / rel).write_bytes(data)
        (stage / "harness").mkdir()
        shutil.copy(HARNESS_SOURCE, stage / "harness" / HARNESS_SOURCE.name)
        (stage / "obj").mkdir()
        staged_pch: list = [None]
        if jailed and use_pch and any(u.role in ("binding", "harness") for u in units):
            header = ensure_precompiled_header(cache.root, flags["cxx"], toolchain, timeout_s)  # harness input only
            staged_pch[0] = _stage_pch(header, stage) if header else None
        if jailed:
            _hand_over(stage, jail["uid"])

        def compile_unit(unit: CompileUnit) -> dict:
            ukey = unit_keys[unit.rel]
            obj, failure = cache.object_path(ukey), cache.failure_path(ukey)
            if obj.exists() and intact(obj):
                return {"file": unit.rel, "seconds": 0.0, "cache_hit": True, "object": str(obj)}
            if failure.exists() and intact(failure):
                record = json.loads(failure.read_text())
                return {"file": unit.rel, "seconds": 0.0, "cache_hit": True, "error": record["log"]}
            src = stage / ("harness/" + HARNESS_SOURCE.name if unit.role == "harness" else unit.rel)
            tmp_obj = stage / "obj" / f"{ukey}.o"
            exe = toolchain.nvcc if unit.compiler == "nvcc" else toolchain.cxx
            extra = []
            if unit.role in ("binding", "harness") and use_pch:
                header = staged_pch[0] if jailed else ensure_precompiled_header(cache.root, flags["cxx"], toolchain,
                                                                                 timeout_s)
                extra = ["-include", str(header), "-Winvalid-pch"] if header else []
            cmd = [exe, *flags[unit.compiler], *extra, "-c", str(src), "-o", str(tmp_obj)]
            t0 = time.perf_counter()
            code, text = _run(cmd, stage, timeout_s, jail)  # the harness unit too: it shares the staging folder
            seconds = time.perf_counter() - t0
            if code != 0 or not tmp_obj.exists() or tmp_obj.is_symlink():
                log = _clean_log(text, stage).replace("harness/" + HARNESS_SOURCE.name, HARNESS_REL)
                if code != 124:  # a timeout may be the machine's fault: do not cache it
                    cache.write_json(failure, {"log": log})
                return {"file": unit.rel, "seconds": seconds, "cache_hit": False, "error": log}
            cache.publish(tmp_obj, obj)
            return {"file": unit.rel, "seconds": seconds, "cache_hit": False, "object": str(obj)}

        workers = max(1, min(len(units), jobs or os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            outcomes = list(pool.map(compile_unit, units))
        report = [{k: o[k] for k in ("file", "seconds", "cache_hit")} for o in outcomes]
        failed = [(u, o) for u, o in zip(units, outcomes) if "error" in o]
        if failed:
            return _compile_failure(failed, report, begin, key)

        version_script = stage / "exports.map"
        version_script.write_text("{ global: " + "; ".join(EXPORTED_SYMBOLS) + "; local: *; };\n")
        tmp_so = stage / SO_NAME
        objects = [o["object"] for o in outcomes]
        if jailed:  # the link sees its own copies of the objects, never the cache
            objects = [_stage_copy(Path(o), stage / "link" / f"{i}.o") for i, o in enumerate(objects)]
        cmd = [toolchain.cxx, "-shared", "-o", str(tmp_so), *objects,
               f"-Wl,--version-script={version_script}", "-Wl,--no-undefined", *libs, "-ldl"]
        t0 = time.perf_counter()
        code, text = _run(cmd, stage, timeout_s, jail)
        report.append({"file": "<link>", "seconds": time.perf_counter() - t0, "cache_hit": False})
        if code != 0 or not tmp_so.exists():
            log = _clean_log(text, stage)
            reason = link_gap_reason(log)
            diagnostics = parse_compiler_output(log)
            return FastBuildResult(False, None, diagnostics, time.perf_counter() - begin, False,
                                   fallback_reason=reason, key=key, log=log, units=report)
        if tmp_so.is_symlink() or not tmp_so.is_file():
            return FastBuildResult(False, None, [{"file": None, "line": None, "message": "the link wrote no library"}],
                                   time.perf_counter() - begin, False, key=key, units=report)
        cache.publish(tmp_so, library)
        return FastBuildResult(True, str(library), [], time.perf_counter() - begin, False, key=key, units=report)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _compile_failure(failed: list, report: list[dict], begin: float, key: str) -> FastBuildResult:
    """A failed compile: the candidate's error, or a fallback when a torch-facing unit hit the shim's limits."""
    diagnostics: list[dict] = []
    logs = []
    reason = None
    for unit, outcome in failed:
        unit_diagnostics = parse_compiler_output(outcome["error"])
        reason = reason or shim_gap_reason(unit.role, unit.rel, unit.source, unit_diagnostics)
        diagnostics += unit_diagnostics
        logs.append(outcome["error"])
    all_cached = all(u["cache_hit"] for u in report)
    return FastBuildResult(False, None, diagnostics, time.perf_counter() - begin, all_cached,
                           fallback_reason=reason, key=key, log="\n".join(logs), units=report)


_PROBE_BINDING = b"""// A binding with no kernel: building it precompiles everything fast builds share.
#include "binding_registry.h"
int64_t cuda_agent_fast_probe(int64_t x) { return x + 1; }
REGISTER_BINDING(probe, cuda_agent_fast_probe);
"""


def warm_up(backend: str = "cuda", cache_dir: Path | str | None = None,
            arch_list: str | None = None) -> FastBuildResult:
    """Build what every fast build shares (the precompiled slim headers, the harness object) ahead of time.

    Call once when a worker starts, so a candidate's first build pays only for its own files.
    """
    return build_fast({"kernels/probe_binding.cpp": _PROBE_BINDING}, backend, cache_dir, arch_list)
