"""The trainer's client: submit jobs to the broker and get each result exactly once.

    with BridgeClient("tcp://127.0.0.1:5555") as bridge:
        results = bridge.run_batch("evaluate", jobs, timeout=600)       # blocking
        result = await bridge.submit("evaluate", job, timeout=600)      # asyncio

One background thread owns the DEALER socket (ZeroMQ sockets are not thread-safe); callers
hand it jobs through a queue and a wake-up pipe and wait on futures. The thread:

- batches submissions into few messages; jobs the broker calls "busy" (a bound on its queue or
  on this client's share is reached) are retried with back-off: ``busy_retry_s`` doubling up to
  ``busy_retry_max_s``, with jitter, until their timeout, when the future resolves to an
  ``infra_error`` that says the broker was busy and why. A job without a timeout is retried for
  as long as it takes. Jobs the broker refuses for good (unknown service, larger than a client
  may ever have queued) resolve at once with the broker's reason;
- pings the broker while it waits; when the broker's epoch changes (it restarted) or it has
  been silent for ``liveness`` heartbeats, resubmits every job still waiting. Silence counts
  only while this thread runs: after a stall of the thread itself (the trainer held the
  interpreter for seconds), no pings went out and the broker had nothing to answer, so the
  count starts again. Resubmitting is safe: ids are content-derived, the broker attaches
  duplicates to the running or finished job;
- resolves each future once, acknowledges every result it receives (so the broker can forget
  the delivery), and turns bridge failures into ``{"status": "infra_error", "error": ...}``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import logging
import os
import queue
import random
import threading
import time
import uuid
from dataclasses import dataclass, field

import zmq

from bridge import protocol
from bridge.link import connect_dealer
from bridge.protocol import Kind, ProtocolError
from bridge.security import as_curve_client
from bridge.settings import BridgeSettings

log = logging.getLogger("bridge.client")

_MAX_ITEMS_PER_SUBMIT = 2000
_HOUSEKEEPING_S = 0.02  # deadlines, busy retries, pings and silence are checked this often


@dataclass
class _Waiting:
    """A job this client waits for, and the futures (with deadlines) waiting on it."""

    id: str
    service: str
    body: bytes
    salt: str
    time_limit: float | None
    futures: list = field(default_factory=list)  # (future, deadline or None)
    state: str = "unsent"  # unsent | sent | accepted | busy
    busy_count: int = 0  # "busy" answers so far (the back-off doubles with each)
    busy_reason: str | None = None


class BridgeClient:
    """Client of one broker. Thread-safe; usable from asyncio and from plain threads."""

    def __init__(self, endpoint: str, *, curve=None, settings: BridgeSettings | None = None,
                 time_limit: float | None = None):
        self.endpoint = endpoint
        self.settings = settings or BridgeSettings()
        self.time_limit = time_limit  # per-evaluation limit sent to workers (None: broker default)
        self._curve = as_curve_client(curve, "client")
        self._identity = f"c-{uuid.uuid4().hex}".encode()
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        self._closed = False
        self._error: str | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bridge-client", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error:
            raise RuntimeError(self._error)

    # ------------------------------------------------------------------ public API
    def submit_future(self, service: str, job: dict, timeout: float | None = None,
                      salt: str = "") -> concurrent.futures.Future:
        """Submit one job; the future resolves to its result dict (never raises for bridge failures)."""
        return self.submit_many(service, [job], timeout, salt)[0]

    def submit_many(self, service: str, jobs: list, timeout: float | None = None,
                    salt: str = "") -> list[concurrent.futures.Future]:
        """Submit jobs in one go; one future per job, in order."""
        deadline = None if timeout is None else time.monotonic() + timeout
        entries, futures = [], []
        for job in jobs:
            future: concurrent.futures.Future = concurrent.futures.Future()
            futures.append(future)
            try:
                body = protocol.pack_body(job)
            except ProtocolError as exc:
                future.set_result(protocol.infra_error(str(exc)))
                continue
            if len(body) > self.settings.max_message_bytes:
                future.set_result(protocol.infra_error(
                    f"job of {len(body)} bytes exceeds the bridge's message limit of {self.settings.max_message_bytes} bytes"))
                continue
            entries.append((protocol.job_id(service, body, salt), service, body, salt, future, deadline))
        if self._closed:
            for *_, future, _ in entries:
                future.set_result(protocol.infra_error("bridge client is closed"))
        elif entries:
            self._command(("submit", entries))
        return futures

    async def submit(self, service: str, job: dict, timeout: float | None = None, salt: str = "") -> dict:
        """Await one job's result (a dict with "status")."""
        return await asyncio.wrap_future(self.submit_future(service, job, timeout, salt))

    def run_batch(self, service: str, jobs: list, timeout: float | None = None, salt: str = "") -> list[dict]:
        """Submit jobs and block until each has a result (or its timeout passed). Results in order."""
        return [f.result() for f in self.submit_many(service, jobs, timeout, salt)]

    def status(self, timeout: float = 5.0) -> dict | None:
        """The broker's status snapshot, or None when no broker answered within ``timeout``."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._command(("status", future))
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            return None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._command(("close", None))
        self._thread.join(timeout=10)
        os.close(self._wake_read)
        os.close(self._wake_write)

    def __enter__(self) -> "BridgeClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ I/O thread
    def _command(self, command) -> None:
        self._commands.put(command)
        try:
            os.write(self._wake_write, b"\0")
        except (BlockingIOError, OSError):
            pass

    def _open_socket(self, context):
        return connect_dealer(context, self._identity, self.endpoint, self.settings, self._curve)

    def _run(self) -> None:
        context = zmq.Context()
        try:
            self._socket = self._open_socket(context)
        except Exception as exc:
            self._error = f"cannot connect to {self.endpoint}: {exc}"
            self._started.set()
            context.term()
            return
        self._started.set()
        self._waiting: dict[str, _Waiting] = {}
        self._status_waiters: list = []
        self._acks: list = []
        self._deadlines: list = []  # heap of (deadline, seq, job id, future)
        self._busy: dict = {}  # job id -> when to resubmit it
        self._unsent: list = []  # waiting jobs to (re)submit; stale entries are skipped
        self._seq = 0
        self._epoch = None
        self._last_heard = time.monotonic()
        self._last_ping = 0.0
        self._last_housekeeping = time.monotonic()
        next_housekeeping = 0.0
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        poller.register(self._wake_read, zmq.POLLIN)
        try:
            while True:
                poller.poll(self._poll_timeout_ms())
                if not self._take_commands():
                    break
                self._receive()
                now = time.monotonic()
                if now >= next_housekeeping:
                    self._housekeeping(now)
                    next_housekeeping = now + _HOUSEKEEPING_S
                self._send_unsent()
        finally:
            for waiting in self._waiting.values():
                for future, _ in waiting.futures:
                    _resolve(future, protocol.infra_error("bridge client closed before the result arrived"))
            for future in self._status_waiters:
                _resolve(future, None)
            if self._acks:
                self._send(Kind.ACK, {"ids": self._acks})
            self._socket.close(linger=200)  # let the last acknowledgements leave
            context.term()

    def _poll_timeout_ms(self) -> float:
        return min(self.settings.heartbeat_s, _HOUSEKEEPING_S if self._waiting else 1.0) * 1000

    def _take_commands(self) -> bool:
        try:
            while os.read(self._wake_read, 4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                kind, payload = self._commands.get_nowait()
            except queue.Empty:
                return True
            if kind == "close":
                return False
            if kind == "status":
                self._status_waiters.append(payload)
                self._send(Kind.STATUS)
            elif kind == "submit":
                for jid, service, body, salt, future, deadline in payload:
                    waiting = self._waiting.get(jid)
                    if waiting is None:
                        waiting = self._waiting[jid] = _Waiting(jid, service, body, salt, self.time_limit)
                        self._unsent.append(waiting)
                    waiting.futures.append((future, deadline))
                    if deadline is not None:
                        self._seq += 1
                        heapq.heappush(self._deadlines, (deadline, self._seq, jid, future))

    def _send(self, kind: str, fields=None, payloads=()) -> bool:
        try:
            self._socket.send_multipart(protocol.encode(kind, fields, payloads), zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def _send_unsent(self) -> None:
        if not self._unsent:
            unsent = []
        else:
            unsent = [w for w in self._unsent if w.state == "unsent" and self._waiting.get(w.id) is w]
            self._unsent = []
        limit = self.settings.max_message_bytes // 2
        start = 0
        while start < len(unsent):
            end, size = start, 0
            while end < len(unsent) and end - start < _MAX_ITEMS_PER_SUBMIT and (
                end == start or size + len(unsent[end].body) <= limit
            ):
                size += len(unsent[end].body)
                end += 1
            batch = unsent[start:end]
            items, payloads = [], []
            for w in batch:
                item = {"id": w.id, "service": w.service}
                if w.salt:
                    item["salt"] = w.salt
                if w.time_limit:
                    item["time_limit"] = w.time_limit
                items.append(protocol.attach(item, w.body, payloads))
            if not self._send(Kind.SUBMIT, {"items": items}, payloads):
                self._unsent = unsent[start:] + self._unsent  # link full: try again next iteration
                break
            for w in batch:
                w.state = "sent"
            start = end
        if self._acks:
            if self._send(Kind.ACK, {"ids": self._acks}):
                self._acks = []

    def _receive(self) -> None:
        while True:
            try:
                frames = self._socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._last_heard = time.monotonic()
            try:
                message = protocol.decode(frames, 8 * self.settings.max_message_bytes)
                self._on_message(message)
            except ProtocolError as exc:
                log.warning("unreadable message from broker: %s", exc)

    def _on_message(self, message) -> None:
        fields = message.fields
        if message.kind in (Kind.ACCEPTED, Kind.PONG):
            self._note_epoch(fields.get("epoch"))
        if message.kind == Kind.RESULTS:
            for item in protocol.items_of(message, ("id",)):
                jid = item["id"]
                self._acks.append(jid)
                waiting = self._waiting.pop(jid, None)
                if waiting is None:
                    continue  # a duplicate delivery, or nobody waits any more: reported once only
                try:
                    result = protocol.unpack_body(protocol.payload_of(message, item))
                except ProtocolError as exc:
                    result = protocol.infra_error(f"result could not be decoded: {exc}")
                for future, _ in waiting.futures:
                    _resolve(future, result)
        elif message.kind == Kind.ACCEPTED:
            for jid in fields.get("ids") or []:
                if jid in self._waiting and self._waiting[jid].state == "sent":
                    self._waiting[jid].state = "accepted"
            for jid in fields.get("busy") or []:
                waiting = self._waiting.get(jid)
                if waiting is not None and waiting.state == "sent":
                    waiting.state = "busy"
                    waiting.busy_reason = fields.get("busy_reason")
                    delay = min(self.settings.busy_retry_max_s, self.settings.busy_retry_s * 2 ** waiting.busy_count)
                    waiting.busy_count += 1
                    self._busy[jid] = time.monotonic() + delay * random.uniform(0.75, 1.25)
            for error in fields.get("errors") or []:
                if isinstance(error, dict):
                    self._refused(error.get("id"), error.get("error"))
        elif message.kind == Kind.STATUS_REPLY:
            for future in self._status_waiters:
                _resolve(future, fields.get("status"))
            self._status_waiters = []
        elif message.kind == Kind.ERROR:
            log.warning("broker error: %s", fields.get("error"))
            for jid in fields.get("ids") or []:  # an answer to a submission: those jobs are refused
                self._refused(jid, fields.get("error"))

    def _refused(self, jid, reason) -> None:
        waiting = self._waiting.pop(jid, None) if isinstance(jid, str) else None
        if waiting is not None:
            self._busy.pop(jid, None)
            for future, _ in waiting.futures:
                _resolve(future, protocol.infra_error(f"broker refused the job: {reason}", job_id=jid))

    def _note_epoch(self, epoch) -> None:
        if epoch and self._epoch and epoch != self._epoch:
            log.info("broker restarted (epoch %s -> %s): resubmitting %d jobs", self._epoch[:8], epoch[:8],
                     len(self._waiting))
            self._resubmit_all()
        if epoch:
            self._epoch = epoch

    def _resubmit_all(self) -> None:
        self._unsent = []
        for waiting in self._waiting.values():
            waiting.state = "unsent"
            self._unsent.append(waiting)

    def _housekeeping(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, jid, future = heapq.heappop(self._deadlines)
            waiting = self._waiting.get(jid)
            if waiting is None or future.done():
                continue
            if waiting.state == "busy" or (waiting.busy_count and waiting.state != "accepted"):
                error = (f"the broker at {self.endpoint} was busy and did not accept the job within the timeout "
                         f"({waiting.busy_count} tries; last reason: {waiting.busy_reason})")
            else:
                error = f"no result from the bridge at {self.endpoint} within the timeout"
            _resolve(future, protocol.infra_error(error, job_id=jid))
            waiting.futures = [(f, d) for f, d in waiting.futures if f is not future]
            if not waiting.futures:
                del self._waiting[jid]
                self._busy.pop(jid, None)
        for jid, retry_at in list(self._busy.items()):
            waiting = self._waiting.get(jid)
            if waiting is None or waiting.state != "busy":
                del self._busy[jid]
            elif now >= retry_at:
                waiting.state = "unsent"
                self._unsent.append(waiting)
                del self._busy[jid]
        if now - self._last_housekeeping > self.settings.heartbeat_s:
            self._last_heard = now  # this thread stalled (or idled): no pings went out, so no silence either
        self._last_housekeeping = now
        if self._waiting or self._status_waiters:
            if now - self._last_heard > self.settings.silence_limit_s and self._waiting:
                log.warning("broker at %s silent for %.1f s: resubmitting %d jobs", self.endpoint,
                            now - self._last_heard, len(self._waiting))
                self._resubmit_all()
                self._last_heard = now
            if now - self._last_ping >= self.settings.heartbeat_s:
                self._send(Kind.PING)
                self._last_ping = now


def _resolve(future: concurrent.futures.Future, value) -> None:
    if not future.done():
        try:
            future.set_result(value)
        except concurrent.futures.InvalidStateError:
            pass
