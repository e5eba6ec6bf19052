"""The compile times of `speed`: each stem's workspace (the evaluator's fast build) and its KernelBench file."""

from __future__ import annotations

import uuid
from pathlib import Path

from evaluator_bench.common import SOLUTIONS
from evaluator_bench.kernelbench_form import LOAD_FILE
from evaluator_bench.timing import fresh_process_cached_build, fresh_process_seconds, timed


def compile_workspace(stem: str, backend: str, settings, empty_cache: bool) -> dict:
    """Evaluator fast build: empty cache (first solution only), candidate-cold, cached here and in a new process."""
    from evaluator_cuda.extension.build import build_workspace
    from evaluator_cuda.solutions import read_solution

    folder = SOLUTIONS / backend / stem
    files = read_solution(folder).files
    row = {"solution": stem, "format": "workspace", "build": "fast (evaluator default)"}
    if empty_cache:
        seconds, result = timed(lambda: build_workspace(files, settings))
        row.update(cold_empty_cache_s=seconds, status=result.status, so_path=result.so_path)
        if result.status != "built":
            row["error"] = "; ".join(d["message"] for d in result.diagnostics[:3])[:500]
            return row
        tag = f"\n// bench_evaluator speed {uuid.uuid4().hex}\n".encode()  # new bytes: a new candidate
        fresh = {rel: data + tag if rel.startswith("kernels/") else data for rel, data in files.items()}
    else:
        fresh = files  # not built in this cache yet: its first build is a candidate-cold build
    seconds, result = timed(lambda: build_workspace(fresh, settings))
    row.update(cold_s=seconds, status=result.status, cold_cache_hit=result.cache_hit)
    if result.status != "built":
        row["error"] = "; ".join(d["message"] for d in result.diagnostics[:3])[:500]
        return row
    seconds, result = timed(lambda: build_workspace(files, settings))
    row.update(cached_s=seconds, cached_hit=result.cache_hit, so_path=result.so_path)
    try:
        fast_cache = settings.cache_path() / "fastbuild"
        row["cached_new_process_s"] = fresh_process_cached_build(folder, backend, fast_cache, settings.arch_list)
    except Exception as exc:  # not a fast-build hit (torch build fallback) or the child failed: report, go on
        row["cached_new_process_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def compile_kernelbench(stem: str, path: Path) -> dict:
    """load_inline of the generated file in fresh interpreters (torch imported before the clock):
    cold (nothing in TORCH_EXTENSIONS_DIR), again in the same process, again in a new process."""
    call = f"load_file({str(path)!r})"
    row = {"solution": stem, "format": "kernelbench", "build": "torch load_inline"}
    row["cold_s"] = fresh_process_seconds(call, LOAD_FILE)
    row["status"] = "built" if row["cold_s"] is not None else "failed (see the log line above)"
    if row["cold_s"] is not None:
        row["cached_s"] = fresh_process_seconds(call, LOAD_FILE + call + "\n")
        row["cached_new_process_s"] = fresh_process_seconds(call, LOAD_FILE)
    return row




