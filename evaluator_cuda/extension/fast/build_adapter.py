"""The fast build in the shape of the torch build's result: what build_workspace calls first.

    from .fast.build_adapter import fast_build_workspace
    fast = fast_build_workspace(files, settings)      # evaluator_cuda.extension.result.BuildResult, or None
    if fast is not None:
        return fast                                   # built, or the candidate's own compile error
    ... the full torch build, unchanged ...           # the slim headers could not serve this solution

The library it returns is loaded with evaluator_cuda.extension.fast.binding_runtime.load_extension (which also loads
full builds).
"""

from __future__ import annotations

from ...isolation.sandbox import child_guard
from ..result import BuildResult
from .builder import build_fast


def fast_build_workspace(files: dict[str, bytes], settings, lookup_only: bool = False):
    """Fast-build a workspace (relpath -> bytes) under `settings` (EvalSettings).

    Returns evaluator_cuda.extension.result.BuildResult with status "built" or "compile_error"; status
    "fallback" (with `fast_fallback`, the reason) when the full torch build must decide (a binding needs
    torch API outside the slim headers, a toolchain piece is missing); None, with lookup_only, when the
    solution is not cached yet.
    """
    result = build_fast(
        files,
        backend=settings.backend,
        cache_dir=settings.cache_path() / "fastbuild",
        arch_list=settings.arch_list,
        timeout_s=settings.compile_timeout_s,
        lookup_only=lookup_only,
        jail=child_guard(settings)["jail"],
    )
    if result is None:
        return None
    if result.fallback_reason:  # the torch build decides; the reason goes into its result
        return BuildResult("fallback", [], None, result.seconds, False, result.key, result.log, path="fast",
                           fast_fallback=result.fallback_reason)
    if result.ok:
        return BuildResult("built", [], result.so_path, result.seconds, result.cache_hit, result.key, path="fast")
    return BuildResult("compile_error", result.diagnostics, None, result.seconds, result.cache_hit, result.key,
                       result.log, path="fast")
