"""One candidate through the whole execution filter, in a worker process of the pool."""

from __future__ import annotations

import time

_warm = False


def start_worker() -> None:
    """Pool initializer: torch imported once, the evaluator's children kept warm between candidates."""
    global _warm
    import signal
    import sys

    import torch

    # Stopped by the run: exit through Python, so an evaluation's children are closed on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    torch.set_num_threads(1)  # workers share the machine: several intra-op pools would oversubscribe it

    from evaluator_cuda.evaluation import keep_children_warm

    keep_children_warm(True)
    _warm = True


def filter_candidate(job: dict) -> dict:
    """job: name, source, expected_shape, shapes, window_ms, memory_bytes, evaluator (settings or None).
    Returns the job's key with `status` kept/rejected, the stage and reason, and what was measured."""
    from .evaluator_stage import check_with_evaluator
    from .execution import Rejected, run_checks

    begin = time.perf_counter()
    result = {"key": job["key"], "status": "kept", "stage": None, "reason": None}
    try:
        result.update(run_checks(job["name"], job["source"], job.get("expected_shape"), job.get("shapes"),
                                 job["window_ms"], job["memory_bytes"]))
        if job.get("evaluator"):
            result.update(check_with_evaluator(job["name"], job["source"], job["evaluator"]))
    except Rejected as exc:
        result.update(status="rejected", stage=exc.stage, reason=exc.reason)
    except Exception as exc:  # a bug in the filter itself: counted apart from the task's faults
        result.update(status="rejected", stage="filter_error", reason=f"{type(exc).__name__}: {exc}"[:200])
    result["filter_s"] = round(time.perf_counter() - begin, 4)
    return result
