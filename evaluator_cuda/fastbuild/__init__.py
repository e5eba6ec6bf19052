"""Fast build path for workspace solutions: kernels and bindings compiled alone, in parallel, without torch headers.

A candidate's bindings compile against slim stand-ins for the torch headers (include/) and reach torch at
run time through a binding runtime built once per machine (runtime/). Cold builds take seconds instead of
the 18–70 s of a torch-header build; unchanged solutions are a hash lookup.

    result = build_fast(solution_dir_or_files, backend="cuda", cache_dir=..., arch_list="9.0")
    if result.ok:              module = load_fast_extension(result.so_path)   # in the candidate's process
    elif result.fallback_reason: ... build the full torch way ...
    else:                      ... result.diagnostics is the candidate's compile error ...
"""

from .builder import FastBuildResult, build_fast, read_solution, select_sources, warm_up
from .runtime import ensure_binding_runtime, is_fast_extension, load_extension, load_fast_extension

__all__ = [
    "FastBuildResult",
    "build_fast",
    "ensure_binding_runtime",
    "is_fast_extension",
    "load_extension",
    "load_fast_extension",
    "read_solution",
    "select_sources",
    "warm_up",
]
