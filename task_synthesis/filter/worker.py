"""One candidate through the whole execution filter, in a filter worker (worker_main.py, usually jailed)."""

from __future__ import annotations

import contextlib
import signal
import time

from . import gpu_memory

IN_PROCESS_LIMIT_S = 300.0  # the in-process checks of one candidate (the evaluator's children have their own)
_warm = False


class TimeLimit(BaseException):
    """The in-process checks ran past their limit (a BaseException: the task's code cannot catch it as an Exception)."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """SIGALRM after `seconds` raises TimeLimit in this (the worker's main) thread."""
    def expire(signum, frame):
        raise TimeLimit(f"the in-process checks ran past {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def start_worker() -> None:
    """Once per worker: torch imported, the evaluator's children kept warm between candidates."""
    global _warm
    import sys

    import torch

    # Stopped by the run: exit through Python, so an evaluation's children are closed on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    torch.set_num_threads(1)  # workers share the machine: several intra-op pools would oversubscribe it

    from evaluator_cuda.evaluation import keep_children_warm

    keep_children_warm(True)
    _warm = True


def _checks(job: dict, device: str) -> dict:
    """The in-process checks, then (their GPU memory released) the evaluator's; what was measured."""
    from .evaluator_stage import check_with_evaluator
    from .execution import run_checks

    with time_limit(job.get("time_limit_s") or IN_PROCESS_LIMIT_S):
        measured = run_checks(job["name"], job["source"], job.get("expected_shape"), job.get("shapes"),
                              job["window_ms"], job["memory_bytes"], job.get("input_shapes"), device)
    gpu_memory.release(device)  # the evaluator's children allocate on the same GPU
    if job.get("evaluator"):
        measured.update(check_with_evaluator(job["name"], job["source"], job["evaluator"]))
    return measured


def filter_candidate(job: dict) -> dict:
    """job: name, source, expected_shape, shapes, window_ms, memory_bytes, evaluator (settings or None), and
    optionally input_shapes, time_limit_s and device (where the in-process forwards run: "cpu" or "cuda").
    Returns the job's key with `status` kept/rejected, the stage and reason, and what was measured; or status
    `retry` at stage `gpu_memory` when the GPU ran out of memory (shared by the run's workers: not the task's
    fault). The GPU memory of the in-process checks is released on every way out."""
    from .execution import Rejected

    begin = time.perf_counter()
    device = job.get("device", "cpu")
    result = {"key": job["key"], "status": "kept", "stage": None, "reason": None}
    try:
        result.update(_checks(job, device))
    except Rejected as exc:
        status = "retry" if exc.stage == "gpu_memory" else "rejected"
        result.update(exc.measured, status=status, stage=exc.stage, reason=exc.reason)
    except TimeLimit as exc:
        result.update(status="rejected", stage="timeout", reason=str(exc))
    except Exception as exc:  # a bug in the filter itself (counted apart from the task's faults), or out of memory
        reason = f"{type(exc).__name__}: {exc}"[:200]
        if gpu_memory.out_of_memory(exc):
            result.update(status="retry", stage="gpu_memory", reason=reason)
        else:
            result.update(status="rejected", stage="filter_error", reason=reason)
    finally:
        gpu_memory.release(device)  # after the except clauses: their exceptions no longer hold the task's frames
    result["filter_s"] = round(time.perf_counter() - begin, 4)
    return result
