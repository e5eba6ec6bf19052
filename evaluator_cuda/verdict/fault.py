"""Whose fault a failure is, as the status that ends an evaluation.

A child that dies, hangs or raises while running candidate code is the candidate's fault
(runtime_error); a refused torch call, a state_dict mismatch or a named rejection is
`incorrect`; the reference child or the harness failing is infra_error; an unusable task is
task_error. A step of an evaluation that reaches a verdict raises it as a Verdict.
"""

from __future__ import annotations

import contextlib

from ..extension.diagnostics import parse_compiler_output
from ..isolation.sandbox import Child, ChildFailed


class Verdict(Exception):
    """Stops an evaluation with a final status."""

    def __init__(self, status: str, message: str, diagnostics: list | None = None, rejected: str | None = None):
        super().__init__(message)
        self.rejected = rejected
        self.status = status
        self.message = message
        self.diagnostics = diagnostics


# Named rejections the candidate child reports (record["rejected"]).
REJECTION_KINDS = ("no_kernel", "threads", "mutated_inputs", "guard_switch", "precision_switch", "fallback",
                   "timing_setting")
# Messages of a candidate's runtime_error after which its CUDA context cannot be trusted.
CUDA_ERROR_MARKERS = ("CUDA error", "cudaError", "illegal memory access", "CUBLAS_STATUS", "device-side assert")
# Every reply of the candidate child is the candidate's (docs/cheats.md #25): its code runs in that
# process and can make any harness method there fail or answer anything, so neither a failure of
# "harness code" there nor a "task" failure is taken at its word (an infra_error or a task_error takes
# the episode out of training instead of scoring it). Only a self-check's load, where the child runs
# the task's own code, is a task_error (evaluation/loading.py `_candidate_loaded`).
_CANDIDATE_KINDS = {"forbidden": "incorrect", "state_dict": "incorrect", "incorrect": "incorrect",
                    "runtime": "runtime_error", "task": "runtime_error", "internal": "runtime_error"}


def reply(child: Child, message: dict, timeout: float, harness: bool, tensor_meta: list | None = None) -> dict:
    """Send a request; map a dead/hung child to runtime_error (candidate) or infra_error (harness)."""
    try:
        return child.request(message, timeout, tensor_meta)
    except ChildFailed as exc:
        status = "infra_error" if harness else "runtime_error"
        tail = exc.log_tail.strip().splitlines()[-3:]
        text = str(exc) + (": " + " | ".join(tail) if tail and not harness else "")
        raise Verdict(status, text) from None


def rejection(reason: str, message: str, diagnostics: list | None = None) -> Verdict:
    """A named rejection: status incorrect, record["rejected"] = reason."""
    return Verdict("incorrect", f"rejected: {reason}: {message}", diagnostics, rejected=reason)


def candidate_failure(answer: dict) -> Verdict:
    """The verdict on a failed reply of the candidate child (its `kind` says whose fault)."""
    kind = answer.get("kind")
    message = answer.get("message", "")
    if kind == "compile":
        return Verdict("compile_error", message, parse_compiler_output(answer.get("detail", "")))
    if kind == "syntax":
        file, line, msg = (answer.get("detail", "").split("\n", 2) + ["", "", ""])[:3]
        where = {"file": file, "line": int(line) if line.isdigit() else None, "message": msg}
        return Verdict("compile_error", message, [where])
    if kind in REJECTION_KINDS:
        return rejection(kind, message)
    status = _CANDIDATE_KINDS.get(kind, "runtime_error")
    diagnostics = [{"file": None, "line": None, "message": message}]
    if answer.get("detail"):
        diagnostics.append({"file": None, "line": None, "message": answer["detail"]})
    return Verdict(status, message, diagnostics)


def reference_failure(answer: dict) -> Verdict:
    """The verdict on a failed reply of the reference child: the task's fault or the harness's."""
    if answer.get("kind") == "task":
        return Verdict("task_error", answer.get("message", ""))
    detail = [{"file": None, "line": None, "message": answer.get("detail", "")}]
    return Verdict("infra_error", "reference process: " + answer.get("message", ""), detail)


@contextlib.contextmanager
def reading_candidate_reply(what: str):
    """Code that reads what the candidate's process sent: a failure there is that process's doing, its
    runtime_error (docs/cheats.md #25), never a harness error."""
    try:
        yield
    except Verdict:
        raise
    except Exception as exc:
        raise Verdict("runtime_error", f"the candidate process sent a malformed {what}: "
                                       f"{type(exc).__name__}: {exc}"[:300]) from None


def output_meta(answer: dict) -> list:
    """The candidate child's per-tensor description of its output (a list of dicts)."""
    meta = answer.get("output_meta")
    if not isinstance(meta, list) or not all(isinstance(m, dict) for m in meta):
        raise Verdict("runtime_error", "the candidate process sent its output without a description of its tensors")
    return meta
