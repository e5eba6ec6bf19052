"""Start real brokers and workers as separate processes for the bridge tests (loopback only)."""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
import time

from bridge.settings import FAST_TEST_SETTINGS

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:  # spawned children inherit sys.path: tests.bridge_handlers resolves
    sys.path.insert(0, REPO_ROOT)

SPAWN = multiprocessing.get_context("spawn")


def free_tcp_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _broker_main(bind, journal, settings, curve):
    import logging

    from bridge.broker import serve_broker

    logging.basicConfig(level=logging.WARNING)
    serve_broker(bind, journal, settings, curve)


def _worker_main(endpoint, services, handler, settings, capacity, curve, name):
    import logging

    from bridge.worker import serve_worker

    logging.basicConfig(level=logging.WARNING)
    serve_worker(endpoint, services, handler, settings, gpu="", capacity=capacity, curve=curve, name=name)


def start_broker(bind, journal, settings=FAST_TEST_SETTINGS, curve=None):
    proc = SPAWN.Process(target=_broker_main, args=(bind, str(journal), settings.to_dict(), curve), daemon=True)
    proc.start()
    return proc


def start_worker(endpoint, handler, services=("evaluate",), settings=FAST_TEST_SETTINGS, capacity=1,
                 curve=None, name=None):
    proc = SPAWN.Process(
        target=_worker_main,
        args=(endpoint, list(services), f"tests.bridge_handlers:{handler}", settings.to_dict(), capacity, curve, name),
        daemon=False,  # it starts its own evaluation child
    )
    proc.start()
    return proc


def wait_for(predicate, timeout=15.0, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def wait_for_workers(client, count, timeout=30.0):
    """Block until the broker lists ``count`` registered workers; returns the status."""

    def enough():
        status = client.status(timeout=2.0)
        return status if status and len(status["workers"]) >= count else None

    return wait_for(enough, timeout, what=f"{count} workers to register")


def stop(proc, timeout=5.0):
    if proc.is_alive():
        proc.terminate()
        proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join(timeout)


def read_lines(path) -> list[str]:
    return open(path).read().splitlines() if os.path.exists(path) else []


def parent_pid(pid: int) -> int:
    """The parent of a process, read from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def raw_dealer(endpoint: str):
    """A bare DEALER socket (and its context) to send hand-made frames to the broker."""
    import zmq

    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(endpoint)
    return context, sock
