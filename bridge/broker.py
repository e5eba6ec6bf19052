"""The broker: one ROUTER socket between trainer clients and the evaluator fleet.

Patterns (docs/paper.md §11): Majordomo service names (``compile`` on CPU workers, ``evaluate``
on GPU workers), Paranoid Pirate heartbeats and liveness both ways, Titanic persistence (a job
is journaled before it is acknowledged). What the guide's brokers lack and this one adds:

- in-flight tracking: a job held by a worker that goes silent, or whose evaluation child died
  or hung, is requeued; after ``max_attempts`` failed attempts it ends as an ``infra_error``;
- idempotency: job ids are content-derived, a duplicate of a queued, running or finished job
  is attached to it, and every waiting client gets the one result;
- authority: a result counts only when it returns the lease the broker issued with the job
  (token, worker identity and attempt must all match); under CURVE every message is also checked
  against the role of the key that sent it (client or worker);
- bounded queues: past ``max_queue`` queued jobs, or a client's bound in jobs or bytes, new jobs
  are answered "busy" (the client retries), never dropped; jobs for a service nobody serves are
  refused at submission;
- ``ROUTER_MANDATORY``: a result for a client that is not connected stays owed (in memory and
  in the journal) and is sent when the client speaks again.

One loop iteration drains up to ``_DRAIN`` messages, commits the journal once, dispatches
queued jobs to workers with free capacity, then sends everything it owes.
"""

from __future__ import annotations

import errno
import logging
import math
import signal
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

import zmq

from bridge import protocol
from bridge.journal import Journal
from bridge.link import HIGH_WATER_MARK
from bridge.protocol import CLIENT_KINDS, WORKER_KINDS, Kind, ProtocolError
from bridge.security import role_of
from bridge.settings import BridgeSettings

log = logging.getLogger("bridge.broker")

_DRAIN = 4096  # messages handled per loop iteration before the journal commit
_PRUNE_EVERY_S = 600.0
_MAX_SERVICE_NAME = 64
_MAX_SERVICES_PER_WORKER = 32
_MAX_SERVICES = 1024  # names the broker will ever learn from workers (each is journaled)
_WARN_EVERY_S = 1.0  # refusals are counted always, logged at most once a second


@dataclass
class JobState:
    """A job the broker owes a result for (queued, or held by ``worker``)."""

    id: str
    service: str
    body: bytes
    time_limit: float | None
    attempts: int = 0
    failures: list = field(default_factory=list)
    waiters: set = field(default_factory=set)
    worker: bytes | None = None  # the registered worker counting it in its inflight (None: queued)
    owner: bytes = b""  # the client it counts against (its CURVE key, or its routing id without CURVE)
    # The lease in force: the one (worker, attempt, token) whose result the broker will accept.
    # Only the token's sha256 is kept. A job restored after a restart may be queued and still
    # leased (the worker that held it may come back with its result).
    lease_worker: bytes | None = None
    lease_attempt: int | None = None
    lease_hash: bytes | None = None

    def clear_lease(self) -> None:
        self.lease_worker = self.lease_attempt = self.lease_hash = None


@dataclass
class WorkerState:
    """A registered worker (one evaluation process, e.g. one GPU)."""

    id: bytes
    services: tuple
    capabilities: dict
    capacity: int
    last_seen: float
    inflight: set = field(default_factory=set)
    draining: bool = False
    key: str | None = None  # the CURVE key that registered it (its later messages must come with it)

    @property
    def free(self) -> int:
        return 0 if self.draining else self.capacity - len(self.inflight)


class Broker:
    """State and message handling; :meth:`serve` runs the loop until ``stop`` is set."""

    def __init__(self, bind, journal_path, settings: BridgeSettings = BridgeSettings(), curve=None):
        self.settings = settings
        self.epoch = uuid.uuid4().hex
        self.started = time.time()
        self.journal = Journal(journal_path)
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.socket.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.socket.setsockopt(zmq.LINGER, 1000)
        self.socket.setsockopt(zmq.SNDHWM, HIGH_WATER_MARK)
        self.socket.setsockopt(zmq.RCVHWM, HIGH_WATER_MARK)
        # Backstop against memory exhaustion; messages between the limit and 4x it get an
        # error answer, beyond that libzmq drops the connection.
        self.socket.setsockopt(zmq.MAXMSGSIZE, 4 * settings.max_message_bytes)
        self.auth = None
        if curve is not None:
            from bridge.security import secure_server_socket

            try:
                self.auth = secure_server_socket(self.context, self.socket, curve)
            except Exception:
                self.socket.close(linger=0)
                self.context.term()
                self.journal.close()
                raise
        self.endpoints = []
        for endpoint in [bind] if isinstance(bind, str) else list(bind):
            self.socket.bind(endpoint)
            self.endpoints.append(self.socket.getsockopt_string(zmq.LAST_ENDPOINT))
        self.jobs: dict[str, JobState] = {}
        self.queues: dict[str, deque] = {}
        self.workers: dict[bytes, WorkerState] = {}
        self.to_send: dict[bytes, dict[str, bytes]] = {}  # client -> {job id: result} not yet sent
        self.unreachable: set = set()  # clients a send failed to; retried when they speak, or next tick
        self.client_seen: dict[bytes, float] = {}  # client -> monotonic time of its last message
        self.outbox: list = []  # (identity, frames) to send after the journal commit
        self.completions: deque = deque()  # monotonic times of recent completions (throughput)
        self.counters = {"accepted": 0, "completed": 0, "duplicates": 0, "busy": 0, "errors": 0, "requeued": 0,
                         "workers_registered": 0, "workers_reregistered": 0, "workers_lost": 0,
                         "leases_refused": 0, "roles_refused": 0, "unknown_service": 0, "too_large": 0}
        self.known_services: set = set(settings.services) | self.journal.services()
        self.client_load: dict[bytes, list] = {}  # owner -> [unfinished jobs, bytes of their bodies]
        self.unfinished_bytes = 0
        self._user: str | None = None  # the User-Id (CURVE role and key) of the message being handled
        self._warned_at = 0.0
        self._unwarned = 0
        self._restore()
        self._handlers = {
            Kind.SUBMIT: self._on_submit,
            Kind.ACK: self._on_ack,
            Kind.PING: self._on_ping,
            Kind.STATUS: self._on_status,
            Kind.READY: self._on_ready,
            Kind.HEARTBEAT: self._on_heartbeat,
            Kind.DONE: self._on_done,
            Kind.FAILED: self._on_failed,
            Kind.BYE: self._on_bye,
        }

    # ------------------------------------------------------------------ restore
    def _restore(self) -> None:
        """Requeue journaled unfinished jobs and owe journaled undelivered results."""
        for pending in self.journal.pending_jobs():
            owner = pending.owner or min(pending.waiters, default=b"")
            job = self.jobs[pending.id] = JobState(
                pending.id, pending.service, pending.body, pending.time_limit,
                pending.attempts, pending.failures, set(pending.waiters), owner=owner,
                lease_worker=pending.lease_worker, lease_attempt=pending.lease_attempt, lease_hash=pending.lease_hash,
            )
            self._charge(job)
            self.known_services.add(pending.service)
            self.queues.setdefault(pending.service, deque()).append(pending.id)
        for client, jid, result in self.journal.undelivered_results():
            self.to_send.setdefault(client, {})[jid] = result
            self.client_seen[client] = time.monotonic()
        if self.jobs or self.to_send:
            log.info("restored %d unfinished jobs and %d owed results", len(self.jobs),
                     sum(len(v) for v in self.to_send.values()))

    # ------------------------------------------------------------------ loop
    def serve(self, stop: threading.Event | None = None) -> None:
        stop = stop or threading.Event()
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        # Disconnect events: a worker process that dies closes its TCP/IPC connection at once;
        # probing the workers then finds it without waiting for its heartbeats to run out.
        monitor = self.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        poller.register(monitor, zmq.POLLIN)
        tick = self.settings.heartbeat_s
        next_tick = time.monotonic() + tick
        next_prune = time.monotonic() + _PRUNE_EVERY_S
        try:
            while not stop.is_set():
                timeout_ms = max(0.0, (next_tick - time.monotonic()) * 1000)
                if poller.poll(min(timeout_ms, 200)):
                    for _ in range(_DRAIN):
                        try:
                            if self.auth is None:
                                self._handle(self.socket.recv_multipart(zmq.NOBLOCK))
                            else:
                                self._handle(*self._recv_with_user())
                        except zmq.Again:
                            break
                    if self._drain_monitor(monitor):
                        self._probe_workers()
                self._dispatch()
                self.journal.commit()  # persist before any acknowledgement leaves
                self._flush()
                now = time.monotonic()
                if now >= next_tick:
                    self._on_tick(now)
                    next_tick = now + tick
                if now >= next_prune:
                    self._forget_stale_clients(now)
                    next_prune = now + _PRUNE_EVERY_S
        finally:
            self.socket.disable_monitor()
            monitor.close(linger=0)
            self.close()

    def _recv_with_user(self) -> tuple[list, str | None]:
        """One message and the User-Id ZeroMQ attached to it (set by our ZAP handler at the handshake)."""
        parts = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
        user = None
        if len(parts) > 1:
            try:
                user = parts[1].get("User-Id")
            except zmq.ZMQError:
                user = None
        return [part.bytes for part in parts], user

    @staticmethod
    def _drain_monitor(monitor) -> bool:
        """Consume pending monitor events; True if any peer disconnected."""
        seen = False
        while True:
            try:
                monitor.recv_multipart(zmq.NOBLOCK)
                seen = True
            except zmq.Again:
                return seen

    def _probe_workers(self) -> None:
        """After a disconnect: a worker ZeroMQ no longer routes to is gone; requeue its jobs now."""
        for wid in list(self.workers):
            if self._unroutable(wid):
                self._worker_lost(wid, "disconnected")

    def _unroutable(self, identity: bytes) -> bool:
        try:
            self.socket.send_multipart([identity, *protocol.encode(Kind.HEARTBEAT)], zmq.NOBLOCK)
            return False
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            return exc.errno == errno.EHOSTUNREACH

    def _worker_lost(self, wid: bytes, why: str) -> None:
        worker = self.workers.pop(wid, None)
        if worker is None:
            return
        self.counters["workers_lost"] += 1
        log.warning("worker %s %s: requeueing %d jobs", wid, why, len(worker.inflight))
        for jid in list(worker.inflight):
            job = self.jobs.get(jid)
            if job is not None and job.worker == wid:
                self._attempt_failed(job, f"worker {wid.decode(errors='replace')} {why}")

    def close(self) -> None:
        try:
            self.journal.close()
        except Exception:
            pass
        self.socket.close(linger=0)
        if self.auth is not None:
            self.auth.stop()
        self.context.term()

    # ------------------------------------------------------------------ I/O helpers
    def _queue(self, identity: bytes, kind: str, fields=None, payloads=()) -> None:
        self.outbox.append((identity, protocol.encode(kind, fields, payloads)))

    def _send_now(self, identity: bytes, frames: list) -> bool:
        """Send one message; False if the peer is unknown to ZeroMQ or its pipe is full."""
        try:
            self.socket.send_multipart([identity, *frames], zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            if exc.errno == errno.EHOSTUNREACH:
                return False
            raise

    def _flush(self) -> None:
        outbox, self.outbox = self.outbox, []
        for identity, frames in outbox:
            self._send_now(identity, frames)
        for client in list(self.to_send):
            if client not in self.unreachable:
                self._send_results(client)

    def _send_results(self, client: bytes) -> None:
        """Send owed results to a client in as few messages as the size limit allows."""
        owed = self.to_send.get(client)
        if not owed:
            return
        limit = self.settings.max_message_bytes // 2
        batch, payloads, size = [], [], 0
        sent = []
        reachable = True
        for jid, result in owed.items():
            if batch and size + len(result) > limit:
                if not self._send_now(client, protocol.encode(Kind.RESULTS, {"items": batch}, payloads)):
                    reachable = False
                    break
                sent += [item["id"] for item in batch]
                batch, payloads, size = [], [], 0
            batch.append(protocol.attach({"id": jid}, result, payloads))
            size += len(result)
        else:
            if batch:
                if self._send_now(client, protocol.encode(Kind.RESULTS, {"items": batch}, payloads)):
                    sent += [item["id"] for item in batch]
                else:
                    reachable = False
        if not reachable:
            self.unreachable.add(client)
        for jid in sent:
            del owed[jid]
        if not owed:
            del self.to_send[client]

    # ------------------------------------------------------------------ dispatch
    def _handle(self, frames: list, user: str | None = None) -> None:
        if len(frames) < 2:
            return  # nothing to answer: a ROUTER always prepends an identity
        identity = frames[0]
        try:
            message = protocol.decode(frames[1:], self.settings.max_message_bytes)
            if self.auth is not None:
                refusal = self._role_refusal(identity, message.kind, user)
                if refusal is not None:
                    self.counters["roles_refused"] += 1
                    self._warn("refused '%s' from %s: %s", message.kind, _show(identity), refusal)
                    ids = [i.get("id") for i in message.fields.get("items") or [] if isinstance(i, dict)]
                    self._queue(identity, Kind.ERROR, {"error": f"refused: {refusal}",
                                                       "ids": [i for i in ids if isinstance(i, str)]})
                    return
            if message.kind in CLIENT_KINDS:
                self.client_seen[identity] = time.monotonic()
                self.unreachable.discard(identity)
            handler = self._handlers.get(message.kind)
            if handler is None:
                raise ProtocolError(f"unknown message kind {message.kind!r}")
            self._user = user
            handler(identity, message)
        except ProtocolError as exc:
            self.counters["errors"] += 1
            self._queue(identity, Kind.ERROR, {"error": str(exc), "ids": []})

    def _role_refusal(self, identity: bytes, kind: str, user: str | None) -> str | None:
        """Why a message may not be handled under CURVE (None: it may). The role is the key's."""
        role, key = role_of(user)
        if kind in CLIENT_KINDS and role != "client":
            return f"'{kind}' needs a client key; this connection's key is authorized as {role or 'nothing'}"
        if kind in WORKER_KINDS:
            if role != "worker":
                return f"'{kind}' needs a worker key; this connection's key is authorized as {role or 'nothing'}"
            worker = self.workers.get(identity)
            if worker is not None and worker.key != key:
                return f"worker {_show(identity)} was registered with another key"
        return None

    def _principal(self, identity: bytes) -> bytes:
        """Whom a submission counts against: the CURVE key when there is one, else the routing id."""
        _, key = role_of(self._user)
        return key.encode() if key else identity

    def _warn(self, message: str, *args) -> None:
        """Log a refusal, at most once per second (a flood of forgeries must not flood the log)."""
        now = time.monotonic()
        if now - self._warned_at < _WARN_EVERY_S:
            self._unwarned += 1
            return
        if self._unwarned:
            message += f" ({self._unwarned} more refusals not logged)"
        log.warning(message, *args)
        self._warned_at, self._unwarned = now, 0

    def _dispatch(self) -> None:
        """Hand queued jobs to workers with free capacity, spreading them evenly."""
        for service, queue in self.queues.items():
            if not queue:
                continue
            workers = [w for w in self.workers.values() if service in w.services and w.free > 0]
            if not workers:
                continue
            share = math.ceil(len(queue) / len(workers))
            for worker in sorted(workers, key=lambda w: -w.free):
                items, payloads = [], []
                want = min(worker.free, share, len(queue))
                leases = protocol.new_leases(want)
                while queue and len(items) < want:
                    job = self.jobs.get(queue.popleft())
                    if job is None or job.worker is not None:
                        continue  # finished or taken meanwhile (defensive: the queue should not hold it)
                    lease = leases[len(items)]
                    job.worker = job.lease_worker = worker.id
                    job.lease_attempt = job.attempts + 1
                    job.lease_hash = protocol.lease_digest(lease)
                    self.journal.lease(job.id, worker.id, job.lease_attempt, job.lease_hash)
                    worker.inflight.add(job.id)
                    items.append(protocol.attach({"id": job.id, "service": job.service, "attempt": job.lease_attempt,
                                                  "lease": lease, "time_limit": job.time_limit}, job.body, payloads))
                if items:
                    self._queue(worker.id, Kind.JOBS, {"items": items}, payloads)

    # ------------------------------------------------------------------ leases
    @staticmethod
    def _lease_refusal(job: JobState, wid: bytes, item: dict) -> str | None:
        """Why a worker's word on ``job`` does not count (None: it holds the job's current lease)."""
        if job.lease_hash is None:
            return "nobody holds this job now (it was requeued)"
        if job.lease_worker != wid:
            return "the job is leased to another worker"
        if item.get("attempt") != job.lease_attempt:
            return f"stale attempt {item.get('attempt')!r} (the current one is {job.lease_attempt})"
        if not protocol.same_digest(protocol.lease_digest(item.get("lease")), job.lease_hash):
            return "wrong lease token"
        return None

    def _refuse_results(self, wid: bytes, refused: list) -> None:
        """Count, log and answer results (or failure reports) that do not hold the job's lease."""
        self.counters["leases_refused"] += len(refused)
        jid, reason = refused[0]
        self._warn("refused %d result(s) from %s without the job's lease; first: job %s: %s", len(refused),
                   _show(wid), str(jid)[:12], reason)
        self._queue(wid, Kind.ERROR, {"error": f"refused {len(refused)} result(s) without the job's lease; "
                                               f"first: {reason}", "ids": [j for j, _ in refused if isinstance(j, str)]})

    def _charge(self, job: JobState) -> None:
        load = self.client_load.setdefault(job.owner, [0, 0])
        load[0] += 1
        load[1] += len(job.body)
        self.unfinished_bytes += len(job.body)

    def _release(self, job: JobState) -> None:
        load = self.client_load.get(job.owner)
        if load is not None:
            load[0] -= 1
            load[1] -= len(job.body)
            if load[0] <= 0:
                del self.client_load[job.owner]
        self.unfinished_bytes -= len(job.body)

    def _bound_reached(self, owner: bytes, size: int, queued: int) -> str | None:
        """Why a new job of ``size`` bytes must wait (None: it may be accepted now)."""
        s = self.settings
        jobs, held = self.client_load.get(owner, (0, 0))
        if jobs >= s.max_client_jobs:
            return f"this client has {jobs} unfinished jobs (bound: max_client_jobs={s.max_client_jobs})"
        if held + size > s.max_client_bytes:
            return (f"this client's unfinished jobs hold {held} bytes and this one {size} "
                    f"(bound: max_client_bytes={s.max_client_bytes})")
        if queued >= s.max_queue:
            return f"the broker's queue holds {queued} jobs (bound: max_queue={s.max_queue})"
        if self.unfinished_bytes + size > s.max_queue_bytes:
            return f"the broker holds {self.unfinished_bytes} bytes of jobs (bound: max_queue_bytes={s.max_queue_bytes})"
        return None

    # ------------------------------------------------------------------ job lifecycle
    def _complete(self, jid: str, result: bytes) -> None:
        """Record a job's result and owe it to every waiting client. First result wins."""
        job = self.jobs.pop(jid, None)
        if job is None:
            return
        if job.worker is not None:
            worker = self.workers.get(job.worker)
            if worker is not None:
                worker.inflight.discard(jid)
        else:
            queue = self.queues.get(job.service)
            if queue is not None:
                try:
                    queue.remove(jid)
                except ValueError:
                    pass
        self._release(job)
        self.journal.finish(jid, result)
        for client in job.waiters:
            self.to_send.setdefault(client, {})[jid] = result
        self.counters["completed"] += 1
        self.completions.append(time.monotonic())

    def _attempt_failed(self, job: JobState, reason: str) -> None:
        """Requeue a job whose attempt failed, or finish it as infra_error when out of attempts."""
        job.attempts += 1
        job.failures.append(reason)
        job.clear_lease()
        self.journal.lease(job.id, None, None, None)
        if job.worker is not None:
            if job.worker in self.workers:
                self.workers[job.worker].inflight.discard(job.id)
            job.worker = None
        else:  # reported by a worker the broker did not know (restart): it is also queued
            try:
                self.queues[job.service].remove(job.id)
            except (KeyError, ValueError):
                pass
        if job.attempts >= self.settings.max_attempts:
            result = protocol.infra_error(
                f"gave up after {job.attempts} attempts; last: {reason}", failures=list(job.failures)
            )
            self._complete(job.id, protocol.pack_body(result))
        else:
            self.counters["requeued"] += 1
            self.journal.record_failure(job.id, job.attempts, job.failures)
            self.queues.setdefault(job.service, deque()).appendleft(job.id)

    def _requeue_lost(self, job: JobState) -> None:
        """A job a worker never started (lost in transit): back to the queue, no attempt counted."""
        job.worker = None
        job.clear_lease()
        self.journal.lease(job.id, None, None, None)
        self.queues.setdefault(job.service, deque()).appendleft(job.id)

    # ------------------------------------------------------------------ client messages
    def _on_submit(self, client: bytes, message) -> None:
        items = protocol.items_of(message, ("id", "service"))
        accepted, busy, errors, fresh = [], [], [], []
        busy_reason = None
        owner = self._principal(client)
        for item in items:
            service, claimed = item["service"], item["id"]
            if not isinstance(service, str) or not 0 < len(service) <= _MAX_SERVICE_NAME:
                errors.append({"id": claimed, "error": "service must be a short non-empty string"})
                continue
            if service not in self.known_services:
                self.counters["unknown_service"] += 1
                known = sorted(self.known_services)
                shown = ", ".join(known[:20]) + (f" and {len(known) - 20} more" if len(known) > 20 else "")
                errors.append({"id": claimed, "error": f"unknown service {service!r}: no worker has registered it "
                               f"and the broker is not configured for it (known: {shown or 'none'})"})
                continue
            body = protocol.payload_of(message, item)
            salt = item.get("salt", "")
            jid = protocol.job_id(service, body, salt if isinstance(salt, str) else "")
            if jid != claimed:
                errors.append({"id": claimed, "error": "job id does not match the job's content"})
                continue
            if jid in self.jobs:
                self.jobs[jid].waiters.add(client)
                self.journal.add_waiter(jid, client)
                self.counters["duplicates"] += 1
                accepted.append(jid)
                continue
            fresh.append((jid, service, body, item.get("time_limit")))
        stored = self.journal.results_of([f[0] for f in fresh]) if fresh else {}
        queued = self._queued_total()
        for jid, service, body, limit in fresh:
            if jid in stored or jid in self.jobs:  # finished earlier, or twice in this message
                self.journal.add_waiter(jid, client)
                if jid in stored:
                    self.to_send.setdefault(client, {})[jid] = stored[jid]
                else:
                    self.jobs[jid].waiters.add(client)
                self.counters["duplicates"] += 1
                accepted.append(jid)
                continue
            if len(body) > self.settings.max_client_bytes:
                self.counters["too_large"] += 1
                errors.append({"id": jid, "error": f"job of {len(body)} bytes can never fit the per-client bound "
                               f"(max_client_bytes={self.settings.max_client_bytes})"})
                continue
            reason = self._bound_reached(owner, len(body), queued)
            if reason is not None:
                busy.append(jid)
                busy_reason = busy_reason or reason
                self.counters["busy"] += 1
                continue
            limit = float(limit) if isinstance(limit, (int, float)) and limit > 0 else None
            self.journal.accept(jid, service, body, limit, client, owner)
            job = self.jobs[jid] = JobState(jid, service, body, limit, waiters={client}, owner=owner)
            self._charge(job)
            self.queues.setdefault(service, deque()).append(jid)
            queued += 1
            self.counters["accepted"] += 1
            accepted.append(jid)
        fields = {"ids": accepted, "busy": busy, "errors": errors, "epoch": self.epoch}
        if busy_reason:
            fields["busy_reason"] = busy_reason
        self._queue(client, Kind.ACCEPTED, fields)

    def _queued_total(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def _on_ack(self, client: bytes, message) -> None:
        ids = message.fields.get("ids")
        if not isinstance(ids, list):
            raise ProtocolError("'ack' needs a list of ids")
        self.journal.delivered([(jid, client) for jid in ids if isinstance(jid, str)])

    def _on_ping(self, client: bytes, message) -> None:
        self._queue(client, Kind.PONG, {"epoch": self.epoch})

    def _on_status(self, client: bytes, message) -> None:
        self._queue(client, Kind.STATUS_REPLY, {"status": self.status()})

    # ------------------------------------------------------------------ worker messages
    def _on_ready(self, wid: bytes, message) -> None:
        fields = message.fields
        services = fields.get("services")
        if (not isinstance(services, list) or not 0 < len(services) <= _MAX_SERVICES_PER_WORKER
                or not all(isinstance(s, str) and 0 < len(s) <= _MAX_SERVICE_NAME for s in services)):
            raise ProtocolError(f"'ready' needs a list of 1 to {_MAX_SERVICES_PER_WORKER} service names "
                                f"of at most {_MAX_SERVICE_NAME} characters")
        capacity = fields.get("capacity", 1)
        if not isinstance(capacity, int) or capacity < 1:
            raise ProtocolError("'ready' capacity must be a positive integer")
        inflight = fields.get("inflight") or []
        if not isinstance(inflight, list) or not all(isinstance(i, dict) and isinstance(i.get("id"), str)
                                                     for i in inflight):
            raise ProtocolError("'ready' inflight must be a list of {id, lease, attempt} maps")
        new = [s for s in dict.fromkeys(services) if s not in self.known_services]
        if len(self.known_services) + len(new) > _MAX_SERVICES:
            raise ProtocolError(f"the broker already knows {len(self.known_services)} services (at most {_MAX_SERVICES})")
        for service in new:
            self.known_services.add(service)
            self.journal.add_service(service)
        capabilities = fields.get("capabilities") or {}
        reported = {item["id"]: item for item in inflight}
        worker = self.workers.get(wid)
        if worker is None:
            worker = WorkerState(wid, tuple(services), capabilities, capacity, time.monotonic(),
                                 key=role_of(self._user)[1])
            self.workers[wid] = worker
            self.counters["workers_registered"] += 1
            log.info("worker %s registered for %s", _show(wid), services)
        else:
            self.counters["workers_reregistered"] += 1
            worker.services, worker.capabilities, worker.capacity = tuple(services), capabilities, capacity
            worker.last_seen = time.monotonic()
            for jid in list(worker.inflight - set(reported)):
                worker.inflight.discard(jid)
                if jid in self.jobs and self.jobs[jid].worker == wid:
                    self._requeue_lost(self.jobs[jid])
        refused = []
        for jid, item in reported.items():  # jobs this worker still holds (e.g. across a broker restart)
            job = self.jobs.get(jid)
            if job is None:
                continue  # finished meanwhile; its result will be refused when it comes
            reason = self._lease_refusal(job, wid, item)
            if reason is not None:
                refused.append((jid, reason))
            elif job.worker is None:  # leased before a broker restart: this worker carries on with it
                try:
                    self.queues[job.service].remove(jid)
                except (KeyError, ValueError):
                    pass
                job.worker = wid
                worker.inflight.add(jid)
        if refused:
            self._refuse_results(wid, refused)

    def _known_worker(self, wid: bytes) -> WorkerState | None:
        worker = self.workers.get(wid)
        if worker is None:
            self._queue(wid, Kind.REREGISTER)
        else:
            worker.last_seen = time.monotonic()
        return worker

    def _on_heartbeat(self, wid: bytes, message) -> None:
        self._known_worker(wid)

    def _leased_items(self, wid: bytes, items: list) -> list:
        """(item, job) for the items whose sender holds the job's current lease; the rest are refused."""
        held, refused = [], []
        for item in items:
            job = self.jobs.get(item["id"]) if isinstance(item["id"], str) else None
            reason = "the job is not running (finished, or never accepted)" if job is None \
                else self._lease_refusal(job, wid, item)
            if reason is None:
                held.append((item, job))
            else:
                refused.append((item["id"], reason))
        if refused:
            self._refuse_results(wid, refused)
        return held

    def _on_done(self, wid: bytes, message) -> None:
        items = protocol.items_of(message, ("id", "lease", "attempt"))
        worker = self._known_worker(wid)
        for item, job in self._leased_items(wid, items):
            result = protocol.payload_of(message, item)
            if worker is not None:
                worker.inflight.discard(job.id)
            # From the lease holder only; also from a worker not (yet) registered again after a
            # broker restart, when the journal says it held the lease.
            self._complete(job.id, result)

    def _on_failed(self, wid: bytes, message) -> None:
        items = protocol.items_of(message, ("id", "lease", "attempt", "reason"))
        self._known_worker(wid)
        for item, job in self._leased_items(wid, items):
            self._attempt_failed(job, f"{str(item['reason'])[:500]} (worker {_show(wid)})")

    def _on_bye(self, wid: bytes, message) -> None:
        worker = self.workers.get(wid)
        if worker is None:
            return
        worker.draining = True
        if message.fields.get("final"):
            del self.workers[wid]
            for jid in worker.inflight:
                if jid in self.jobs:
                    self._requeue_lost(self.jobs[jid])
            log.info("worker %s left", wid)

    # ------------------------------------------------------------------ periodic
    def _on_tick(self, now: float) -> None:
        limit = self.settings.silence_limit_s
        for wid, worker in list(self.workers.items()):
            if now - worker.last_seen > limit:
                self._worker_lost(wid, f"went silent for {now - worker.last_seen:.1f} s")
            elif self._unroutable(wid):  # also sends the heartbeat
                self._worker_lost(wid, "disconnected")
        self.unreachable.clear()  # retry owed results once per tick
        horizon = now - 60.0
        while self.completions and self.completions[0] < horizon:
            self.completions.popleft()

    def _forget_stale_clients(self, now: float) -> None:
        """Drop results owed to clients silent for longer than the result TTL (memory and journal)."""
        ttl = self.settings.result_ttl_s
        for client, seen in list(self.client_seen.items()):
            if now - seen > ttl:
                del self.client_seen[client]
                self.to_send.pop(client, None)
                self.unreachable.discard(client)
        self.journal.prune(ttl)

    def status(self) -> dict:
        """A snapshot for ``cuda-agent bridge-status`` (msgpack-able)."""
        now = time.monotonic()
        last10 = sum(1 for t in self.completions if t >= now - 10.0)
        counters = dict(self.counters)
        self.journal.commit()  # the journal's counts then include this loop iteration's writes
        if self.auth is not None:
            counters["handshakes_refused"] = self.auth.refused
        return {
            "epoch": self.epoch,
            "endpoints": self.endpoints,
            "curve": self.auth is not None,
            "services": sorted(self.known_services),
            "clients_with_jobs": len(self.client_load),
            "unfinished_bytes": self.unfinished_bytes,
            "uptime_s": time.time() - self.started,
            "queued": {s: len(q) for s, q in self.queues.items()},
            "inflight": sum(len(w.inflight) for w in self.workers.values()),
            "unfinished": len(self.jobs),
            "owed_results": sum(len(v) for v in self.to_send.values()),
            "throughput_10s": last10 / 10.0,
            "throughput_60s": len(self.completions) / 60.0,
            "counters": counters,
            "workers": [
                {"id": w.id.decode(errors="replace"), "services": list(w.services), "capacity": w.capacity,
                 "inflight": len(w.inflight), "draining": w.draining,
                 "silent_s": round(now - w.last_seen, 3), "capabilities": w.capabilities}
                for w in self.workers.values()
            ],
            "journal": self.journal.counts(),
        }


def _show(identity) -> str:
    """A routing id for a log line (short, printable)."""
    return bytes(identity).decode(errors="replace")[:48] if isinstance(identity, (bytes, bytearray)) else repr(identity)


def serve_broker(bind, journal_path, settings: BridgeSettings | dict | None = None, curve=None,
                 stop: threading.Event | None = None) -> None:
    """Run a broker until SIGTERM/SIGINT (or ``stop``). Entry point for the CLI and tests."""
    if isinstance(settings, dict) or settings is None:
        settings = BridgeSettings.from_dict(settings)
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    broker = Broker(bind, journal_path, settings, curve)
    log.info("broker %s listening on %s", broker.epoch, ", ".join(broker.endpoints))
    broker.serve(stop)
