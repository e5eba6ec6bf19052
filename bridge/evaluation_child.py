"""The evaluation child: the process that imports the handler (torch, CUDA) and runs jobs.

Started by the worker supervisor with the ``spawn`` method after ``CUDA_VISIBLE_DEVICES`` is set,
so CUDA initialises here, never in the supervisor. It talks to its supervisor over a pipe in
msgpack only (``Connection.send_bytes``, never pickled objects):

  child -> supervisor  ["ready", capabilities]          once the handler is imported
                       ["fatal", one-line error]         the handler cannot be imported
                       ["result", job id, recycle, result body]
  supervisor -> child  [[job id, service, job body], ...]   jobs to run in order

A handler is ``module:function`` taking the job dict and returning a result dict with a
``status``; a worker serving several services has one handler per service. If the result carries ``needs_recycle: true`` (e.g. the CUDA context hit a sticky
error) or the handler raised, the child reports and exits; the supervisor starts a fresh one.
The module may define ``capabilities() -> dict`` (GPU name, torch version) for registration.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
import time

import msgpack

from bridge import protocol

_PR_SET_PDEATHSIG = 1


def load_handler(spec: str):
    """``"package.module:function"`` -> (function, capabilities function or None)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"handler must look like 'package.module:function', got {spec!r}")
    module = importlib.import_module(module_name)
    handler = getattr(module, attr, None)
    if not callable(handler):
        raise ValueError(f"{module_name} has no callable {attr!r}")
    return handler, getattr(module, "capabilities", None)


def _die_with_parent(parent_pid: int) -> None:
    """Make sure this child never outlives its supervisor (no orphan finishing a stale job)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:
        pass

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(1)
            time.sleep(0.5)

    if os.getppid() != parent_pid:
        os._exit(1)
    threading.Thread(target=watch, daemon=True).start()


def run_job(handler, body: bytes) -> tuple[dict, bool]:
    """Run one job body through the handler. Returns (result, needs_recycle)."""
    try:
        job = protocol.unpack_body(body)
        result = handler(job)
        if not isinstance(result, dict) or "status" not in result:
            return protocol.infra_error(f"handler returned {type(result).__name__} without a 'status'"), True
        return result, bool(result.pop("needs_recycle", False))
    except Exception as exc:
        return protocol.infra_error(f"handler raised {type(exc).__name__}: {exc}"[:2000]), True


def load_handlers(specs: dict) -> tuple[dict, dict]:
    """{service: "module:function"} -> ({service: function}, capabilities of the first module that has them)."""
    handlers, caps = {}, None
    for service, spec in specs.items():
        handlers[service], capabilities = load_handler(spec)
        if caps is None and capabilities is not None:
            caps = dict(capabilities())
    return handlers, caps or {}


def child_main(conn, handler_specs: dict, parent_pid: int) -> None:
    """Entry point of the spawned child."""
    try:
        os.setpgid(0, 0)  # own process group: the supervisor kills compilers we started, too
    except OSError:
        pass
    _die_with_parent(parent_pid)
    try:
        handlers, caps = load_handlers(handler_specs)
    except Exception as exc:
        specs = ", ".join(sorted(set(handler_specs.values())))
        conn.send_bytes(msgpack.packb(["fatal", f"cannot load handler {specs}: {exc}"]))
        return
    caps.setdefault("python", sys.version.split()[0])
    caps.setdefault("handlers", dict(handler_specs))
    conn.send_bytes(msgpack.packb(["ready", caps], use_bin_type=True))
    while True:
        try:
            batch = msgpack.unpackb(conn.recv_bytes(), raw=False)
        except (EOFError, OSError):
            return
        for jid, service, body in batch:
            handler = handlers.get(service)
            if handler is None:
                result, recycle = protocol.infra_error(f"this worker has no handler for service {service!r}"), False
            else:
                result, recycle = run_job(handler, body)
            try:
                packed = protocol.pack_body(result)
            except protocol.ProtocolError as exc:
                packed, recycle = protocol.pack_body(protocol.infra_error(f"result not encodable: {exc}")), True
            conn.send_bytes(msgpack.packb(["result", jid, recycle, packed], use_bin_type=True))
            if recycle:
                return
