"""The bridge's wire format: a versioned msgpack envelope plus opaque payload frames.

A message is a list of ZeroMQ frames ``[header, payload_0, payload_1, ...]`` (a ROUTER sees the
peer's identity in front). The header is a msgpack map ``{"v": PROTOCOL_VERSION, "kind": str,
...fields}``. Jobs and results are msgpack bodies the broker never decodes (it only hashes,
stores and forwards bytes); a small body rides inline in its item (``"body"``), a large one
(workspace files, a built extension) travels as its own frame (``"frame": index``). Nothing is ever pickled: a peer can only
make us build plain maps, lists, strings, numbers and bytes.

A job's id is derived from its content (service, canonical job body, optional salt), so the same
task + solution + settings submitted twice is recognised as one job. A job id is therefore not a
secret (a candidate can compute its own); what authorises a result is the job's *lease*: an
unguessable token the broker gives the one worker it hands the job to (see :func:`new_lease`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

import msgpack

PROTOCOL_VERSION = 2  # 2: jobs carry a lease that results must return; roles under CURVE
JOB_ID_DOMAIN = b"cuda-agent-job/1\0"
MAX_HEADER_BYTES = 16 * 1024 * 1024
INLINE_PAYLOAD_BYTES = 8 * 1024  # bodies up to this size ride inside the header


class Kind:
    """Message kinds. Client<->broker, worker<->broker, and answers."""

    # client -> broker
    SUBMIT = "submit"  # fields: items=[{id, service, body|frame, salt?, time_limit?}]
    ACK = "ack"  # fields: ids (results the client has; the broker may forget its delivery)
    PING = "ping"
    STATUS = "status"
    # broker -> client
    ACCEPTED = "accepted"  # fields: ids, busy (ids to retry later: a bound is reached), busy_reason,
    #                        errors=[{id, error}] (refused for good: unknown service, too large...), epoch
    RESULTS = "results"  # fields: items=[{id, body|frame}]
    PONG = "pong"  # fields: epoch
    STATUS_REPLY = "status_reply"
    ERROR = "error"  # fields: error (one line), ids (affected jobs, may be empty)
    # worker -> broker (every message about a job carries that job's lease and attempt)
    READY = "ready"  # fields: services, capabilities, capacity, inflight=[{id, lease, attempt}]
    HEARTBEAT = "heartbeat"  # names no job: keeps the worker's registration alive
    DONE = "done"  # fields: items=[{id, lease, attempt, body|frame}]
    FAILED = "failed"  # fields: items=[{id, lease, attempt, reason}] (the attempt failed; the broker decides)
    BYE = "bye"  # the worker drains and leaves
    # broker -> worker
    JOBS = "jobs"  # fields: items=[{id, service, body|frame, attempt, lease, time_limit}]
    REREGISTER = "reregister"  # the broker does not know this worker (it restarted)


CLIENT_KINDS = frozenset({Kind.SUBMIT, Kind.ACK, Kind.PING, Kind.STATUS})
WORKER_KINDS = frozenset({Kind.READY, Kind.HEARTBEAT, Kind.DONE, Kind.FAILED, Kind.BYE})


class ProtocolError(ValueError):
    """A message that cannot be accepted; the text is the one-line answer sent back."""


@dataclass
class Message:
    kind: str
    fields: dict
    payloads: list = field(default_factory=list)


def _canonical(value):
    """Sort map keys recursively and turn tuples into lists, so equal content packs equally."""
    if isinstance(value, dict):
        try:
            keys = sorted(value)
        except TypeError as exc:
            raise ProtocolError(f"map keys must be all strings: {exc}") from None
        return {k: _canonical(value[k]) for k in keys}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def pack_body(value) -> bytes:
    """Canonical msgpack of a job or result (keys sorted, bytes as bin, no pickling)."""
    try:
        return msgpack.packb(_canonical(value), use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError(f"cannot encode body: {exc}") from None


def unpack_body(data: bytes):
    """Decode a body packed by :func:`pack_body`."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"body is not valid msgpack: {exc}") from None


def job_id(service: str, job_body: bytes, salt: str = "") -> str:
    """Content-derived id: sha256 over (domain, service, salt, canonical job body), in hex.

    The job body holds the task, the solution files and the evaluation settings, so the same
    candidate graded the same way always gets the same id. ``salt`` lets a benchmark submit
    repeat measurements of one job under distinct ids.
    """
    digest = hashlib.sha256(JOB_ID_DOMAIN)
    digest.update(service.encode() + b"\0" + salt.encode() + b"\0")
    digest.update(job_body)
    return digest.hexdigest()


def new_lease() -> str:
    """A fresh lease token: 128 random bits, in hex. Only the worker given the job learns it."""
    return secrets.token_hex(16)


def new_leases(count: int) -> list[str]:
    """``count`` lease tokens from one read of the OS's CSPRNG (one system call per dispatch, not per job)."""
    pool = secrets.token_hex(16 * count)
    return [pool[32 * i:32 * i + 32] for i in range(count)]


def lease_digest(lease) -> bytes | None:
    """sha256 of a lease token: what the broker keeps (in memory and in its journal), never the token."""
    if not isinstance(lease, str) or not 0 < len(lease) <= 128:
        return None
    return hashlib.sha256(lease.encode()).digest()


def same_digest(a: bytes | None, b: bytes | None) -> bool:
    """Constant-time comparison of two lease digests (False when either is missing)."""
    return a is not None and b is not None and hmac.compare_digest(a, b)


def encode(kind: str, fields: dict | None = None, payloads=()) -> list:
    """Frames of one message: header then payloads."""
    header = {"v": PROTOCOL_VERSION, "kind": kind}
    if fields:
        header.update(fields)
    return [msgpack.packb(header, use_bin_type=True), *payloads]


def decode(frames: list, max_message_bytes: int) -> Message:
    """Parse the frames of one message (identity already removed).

    Raises ProtocolError with a one-line reason for: an empty message, a message over the size
    limit, a header that is not a msgpack map, a wrong protocol version, an unknown layout.
    """
    if not frames:
        raise ProtocolError("empty message")
    total = sum(len(f) for f in frames)
    if total > max_message_bytes:
        raise ProtocolError(f"message of {total} bytes exceeds the limit of {max_message_bytes} bytes")
    header_bytes = bytes(frames[0])
    if len(header_bytes) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(header_bytes)} bytes exceeds {MAX_HEADER_BYTES} bytes")
    try:
        header = msgpack.unpackb(header_bytes, raw=False, strict_map_key=True)
    except Exception as exc:
        raise ProtocolError(f"header is not valid msgpack: {type(exc).__name__}") from None
    if not isinstance(header, dict):
        raise ProtocolError("header is not a msgpack map")
    version = header.pop("v", None)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version!r} is not supported (this broker speaks {PROTOCOL_VERSION})")
    kind = header.pop("kind", None)
    if not isinstance(kind, str):
        raise ProtocolError("header has no message kind")
    return Message(kind=kind, fields=header, payloads=list(frames[1:]))


def attach(item: dict, body: bytes, payloads: list) -> dict:
    """Carry ``body`` for ``item``: inline when small, as its own frame when large.

    Small bodies ride in the header (one frame for a whole batch of no-op jobs); a body over
    INLINE_PAYLOAD_BYTES (workspace sources, a built extension) gets a frame of its own.
    """
    if len(body) <= INLINE_PAYLOAD_BYTES:
        item["body"] = body
    else:
        item["frame"] = len(payloads)
        payloads.append(body)
    return item


def payload_of(message: Message, item: dict) -> bytes:
    """The body an item carries inline or refers to by frame index, or ProtocolError."""
    if "body" in item:
        body = item["body"]
        if not isinstance(body, bytes):
            raise ProtocolError("item body must be bytes")
        return body
    index = item.get("frame")
    if not isinstance(index, int) or not 0 <= index < len(message.payloads):
        raise ProtocolError(f"item refers to missing payload frame {index!r}")
    frame = message.payloads[index]
    return frame if isinstance(frame, bytes) else bytes(frame)


def items_of(message: Message, required: tuple) -> list:
    """``message.fields["items"]`` checked to be a list of maps holding ``required`` keys."""
    items = message.fields.get("items")
    if not isinstance(items, list):
        raise ProtocolError(f"'{message.kind}' needs a list of items")
    for item in items:
        if not isinstance(item, dict) or any(k not in item for k in required):
            raise ProtocolError(f"'{message.kind}' item must be a map with {', '.join(required)}")
    return items


def infra_error(error: str, **extra) -> dict:
    """A bridge-level failure result; never a verdict on the kernel (its reward is None, not -1).

    ``message`` repeats ``error`` so callers can read it like an evaluator record's message.
    """
    return {"status": "infra_error", "error": error, "message": error, "reward": None, **extra}
