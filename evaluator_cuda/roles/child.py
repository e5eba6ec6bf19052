"""Entry point of every child process: `python -m evaluator_cuda.roles.child <role>`.

The child reads requests from the channel fd the parent passed (sandbox.py), runs the role's
handler and writes one structured reply per request. stdout/stderr go to a log file only.
A handler's exception becomes `{"ok": False, "kind", "message", "detail"}`; `kind` tells the
parent whose fault it is (task, compile, runtime, forbidden, internal).
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback

from ..isolation import wire
from ..isolation.sandbox import (CHANNEL_FD_ENV, LIMITS_ENV, SLOT_DIR_ENV, WARM_ENV, limit_resources, remove_slot_dir,
                                 warm_up)
from ..settings import CHILD_FILE_SIZE_BYTES, CHILD_OPEN_FILES
from ..timing.kernel_trace import TRACE_BEFORE_CONTEXT, TRACE_ENV, start_trace
from .errors import HandlerError, one_line


def _handlers(role: str):
    if role == "reference":
        from .reference import ReferenceRole

        return ReferenceRole()
    if role == "candidate":
        from .candidate import CandidateRole

        return CandidateRole()
    if role == "build":
        from .build import BuildRole

        return BuildRole()
    raise SystemExit(f"unknown child role {role!r}")


def serve(role: str) -> None:
    # When the child's start got where (CLOCK_MONOTONIC, the parent's clock too), sent with the answer to
    # `ready` (sandbox.EvaluationSlot asks it first): where a pair's start goes (record["children_start_s"]);
    # a diagnostic the verdict never reads.
    marks = {"serve": time.monotonic()}
    limits = [int(v) for v in os.environ.pop(LIMITS_ENV, f"{CHILD_FILE_SIZE_BYTES},{CHILD_OPEN_FILES}").split(",")]
    limit_resources(*limits)
    sock = socket.socket(fileno=int(os.environ[CHANNEL_FD_ENV]))
    os.environ.pop(CHANNEL_FD_ENV, None)
    handler = _handlers(role)
    warm = os.environ.pop(WARM_ENV, "")
    slot_dir = os.environ.pop(SLOT_DIR_ENV, "")  # set for the reference child of an evaluation slot
    trace = os.environ.pop(TRACE_ENV, "")
    traced = bool(trace) and role == "candidate" and warm == "cuda"  # started before any candidate code loads
    if traced and trace == TRACE_BEFORE_CONTEXT:
        start_trace()
        marks["trace"] = time.monotonic()
    if warm:  # started ahead of its evaluation: pay for torch and the CUDA context now, before any request
        warm_up(warm)
        marks["warm"] = time.monotonic()
    if traced and trace != TRACE_BEFORE_CONTEXT:
        start_trace()
        marks["trace"] = time.monotonic()
    try:
        _serve_requests(role, handler, sock, marks)
    except wire.ChannelClosed:
        # The parent kills its children before it closes their channels, so a closed channel
        # means the parent died (a hung worker killed, say): leave no working folder behind.
        if slot_dir:
            remove_slot_dir(slot_dir)


def _serve_requests(role: str, handler, sock: socket.socket, marks: dict | None) -> None:
    """One reply per request until `exit`; wire.ChannelClosed when the parent is gone."""
    while True:
        request = wire.recv_message(sock)
        cmd = request.get("cmd") if isinstance(request, dict) else None
        if cmd == "exit":
            return
        if cmd == "ready":  # the parent asks when the start is done: the reply carries the marks
            done = {**marks, "ready": time.monotonic()} if marks else None
            wire.send_message(sock, {"ok": True, "start_marks": done})
            marks = None
            continue
        method = getattr(handler, f"do_{cmd}", None) if isinstance(cmd, str) else None
        try:
            if method is None:
                raise HandlerError("internal", f"unknown command {cmd!r} for the {role} child")
            reply = method(request)
            reply.setdefault("ok", True)
        except HandlerError as exc:
            reply = {"ok": False, "kind": exc.kind, "message": exc.message, "detail": exc.detail[-8000:]}
        except Exception as exc:  # a failure of harness code in the child
            reply = {"ok": False, "kind": "internal", "message": one_line(exc),
                     "detail": traceback.format_exc()[-8000:]}
        sys.stdout.flush()
        sys.stderr.flush()
        wire.send_message(sock, reply)


if __name__ == "__main__":
    serve(sys.argv[1] if len(sys.argv) > 1 else "")
