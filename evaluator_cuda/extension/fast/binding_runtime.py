"""The binding runtime: built once per machine with the real torch headers, then loads fast-built libraries.

`ensure_binding_runtime()` compiles runtime/binding_runtime.cpp with torch.utils.cpp_extension.load
the first time (≈15–30 s; cached under a key of the runtime source, the ABI header, torch, CUDA and
Python versions) and imports it. Call it once when a worker starts, before candidates are loaded.
`load_fast_extension(so_path)` attaches a fast-built library to the runtime and registers the module
`cuda_extension` in sys.modules, so `import cuda_extension` in model_new.py finds it. A fast-built library
also imports like a torch-built extension (importlib's ExtensionFileLoader, or `import cuda_extension` on
sys.path): its PyInit_cuda_extension calls extension_module_for() below.

$CUDA_AGENT_BINDING_RUNTIME, when set, names the built runtime .so to load (a sandboxed child that cannot see
the worker's cache folder, or a runtime built elsewhere).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

from .toolchain import digest_of

RUNTIME_NAME = "cuda_agent_binding_runtime"
RUNTIME_SOURCE = Path(__file__).parent / "runtime" / "binding_runtime.cpp"
ABI_HEADER = Path(__file__).parent / "include" / "cuda_agent_fast_abi.h"
FAST_ENTRY_SYMBOL = b"cuda_agent_fast_attach"
RUNTIME_BUILDER_VERSION = "1"
RUNTIME_ENV = "CUDA_AGENT_BINDING_RUNTIME"


def runtime_has_cuda() -> bool:
    """Whether the runtime is built with CUDA streams: torch has CUDA and a toolkit (headers) is installed."""
    import torch

    from .toolchain import find_cuda_home

    return torch.version.cuda is not None and find_cuda_home() is not None


def runtime_key() -> str:
    """Everything the built runtime depends on."""
    import torch

    return digest_of(
        str(runtime_has_cuda()),
        RUNTIME_BUILDER_VERSION,
        RUNTIME_SOURCE.read_bytes(),
        ABI_HEADER.read_bytes(),
        torch.__version__,
        str(torch.version.cuda),
        f"{sys.version_info[0]}.{sys.version_info[1]}",
        sys.implementation.cache_tag or "",
    )


def _cache_root(cache_dir: Path | str | None) -> Path:
    from .stage import default_cache_dir

    return Path(cache_dir) if cache_dir else default_cache_dir()


def _ready_marker(cache_dir: Path | str | None) -> Path:
    """A marker named by what can be known without importing torch (torch's installed version, not its CUDA)."""
    from .toolchain import torch_version

    try:
        from importlib.metadata import version

        torch_dist = version("torch")
    except Exception:
        torch_dist = ".".join(map(str, torch_version()))
    cheap = digest_of(RUNTIME_BUILDER_VERSION, RUNTIME_SOURCE.read_bytes(), ABI_HEADER.read_bytes(), torch_dist,
                      f"{sys.version_info[0]}.{sys.version_info[1]}", sys.implementation.cache_tag or "")
    return _cache_root(cache_dir) / "runtime" / f"ready-{cheap}"


def binding_runtime_ready(cache_dir: Path | str | None = None) -> bool:
    """Whether the binding runtime is already built for this torch and runtime source (no torch import: ~1 ms).

    Lets a parent skip starting a child (or importing torch) just to check the runtime before every build.
    """
    marker = _ready_marker(cache_dir)
    try:
        return Path(marker.read_text().strip()).exists()
    except OSError:
        return False


def runtime_dir(cache_dir: Path | str | None = None) -> Path:
    return _cache_root(cache_dir) / "runtime" / runtime_key()


def _import_built(path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(RUNTIME_NAME, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_RUNTIME: types.ModuleType | None = None


def ensure_binding_runtime(cache_dir: Path | str | None = None, verbose: bool = False) -> types.ModuleType:
    """The binding runtime module, built on first use on this machine (torch must be importable)."""
    global _RUNTIME
    if _RUNTIME is not None:
        return _RUNTIME
    if RUNTIME_NAME in sys.modules:
        _RUNTIME = sys.modules[RUNTIME_NAME]
        return _RUNTIME
    import torch  # noqa: F401  (the runtime links against torch's libraries: load them first)

    override = os.environ.get(RUNTIME_ENV)
    if override:
        _RUNTIME = _import_built(Path(override))
        sys.modules[RUNTIME_NAME] = _RUNTIME
        return _RUNTIME
    build_dir = runtime_dir(cache_dir)
    built = build_dir / f"{RUNTIME_NAME}.so"
    if built.exists():
        _RUNTIME = _import_built(built)
    else:
        from torch.utils.cpp_extension import load

        build_dir.mkdir(parents=True, exist_ok=True)
        with_cuda = runtime_has_cuda()
        flags = ["-O2"] + (["-DCUDA_AGENT_WITH_CUDA"] if with_cuda else [])
        includes, ldflags = [], []
        if with_cuda:  # explicit toolkit paths: torch's own CUDA_HOME guess can land on a wrapper script's folder
            from .toolchain import find_toolchain

            toolchain = find_toolchain("cuda")
            includes, ldflags = [toolchain.cuda_include()], [f"-L{toolchain.cuda_lib()}"]
        _RUNTIME = load(
            name=RUNTIME_NAME,
            sources=[str(RUNTIME_SOURCE)],
            extra_cflags=flags,
            extra_include_paths=includes,
            extra_ldflags=ldflags,
            build_directory=str(build_dir),
            with_cuda=with_cuda,
            verbose=verbose,
        )
    sys.modules[RUNTIME_NAME] = _RUNTIME
    try:  # record readiness for binding_runtime_ready()
        marker = _ready_marker(cache_dir)
        tmp = marker.with_name(f".{marker.name}.{os.getpid()}.tmp")
        tmp.write_text(str(Path(_RUNTIME.__file__).resolve()))
        os.replace(tmp, marker)
    except OSError:
        pass
    return _RUNTIME


def is_fast_extension(so: Path | str | bytes) -> bool:
    """Whether a built library (path or bytes) came from the fast build (it exports cuda_agent_fast_attach)."""
    data = so if isinstance(so, bytes) else Path(so).read_bytes()
    return FAST_ENTRY_SYMBOL in data


def extension_module_for(so_path: str, module_name: str = "cuda_extension") -> types.ModuleType:
    """The extension module object of a fast-built library (what its PyInit_cuda_extension returns)."""
    module = ensure_binding_runtime().extension_module(str(so_path), module_name)
    module.__file__ = str(so_path)
    return module


def load_fast_extension(so_path: Path | str, module_name: str = "cuda_extension",
                        cache_dir: Path | str | None = None) -> types.ModuleType:
    """Attach a fast-built library and register it as `module_name` in sys.modules (runs its static initialisers)."""
    ensure_binding_runtime(cache_dir)
    module = extension_module_for(str(so_path), module_name)
    sys.modules[module_name] = module
    return module


def load_extension(so_path: Path | str, module_name: str = "cuda_extension",
                   cache_dir: Path | str | None = None) -> types.ModuleType:
    """Load a built cuda_extension whichever way it was built (fast library or torch extension)."""
    if is_fast_extension(so_path):
        return load_fast_extension(so_path, module_name, cache_dir)
    spec = importlib.util.spec_from_file_location(module_name, str(so_path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[module_name] = module
    return module
