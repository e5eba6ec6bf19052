"""One candidate through the whole execution filter, in a filter worker (worker_main.py, usually jailed)."""

from __future__ import annotations

import contextlib
import signal
import time

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


def filter_candidate(job: dict) -> dict:
    """job: name, source, expected_shape, shapes, window_ms, memory_bytes, evaluator (settings or None), and
    optionally input_shapes, time_limit_s and device (where the in-process forwards run: "cpu" or "cuda").
    Returns the job's key with `status` kept/rejected, the stage and reason, and what was measured."""
    from .evaluator_stage import check_with_evaluator
    from .execution import Rejected, run_checks

    begin = time.perf_counter()
    result = {"key": job["key"], "status": "kept", "stage": None, "reason": None}
    try:
        with time_limit(job.get("time_limit_s") or IN_PROCESS_LIMIT_S):
            result.update(run_checks(job["name"], job["source"], job.get("expected_shape"), job.get("shapes"),
                                     job["window_ms"], job["memory_bytes"], job.get("input_shapes"),
                                     job.get("device", "cpu")))
        if job.get("evaluator"):
            result.update(check_with_evaluator(job["name"], job["source"], job["evaluator"]))
    except Rejected as exc:
        result.update(status="rejected", stage=exc.stage, reason=exc.reason)
    except TimeLimit as exc:
        result.update(status="rejected", stage="timeout", reason=str(exc))
    except Exception as exc:  # a bug in the filter itself: counted apart from the task's faults
        result.update(status="rejected", stage="filter_error", reason=f"{type(exc).__name__}: {exc}"[:200])
    result["filter_s"] = round(time.perf_counter() - begin, 4)
    return result
