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


def raw_dealer(endpoint: str, curve=None, identity: bytes | None = None):
    """A bare DEALER socket (and its context) to send hand-made frames to the broker."""
    import zmq

    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    if identity is not None:
        sock.setsockopt(zmq.ROUTING_ID, identity)
    if curve is not None:
        from bridge.security import secure_client_socket

        secure_client_socket(sock, curve)
    sock.connect(endpoint)
    return context, sock


class RawPeer:
    """A hand-driven peer of the broker (a rogue worker or client): send any message, read the answers."""

    def __init__(self, endpoint: str, curve=None, identity: bytes | None = None):
        self.context, self.socket = raw_dealer(endpoint, curve, identity)
        self.received = []  # every message read so far (protocol.Message)

    def send(self, kind: str, fields=None, payloads=()) -> None:
        from bridge import protocol

        self.socket.send_multipart(protocol.encode(kind, fields, payloads))

    def _read(self, timeout_s: float) -> None:
        import zmq

        from bridge import protocol

        if self.socket.poll(int(timeout_s * 1000), zmq.POLLIN):
            self.received.append(protocol.decode(self.socket.recv_multipart(), 1 << 30))

    def wait_for(self, kind: str, timeout: float = 20.0, heartbeat: bool = False, start: int = 0, unless=None):
        """The first message of ``kind`` received from index ``start`` on, reading (and, if asked,
        heartbeating like a worker) until it comes; None as soon as ``unless()`` is true."""
        from bridge.protocol import Kind

        deadline = time.monotonic() + timeout
        while True:
            found = [m for m in self.received[start:] if m.kind == kind]
            if found:
                return found[0]
            if unless is not None and unless():
                return None
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for a {kind!r} message "
                                     f"(got {[m.kind for m in self.received[start:]]})")
            if heartbeat:
                self.send(Kind.HEARTBEAT)
            self._read(0.05)

    def heartbeat_until(self, predicate, timeout: float = 30.0, what: str = "condition"):
        """Keep this peer alive as a worker (heartbeats every 50 ms) until ``predicate()`` is true."""
        from bridge.protocol import Kind

        deadline = time.monotonic() + timeout
        next_check = 0.0
        while time.monotonic() < deadline:
            self.send(Kind.HEARTBEAT)
            self._read(0.05)
            if time.monotonic() >= next_check:
                value = predicate()
                if value:
                    return value
                next_check = time.monotonic() + 0.2
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")

    def close(self) -> None:
        self.socket.close(0)
        self.context.term()
