"""The evaluator's handlers for the bridge's worker (``cuda-agent worker --service ...``).

The bridge's supervisor loads these by name inside its evaluation child, after it has set
``CUDA_VISIBLE_DEVICES``; the evaluator service is imported lazily, at the first job, so the
supervisor never imports torch and a compile worker never touches a GPU.

- ``compile``: ``evaluator_cuda.service.compile_job`` (CPU workers: build, no GPU needed).
- ``evaluate``: ``evaluator_cuda.service.evaluate_job`` (one worker per GPU), with the next
  evaluation's sandboxed children started and warmed ahead (``keep_children_warm``).
- ``capabilities``: what the worker registers with (GPU name, torch and CUDA versions).

A result that says the harness itself failed (``infra_error``), or that names an error known to
poison a CUDA context, asks the supervisor to recycle the child (``needs_recycle``) so the next
job starts in a clean process. A wrong or crashing kernel is a verdict, not a reason to recycle:
the evaluator already runs candidate code in its own sandboxed children.
"""

from __future__ import annotations

# Messages after which a CUDA context cannot be trusted (sticky errors in the CUDA runtime).
STICKY_CUDA_ERRORS = (
    "illegal memory access",
    "misaligned address",
    "unspecified launch failure",
    "device-side assert",
    "an illegal instruction",
    "CUDA error: uncorrectable ECC",
)


def needs_recycle(result: dict) -> bool:
    """Whether the process that produced ``result`` should be replaced before the next job.

    Yes when the result asks for it, when the harness failed (infra_error), or when the text
    names a sticky CUDA error (the candidate runs in its own child, so this is conservative).
    """
    return (bool(result.get("needs_recycle")) or result.get("status") == "infra_error"
            or mentions_sticky_cuda_error(result))


def mentions_sticky_cuda_error(result: dict) -> bool:
    """Whether the result's error text or diagnostics name a sticky CUDA error."""
    texts = [str(result.get("error") or ""), str(result.get("message") or "")]
    texts += [str(d.get("message") or "") for d in result.get("diagnostics") or [] if isinstance(d, dict)]
    return any(marker.lower() in text.lower() for text in texts for marker in STICKY_CUDA_ERRORS)


def _with_recycle_flag(result: dict) -> dict:
    if needs_recycle(result):
        result = dict(result)
        result["needs_recycle"] = True
    return result


def capabilities() -> dict:
    """Registration facts: torch and CUDA versions, GPU name (None on a CPU-only worker)."""
    import os

    import torch

    caps = {"torch": torch.__version__, "cuda": torch.version.cuda,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "gpu": None}
    if torch.cuda.is_available():
        caps["gpu"] = torch.cuda.get_device_name(0)
        caps["gpu_count"] = torch.cuda.device_count()
    return caps


def compile(job: dict) -> dict:  # noqa: A001 - the service is called "compile"
    """Build a solution's extension (no GPU). Result: status built/compile_error/infra_error + artifact."""
    from evaluator_cuda.service import compile_job

    return _with_recycle_flag(compile_job(job))


def evaluate(job: dict) -> dict:
    """Build (or load the given artifact), verify, profile and reward a solution on this GPU."""
    from evaluator_cuda.evaluation import keep_children_warm
    from evaluator_cuda.service import evaluate_job

    keep_children_warm()  # a worker's child serves job after job: the next job's children warm while it waits
    return _with_recycle_flag(evaluate_job(job))
