"""The build child: compiles one workspace's sources into the `cuda_extension` module.

It runs `torch.utils.cpp_extension.load` (ninja, the flags of docs/paper.md §3) in a
process of its own, so a hung compiler or a crashing static initialiser hurts nobody.
"""

from __future__ import annotations

from pathlib import Path

from .errors import HandlerError, one_line


class BuildRole:
    def do_build(self, req: dict) -> dict:
        from torch.utils.cpp_extension import load

        build_dir = Path(req["build_dir"])
        build_dir.mkdir(parents=True, exist_ok=True)
        try:
            load(
                name="cuda_extension",
                sources=list(req["sources"]),
                extra_cflags=list(req["cflags"]),
                extra_cuda_cflags=list(req["cuda_cflags"]),
                extra_include_paths=list(req["include_dirs"]),
                build_directory=str(build_dir),
                with_cuda=req["backend"] == "cuda",
                verbose=False,
            )
        except Exception as exc:  # ninja/compiler failure or a module that does not import
            raise HandlerError("compile", one_line(exc), str(exc)) from None
        built = sorted(build_dir.glob("cuda_extension*.so"))
        if not built:
            raise HandlerError("internal", "the build reported success but produced no cuda_extension .so")
        return {"so_path": str(built[0])}

    def do_runtime(self, req: dict) -> dict:
        """Make sure the fast build's binding runtime exists (built once per machine, cached)."""
        import fcntl

        from ..extension.fast.binding_runtime import ensure_binding_runtime

        root = Path(req["cache_dir"])
        root.mkdir(parents=True, exist_ok=True)
        with open(root / "runtime.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            ensure_binding_runtime(root)
        return {}
