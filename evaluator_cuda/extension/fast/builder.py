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
import shutil
import time
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ...isolation.integrity import intact
from ..diagnostics import parse_compiler_output
from ..flags import CXX_FLAGS, NVCC_FLAGS  # the torch build's flags
from ..sources import HEADER_SUFFIXES, select_sources  # one rule for both build paths
from .compile_errors import INCLUDE_DIR, link_gap_reason, shim_gap_reason
from .stage import (BuildCache, clean_log, default_cache_dir, run_compiler, stage_copy, stage_pch, staging_folder,
                    toolchain_binds)
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
        code, _ = run_compiler([toolchain.cxx, *flags, "-x", "c++-header", str(header), "-o", str(tmp_gch)], folder, timeout_s)
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


@dataclasses.dataclass(frozen=True)
class BuildPlan:
    """What a solution compiles to: its units, their flags and keys, and the library's key."""

    backend: str
    toolchain: Toolchain
    sources: dict[str, bytes]
    units: list[CompileUnit]
    flags: dict[str, list[str]]
    unit_keys: dict[str, str]
    libs: list[str]
    key: str

    def uses_pch(self) -> bool:
        return any(u.role in ("binding", "harness") for u in self.units)


def plan_build(files: dict[str, bytes], backend: str, arch_list: str | None) -> BuildPlan | FastBuildResult:
    """The build plan of a solution, or the result that ends the build before it starts (no
    binding to register; no toolchain: a fallback)."""
    sources = select_sources(files, backend)
    if not any(Path(rel).name.endswith("_binding.cpp") for rel in sources):
        message = "no kernels/*_binding.cpp: nothing registers a function with REGISTER_BINDING"
        return FastBuildResult(False, None, [{"file": "kernels/", "line": None, "message": message}], 0.0, False)
    try:
        toolchain = find_toolchain(backend)
    except ToolchainMissing as exc:
        return FastBuildResult(False, None, [], 0.0, False, fallback_reason=str(exc))
    arch = resolve_arch_list(arch_list) if backend == "cuda" else ""
    units = plan_units(sources, backend)
    header_parts = [part for rel, data in sorted(sources.items()) if Path(rel).suffix in HEADER_SUFFIXES
                    for part in (rel, data)]
    common = [FAST_BUILDER_VERSION, backend, toolchain.identity(), slim_headers_digest()]
    flags = {"cxx": cxx_flags(toolchain, backend)}
    if backend == "cuda":
        flags["nvcc"] = nvcc_flags(toolchain, arch)
    unit_keys = {u.rel: digest_of(*common, " ".join(flags[u.compiler]), u.rel, u.source,
                                  *(header_parts if u.role != "harness" else [])) for u in units}
    libs = link_libraries(toolchain, backend, sources)
    key = digest_of(*common, arch, " ".join(libs), *[unit_keys[u.rel] for u in units])
    return BuildPlan(backend, toolchain, sources, units, flags, unit_keys, libs, key)


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
    jail: sandbox.child_guard()["jail"]: compile and link the candidate's units in the jail, under a uid
    claimed for this build (the staging folder is all they see of the cache: the precompiled header and
    cached objects are copied in).
    """
    begin = time.perf_counter()
    files = solution if isinstance(solution, dict) else read_solution(Path(solution))
    plan = plan_build(files, backend, arch_list)
    if isinstance(plan, FastBuildResult):
        return dataclasses.replace(plan, seconds=time.perf_counter() - begin)
    cache = BuildCache(Path(cache_dir) if cache_dir else default_cache_dir())
    library = cache.library_dir(plan.key) / SO_NAME
    if library.exists() and intact(library):
        return FastBuildResult(True, str(library), [], time.perf_counter() - begin, True, key=plan.key,
                               units=[{"file": u.rel, "seconds": 0.0, "cache_hit": True} for u in plan.units])
    if lookup_only:
        return None
    from ...isolation.sandbox import own_uid

    with own_uid(jail) as jail, staging_folder(cache, plan.key) as stage:
        pch = _prepare_stage(plan, cache, stage, jail, use_pch, timeout_s)
        workers = max(1, min(len(plan.units), jobs or os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            outcomes = list(pool.map(lambda u: _compile_unit(u, plan, cache, stage, pch, jail, timeout_s),
                                     plan.units))
        report = [{k: o[k] for k in ("file", "seconds", "cache_hit")} for o in outcomes]
        failed = [(u, o) for u, o in zip(plan.units, outcomes) if "error" in o]
        if failed:
            return _compile_failure(failed, report, begin, plan.key)
        return _link(plan, cache, stage, [o["object"] for o in outcomes], report, jail, timeout_s, begin)


def _jailed(jail: dict | None) -> bool:
    return bool(jail and jail.get("enabled"))


def _prepare_stage(plan: BuildPlan, cache: BuildCache, stage: Path, jail: dict | None, use_pch: bool,
                   timeout_s: float) -> Path | None:
    """The sources, the harness and the object folder in the staging folder (handed to the jail's
    uid); returns the precompiled header bindings force-include (None: none)."""
    for rel, data in plan.sources.items():
        (stage / rel).parent.mkdir(parents=True, exist_ok=True)
        (stage / rel).write_bytes(data)
    (stage / "harness").mkdir()
    shutil.copy(HARNESS_SOURCE, stage / "harness" / HARNESS_SOURCE.name)
    (stage / "obj").mkdir()
    header = None
    if use_pch and plan.uses_pch():
        header = ensure_precompiled_header(cache.root, plan.flags["cxx"], plan.toolchain, timeout_s)
        if header and _jailed(jail):  # the jailed compiler sees the staging folder only
            header = stage_pch(header, stage)
    if _jailed(jail):
        from ...isolation.sandbox import hand_over

        hand_over(stage, jail["uid"])
    return header


def _compile_unit(unit: CompileUnit, plan: BuildPlan, cache: BuildCache, stage: Path, pch: Path | None,
                  jail: dict | None, timeout_s: float) -> dict:
    """One unit: from the cache (object or cached error), else compiled in the staging folder."""
    ukey = plan.unit_keys[unit.rel]
    obj, failure = cache.object_path(ukey), cache.failure_path(ukey)
    if obj.exists() and intact(obj):
        return {"file": unit.rel, "seconds": 0.0, "cache_hit": True, "object": str(obj)}
    if failure.exists() and intact(failure):
        return {"file": unit.rel, "seconds": 0.0, "cache_hit": True, "error": json.loads(failure.read_text())["log"]}
    src = stage / ("harness/" + HARNESS_SOURCE.name if unit.role == "harness" else unit.rel)
    tmp_obj = stage / "obj" / f"{ukey}.o"
    exe = plan.toolchain.nvcc if unit.compiler == "nvcc" else plan.toolchain.cxx
    extra = ["-include", str(pch), "-Winvalid-pch"] if pch and unit.role in ("binding", "harness") else []
    t0 = time.perf_counter()
    code, text = run_compiler([exe, *plan.flags[unit.compiler], *extra, "-c", str(src), "-o", str(tmp_obj)],
                              stage, timeout_s, jail,  # the harness unit too: it shares the staging folder
                              toolchain_binds(plan.toolchain.cuda_home, plan.toolchain.cxx))
    seconds = time.perf_counter() - t0
    if code != 0 or not tmp_obj.exists() or tmp_obj.is_symlink():
        log = clean_log(text, stage).replace("harness/" + HARNESS_SOURCE.name, HARNESS_REL)
        if code != 124:  # a timeout may be the machine's fault: do not cache it
            cache.write_json(failure, {"log": log})
        return {"file": unit.rel, "seconds": seconds, "cache_hit": False, "error": log}
    cache.publish(tmp_obj, obj)
    return {"file": unit.rel, "seconds": seconds, "cache_hit": False, "object": str(obj)}


def _link(plan: BuildPlan, cache: BuildCache, stage: Path, objects: list[str], report: list[dict],
          jail: dict | None, timeout_s: float, begin: float) -> FastBuildResult:
    """Link the objects into the library (exporting only the harness's entry points) and publish it."""
    version_script = stage / "exports.map"
    version_script.write_text("{ global: " + "; ".join(EXPORTED_SYMBOLS) + "; local: *; };\n")
    tmp_so = stage / SO_NAME
    if _jailed(jail):  # the link sees its own copies of the objects, never the cache
        objects = [stage_copy(Path(o), stage / "link" / f"{i}.o") for i, o in enumerate(objects)]
    cmd = [plan.toolchain.cxx, "-shared", "-o", str(tmp_so), *objects,
           f"-Wl,--version-script={version_script}", "-Wl,--no-undefined", *plan.libs, "-ldl"]
    t0 = time.perf_counter()
    code, text = run_compiler(cmd, stage, timeout_s, jail,
                              toolchain_binds(plan.toolchain.cuda_home, plan.toolchain.cxx))
    report.append({"file": "<link>", "seconds": time.perf_counter() - t0, "cache_hit": False})
    if code != 0 or not tmp_so.exists():
        log = clean_log(text, stage)
        return FastBuildResult(False, None, parse_compiler_output(log), time.perf_counter() - begin, False,
                               fallback_reason=link_gap_reason(log), key=plan.key, log=log, units=report)
    if tmp_so.is_symlink() or not tmp_so.is_file():
        return FastBuildResult(False, None, [{"file": None, "line": None, "message": "the link wrote no library"}],
                               time.perf_counter() - begin, False, key=plan.key, units=report)
    library = cache.library_dir(plan.key) / SO_NAME
    cache.publish(tmp_so, library)
    return FastBuildResult(True, str(library), [], time.perf_counter() - begin, False, key=plan.key, units=report)


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
