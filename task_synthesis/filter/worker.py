"""One candidate through the whole execution filter, in a filter worker (worker_main.py, usually jailed): its
in-process checks in a process of their own (zygote.py), then the evaluator's, from the worker itself."""

from __future__ import annotations

import os
import signal
import time

from . import gpu_memory

IN_PROCESS_LIMIT_S = 300.0  # the in-process checks of one candidate (the evaluator's children have their own)
_zygote = None
MEASURED = ("eager_ms", "bytes", "output_shape", "peak_bytes")  # what execution.run_checks measures


def start_worker() -> None:
    """Once per worker: torch imported, the evaluator's children kept warm between candidates."""
    import sys

    import torch

    # Stopped by the run: exit through Python, so an evaluation's children are closed on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    torch.set_num_threads(1)  # workers share the machine: several intra-op pools would oversubscribe it
    from .zygote import not_dumpable

    not_dumpable()  # the candidates' processes share the worker's uid: no reaching into it through /proc
    _start_zygote()  # before the evaluator starts threads or touches a GPU in this process

    from evaluator_cuda.evaluation import keep_children_warm

    keep_children_warm(True)


def _start_zygote() -> None:
    """The zygote, forked with what the checks import already imported (its children start from it)."""
    global _zygote
    from evaluator_cuda import tasks  # noqa: F401  (exec_task, for the children)

    from . import execution  # noqa: F401
    from .zygote import Zygote

    _zygote = Zygote()


def _in_process(job: dict) -> dict:
    """What the candidate's own process measured; Rejected as it or the zygote said (a dead zygote: `crash`,
    and the pool replaces this worker)."""
    from .execution import Rejected
    from .zygote import ZygoteLost

    if _zygote is None:
        raise RuntimeError("no zygote: start_worker() starts it")
    try:
        outcome = _zygote.outcome(job, float(job.get("time_limit_s") or IN_PROCESS_LIMIT_S))
    except ZygoteLost as exc:
        raise Rejected("crash", f"the candidate's process took the worker's zygote with it ({exc})") from None
    rejected = outcome.get("rejected")
    if isinstance(rejected, dict):
        stage, reason, measured = rejected.get("stage"), rejected.get("reason"), rejected.get("measured")
        if isinstance(stage, str) and isinstance(reason, str) and isinstance(measured, dict):
            raise Rejected(stage, reason, _known(measured))
    elif isinstance(outcome.get("measured"), dict):
        return _known(outcome["measured"])
    raise Rejected("crash", "the candidate's process answered with something other than its checks' outcome")


def _sweep() -> None:
    """In a jailed worker (alone in its pid namespace with what it started): kill what earlier candidates
    left running (zygote.kill_leftovers). Elsewhere the namespace is the machine's: nothing."""
    from .launch import JAILED_ENV
    from .zygote import kill_leftovers

    if os.environ.get(JAILED_ENV) == "1" and _zygote is not None:
        kill_leftovers(_zygote.pid)


def _known(measured: dict) -> dict:
    """Only what the checks measure (the run checks the values): nothing else of the child's reaches the verdict."""
    return {k: v for k, v in measured.items() if k in MEASURED}


def _checks(job: dict) -> dict:
    """The in-process checks in the candidate's own process, then the evaluator's; what was measured."""
    from .evaluator_stage import check_with_evaluator

    measured = _in_process(job)
    gpu_memory.release(job.get("device", "cpu"))  # what this process holds, before the evaluator's children start
    if job.get("evaluator"):
        measured.update(check_with_evaluator(job["name"], job["source"], job["evaluator"]))
    return measured


def filter_candidate(job: dict) -> dict:
    """job: name, source, expected_shape, shapes, window_ms, memory_bytes, evaluator (settings or None), and
    optionally input_shapes, time_limit_s and device (where the in-process forwards run: "cpu" or "cuda").
    Returns the job's key with `status` kept/rejected, the stage and reason, and what was measured; or status
    `retry` at stage `gpu_memory` when the GPU ran out of memory (shared by the run's workers: not the task's
    fault). The in-process checks' memory goes with their process; the evaluator's is released on every way out."""
    from .execution import Rejected

    begin = time.perf_counter()
    device = job.get("device", "cpu")
    result = {"key": job["key"], "status": "kept", "stage": None, "reason": None}
    try:
        _sweep()  # nothing of an earlier candidate runs beside this one
        result.update(_checks(job))
    except Rejected as exc:
        status = "retry" if exc.stage == "gpu_memory" else "rejected"
        result.update(exc.measured, status=status, stage=exc.stage, reason=exc.reason)
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
