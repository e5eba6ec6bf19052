"""A worker's verdict, checked before the run believes it. A worker runs candidate code in-process, so its
reply is untrusted data: only the known keys with the expected types and ranges pass, and the reply must
name the job it answers (its key and the job's nonce). Anything else is a `worker` rejection. Besides kept
and rejected, a verdict may be status `retry` at stage `gpu_memory`: the GPU ran out of memory."""

from __future__ import annotations

import math

FILTER_STAGES = ("memory", "load", "inputs", "eager", "output", "deterministic", "input_dependent", "window",
                 "timeout", "crash", "evaluator", "compile", "filter_error")
MAX_REASON_CHARS = 1000
MAX_RANK = 8
_MEASURES = ("filter_s", "eager_ms", "evaluator_eager_us", "evaluator_compile_us", "evaluator_wall_s",
             "evaluator_verify_s", "evaluator_profile_s", "evaluator_baselines_s")
_COUNTS = ("bytes", "peak_bytes")
_KEYS = {"key", "nonce", "status", "stage", "reason", "output_shape", *_MEASURES, *_COUNTS}


class MalformedReply(ValueError):
    """The reply is not a verdict on the job sent; str() is one line."""


def worker_rejection(reason: str) -> dict:
    return {"status": "rejected", "stage": "worker", "reason": reason[:200]}


def _number(value, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise MalformedReply(f"{name} is not a non-negative number")
    return value


def _shape(value) -> list[int]:
    if not isinstance(value, list) or len(value) > MAX_RANK:
        raise MalformedReply("output_shape is not a list of at most 8 sizes")
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in value):
        raise MalformedReply("output_shape holds something other than sizes")
    return value


def _outcome(reply: dict) -> dict:
    status, stage, reason = reply.get("status"), reply.get("stage"), reply.get("reason")
    if status == "kept" and stage is None and reason is None:
        return {"status": "kept", "stage": None, "reason": None}
    if (status, stage) != ("retry", "gpu_memory") and (status != "rejected" or stage not in FILTER_STAGES):
        raise MalformedReply(f"status {str(status)[:20]!r} at stage {str(stage)[:20]!r} is not a verdict")
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
        raise MalformedReply("a rejection without a reason of at most 1000 characters")
    return {"status": status, "stage": stage, "reason": reason}


def checked_verdict(reply: dict, job: dict) -> dict:
    """The verdict's fields (no key, no nonce); MalformedReply when the reply is not a verdict on `job`."""
    unknown = sorted(str(k)[:40] for k in set(reply) - _KEYS)
    if unknown:
        raise MalformedReply(f"unknown fields {', '.join(unknown[:5])}")
    if reply.get("key") != job["key"] or reply.get("nonce") != job["nonce"]:
        raise MalformedReply("a reply to another job")
    verdict = _outcome(reply)
    for name in _MEASURES:
        if name in reply:
            verdict[name] = _number(reply[name], name)
    for name in _COUNTS:
        if name in reply:
            if isinstance(reply[name], bool) or not isinstance(reply[name], int) or reply[name] < 0:
                raise MalformedReply(f"{name} is not a non-negative integer")
            verdict[name] = reply[name]
    if "output_shape" in reply:
        verdict["output_shape"] = _shape(reply["output_shape"])
    return verdict
