"""Fast build path for workspace solutions: kernels and bindings compiled alone, in parallel, without torch headers.

A candidate's bindings compile against slim stand-ins for the torch headers (include/: torch::Tensor, allocation,
views, TORCH_CHECK, dtypes, devices, CUDA streams and guards, REGISTER_BINDING) and reach torch at run time
through a binding runtime built once per machine (runtime/). Cold builds take about a second or two instead of
the 18-70 s of a torch-header build; an unchanged solution is a hash lookup; compile errors are cached too.

    result = build_fast(solution_dir_or_files, backend="cuda", cache_dir=..., arch_list="9.0")
    if result.ok:                 # result.so_path imports like a torch-built cuda_extension
        module = load_fast_extension(result.so_path)        # or importlib's ExtensionFileLoader, unchanged
    elif result.fallback_reason:  # a binding needs torch API outside the slim headers
        ...                       # build it the full torch way
    else:                         # the candidate's own compile error
        result.diagnostics        # [{"file": "kernels/op.cu", "line": 12, "message": "..."}]

Worker start: warm_up(backend) and ensure_binding_runtime() build the shared parts ahead of the first candidate.
evaluator_cuda.build uses build_adapter.fast_build_workspace (same result type as its full build).
"""

from .builder import FastBuildResult, build_fast, read_solution, select_sources, warm_up
from .runtime import (
    binding_runtime_ready,
    ensure_binding_runtime,
    is_fast_extension,
    load_extension,
    load_fast_extension,
)

__all__ = [
    "FastBuildResult",
    "binding_runtime_ready",
    "build_fast",
    "ensure_binding_runtime",
    "is_fast_extension",
    "load_extension",
    "load_fast_extension",
    "read_solution",
    "select_sources",
    "warm_up",
]
