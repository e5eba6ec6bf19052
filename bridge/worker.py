"""The worker supervisor: a torch-free process that talks to the broker for one evaluation child.

Paranoid Pirate worker: a DEALER that registers (``ready`` with its services, capabilities and
the jobs it still holds), heartbeats every ``heartbeat_s`` whatever its child is doing, and
reconnects with exponential back-off when the broker falls silent. The evaluation itself runs
in a child (:mod:`bridge.evaluation_child`) started with ``spawn``; the supervisor

- kills and replaces the child when a job overruns its time limit, when the child dies, or when
  a result asks for it (``needs_recycle``: a CUDA error poisons the context), and reports the
  attempt as failed so the broker can retry it elsewhere;
- sets ``CUDA_VISIBLE_DEVICES`` before the child exists (one worker per GPU; compile workers get
  no GPU at all);
- drains on SIGTERM: takes no new jobs, finishes the one running, hands back the rest, leaves.

Every job arrives with a lease (a token and an attempt number); the supervisor returns it with
the job's result or failure and in its registration, and never passes it to the evaluation
child: code under evaluation cannot learn it, so it cannot answer for its own job.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket as socketlib
import threading
import time
import uuid
from collections import deque

import msgpack
import zmq

from bridge import protocol
from bridge.evaluation_child import child_main
from bridge.link import connect_dealer
from bridge.protocol import Kind, ProtocolError
from bridge.settings import BridgeSettings

log = logging.getLogger("bridge.worker")

_MAX_START_FAILURES = 3  # children dying before they are ready, in a row, before we give up


class WorkerExit(RuntimeError):
    """The worker cannot run (its handler does not load, its child keeps dying)."""


class _Child:
    """One evaluation child and the jobs sent to it (the first is running)."""

    def __init__(self, handler_specs: dict):
        context = multiprocessing.get_context("spawn")
        self.conn, child_end = context.Pipe(duplex=True)
        self.process = context.Process(
            target=child_main, args=(child_end, handler_specs, os.getpid()), daemon=True, name="evaluation-child"
        )
        self.process.start()
        child_end.close()
        self.ready = False
        self.capabilities: dict = {}
        self.jobs: deque = deque()  # (id, body, time_limit, service, lease, attempt) in the order sent
        self.head_started = 0.0

    def send(self, jobs: list) -> None:
        if not self.jobs:
            self.head_started = time.monotonic()
        self.jobs.extend(jobs)
        self.conn.send_bytes(msgpack.packb([[j[0], j[3], j[1]] for j in jobs], use_bin_type=True))

    def kill(self) -> None:
        if self.process.is_alive():
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


class WorkerSupervisor:
    def __init__(self, endpoint: str, services, handler, settings: BridgeSettings = BridgeSettings(),
                 capacity: int = 1, curve=None, name: str | None = None):
        """``handler``: one "module:function" for every service, or {service: "module:function"}."""
        self.endpoint = endpoint
        self.services = [services] if isinstance(services, str) else list(services)
        self.handlers = dict(handler) if isinstance(handler, dict) else {s: handler for s in self.services}
        missing = [s for s in self.services if s not in self.handlers]
        if missing:
            raise WorkerExit(f"no handler given for service(s) {', '.join(missing)}")
        self.settings = settings
        self.capacity = capacity
        self.curve = curve
        self.identity = (name or f"w-{socketlib.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}").encode()
        self.context = zmq.Context()
        self.socket = None
        self.waiting: deque = deque()  # jobs received, not yet given to the child (see _Child.jobs)
        self.done: list = []  # (id, lease, attempt, result body) to report
        self.failed: list = []  # (id, lease, attempt, reason) to report
        self.draining = False
        self.stop_now = False
        self.registered = False
        self.recycles = 0
        self.child: _Child | None = None
        self._start_failures = 0

    # ------------------------------------------------------------------ broker link
    def _connect(self) -> None:
        if self.socket is not None:
            self.socket.close(linger=100)  # give results already sent a moment to leave
        self.socket = connect_dealer(self.context, self.identity, self.endpoint, self.settings, self.curve)
        self.last_heard = time.monotonic()
        self.last_sent = 0.0

    def _send(self, kind: str, fields=None, payloads=()) -> None:
        try:
            self.socket.send_multipart(protocol.encode(kind, fields, payloads), zmq.NOBLOCK)
            self.last_sent = time.monotonic()
        except zmq.Again:
            log.warning("broker link full; dropped a %s message (the broker will requeue if needed)", kind)

    def held(self) -> list:
        """{id, lease, attempt} of every job this worker holds (to claim them when it registers again)."""
        jobs = [(j[0], j[4], j[5]) for j in self.waiting]
        if self.child is not None:
            jobs += [(j[0], j[4], j[5]) for j in self.child.jobs]
        jobs += [d[:3] for d in self.done]
        return [{"id": jid, "lease": lease, "attempt": attempt} for jid, lease, attempt in jobs]

    def _register(self) -> None:
        caps = dict(self.child.capabilities) if self.child else {}
        caps.setdefault("cuda_visible_devices", os.environ.get("CUDA_VISIBLE_DEVICES"))
        self._send(Kind.READY, {"services": self.services, "capabilities": caps, "capacity": self.capacity,
                                "inflight": self.held()})
        self.registered = True
        self.last_heard = time.monotonic()  # the broker's silence is counted from now (a child may start slowly)

    def _on_broker(self, frames: list) -> None:
        self.last_heard = time.monotonic()
        try:
            message = protocol.decode(frames, 8 * self.settings.max_message_bytes)
        except ProtocolError as exc:
            log.warning("unreadable message from broker: %s", exc)
            return
        if message.kind == Kind.JOBS:
            try:
                items = protocol.items_of(message, ("id", "lease", "attempt"))
                jobs = [(item["id"], protocol.payload_of(message, item), item.get("time_limit"),
                         item.get("service", self.services[0]), item["lease"], item["attempt"]) for item in items]
            except ProtocolError as exc:
                log.warning("unusable jobs message from broker: %s", exc)
                return
            self.waiting.extend(jobs)
        elif message.kind == Kind.REREGISTER:
            if self.child is not None and self.child.ready:
                self._register()
        elif message.kind == Kind.ERROR:
            log.warning("broker says: %s", message.fields.get("error"))

    # ------------------------------------------------------------------ child management
    def _start_child(self) -> None:
        self.child = _Child(self.handlers)

    def _recycle(self, reason: str | None) -> None:
        """Kill the child; report its running job as failed (if reason) and keep the rest."""
        child = self.child
        child.kill()
        if child.jobs:
            head = child.jobs.popleft()
            if reason is not None:
                self.failed.append((head[0], head[4], head[5], reason))
            else:
                child.jobs.appendleft(head)
            self.waiting.extendleft(reversed(child.jobs))
        self.recycles += 1
        self.child = None
        self._start_child()

    def _on_child(self) -> None:
        child = self.child
        while child.conn.poll(0):
            try:
                message = msgpack.unpackb(child.conn.recv_bytes(), raw=False)
            except (EOFError, OSError):
                return  # the liveness check below notices the death
            if message[0] == "ready":
                child.ready, child.capabilities = True, message[1]
                self._start_failures = 0
                if not self.registered:
                    self._register()
            elif message[0] == "fatal":
                raise WorkerExit(message[1])
            elif message[0] == "result":
                _, jid, recycle, body = message
                job = next((j for j in child.jobs if j[0] == jid), None)
                if job is None:
                    log.warning("the child reported job %s, which it was not given; ignored", str(jid)[:12])
                    continue
                child.jobs.remove(job)
                child.head_started = time.monotonic()
                self.done.append((jid, job[4], job[5], body))
                if recycle:
                    log.warning("child asked to be recycled after job %s", jid[:12])
                    self._recycle(None)
                    return

    def _check_child(self) -> None:
        child = self.child
        if not child.process.is_alive():
            code = child.process.exitcode
            if not child.ready:
                self._start_failures += 1
                if self._start_failures >= _MAX_START_FAILURES:
                    raise WorkerExit(f"evaluation child died {self._start_failures} times while starting (exit {code})")
            what = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            self._recycle(f"evaluation process died ({what}); worker recycled")
            return
        if child.jobs:
            limit = child.jobs[0][2] or self.settings.time_limit_s
            if time.monotonic() - child.head_started > limit:
                self._recycle(f"evaluation exceeded its time limit of {limit:g} s; worker recycled")

    def _feed_child(self) -> None:
        child = self.child
        if child.ready and not child.jobs and self.waiting and not self.draining:
            batch = list(self.waiting)
            self.waiting.clear()
            child.send(batch)

    def _report(self) -> None:
        if self.done:
            payloads = []
            items = [protocol.attach({"id": jid, "lease": lease, "attempt": attempt}, body, payloads)
                     for jid, lease, attempt, body in self.done]
            self._send(Kind.DONE, {"items": items}, payloads)
            self.done = []
        if self.failed:
            self._send(Kind.FAILED, {"items": [{"id": jid, "lease": lease, "attempt": attempt, "reason": r}
                                               for jid, lease, attempt, r in self.failed]})
            self.failed = []

    # ------------------------------------------------------------------ loop
    def request_drain(self) -> None:
        if self.draining:
            self.stop_now = True
        self.draining = True

    def run(self) -> None:
        self._start_child()
        self._connect()
        backoff = self.settings.reconnect_min_s
        bye_sent = False
        try:
            while not self.stop_now:
                poller = zmq.Poller()
                poller.register(self.socket, zmq.POLLIN)
                poller.register(self.child.conn.fileno(), zmq.POLLIN)
                poller.poll(self.settings.heartbeat_s * 1000 / 2)
                while True:
                    try:
                        frames = self.socket.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._on_broker(frames)
                self._on_child()
                self._check_child()
                if self.draining and self.registered and not bye_sent:
                    self._send(Kind.BYE, {"final": False})
                    bye_sent = True
                self._feed_child()
                self._report()
                if self.draining and not self.child.jobs:
                    self._send(Kind.BYE, {"final": True})  # broker requeues what is still waiting
                    break
                now = time.monotonic()
                if self.registered and now - self.last_sent >= self.settings.heartbeat_s:
                    self._send(Kind.HEARTBEAT)
                if self.registered and now - self.last_heard > self.settings.silence_limit_s:
                    log.warning("broker silent for %.1f s; reconnecting in %.2f s", now - self.last_heard, backoff)
                    time.sleep(backoff)
                    backoff = min(backoff * 2, self.settings.reconnect_max_s)
                    self._connect()
                    self._register()
                elif now - self.last_heard < self.settings.heartbeat_s:
                    backoff = self.settings.reconnect_min_s
        finally:
            if self.child is not None:
                self.child.kill()
            if self.socket is not None:
                self.socket.close(linger=200)
            self.context.term()


def serve_worker(endpoint: str, services, handler, settings: BridgeSettings | dict | None = None,
                 gpu: str | None = None, capacity: int = 1, curve=None, name: str | None = None,
                 drain_on_sigint: bool = True) -> None:
    """Run one worker until SIGTERM (drain) or a second SIGTERM (stop now).

    ``drain_on_sigint=False`` ignores SIGINT (a fleet's supervisors: Ctrl-C reaches the whole
    process group, and the fleet forwards one SIGTERM, so each worker drains once).

    ``gpu``: the device index this worker owns ("0"), or "" for no GPU (compile workers), or
    None to leave ``CUDA_VISIBLE_DEVICES`` as inherited. Set before the child is spawned.
    """
    if isinstance(settings, dict) or settings is None:
        settings = BridgeSettings.from_dict(settings)
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    supervisor = WorkerSupervisor(endpoint, services, handler, settings, capacity, curve, name)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: supervisor.request_drain())
        signal.signal(signal.SIGINT, (lambda *_: supervisor.request_drain()) if drain_on_sigint else signal.SIG_IGN)
    supervisor.run()
