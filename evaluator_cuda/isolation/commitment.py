"""Output commitments (docs/cheats.md #24): a large output stays in the candidate child, which answers its
call with the output's digest; the verdict process fetches the bytes only for the calls it checks.

Which timed calls are checked is a secret of the verdict process (verdict/schedule.py), and the
fetch comes after the call's answer, so the candidate cannot know at its answer whether the bytes
will be asked for. The digest binds it to one output: the bytes fetched later must hash to it (a
SHA-256 collision is out of reach), so an output computed only when fetched, or changed after the
answer, is caught exactly as an output sent with the answer would be. What it saves: on the H200
a 64 MiB output crosses the channel in about 100 ms; its digest takes a few ms on eight threads.

The digest covers the value as the wire encodes it (structure, dtypes, shapes, bytes), so both ends
compute it from what they hold: the child from its host copy, the verdict process from what it
received. Large blobs are hashed in chunks on a pool of threads started before candidate code runs
(the candidate child counts threads: harness threads must exist before it records them).
"""

from __future__ import annotations

import hashlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor

from .wire import encode_value

CHUNK_BYTES = 4 << 20  # one thread's share of a large blob
WORKERS = 8

_pool: ThreadPoolExecutor | None = None


def start_workers(workers: int = WORKERS) -> None:
    """Start the pool's threads now (a ThreadPoolExecutor starts them lazily, at its first jobs)."""
    global _pool
    if _pool is not None:
        return
    _pool = ThreadPoolExecutor(workers, thread_name_prefix="digest")
    ready = threading.Barrier(workers)
    list(_pool.map(lambda _: ready.wait(), range(workers)))  # every job waits for the others: one thread each


def _chunk_digest(chunk: memoryview) -> bytes:
    return hashlib.sha256(chunk).digest()


def _blob_digest(blob) -> bytes:
    view = memoryview(blob).cast("B")
    chunks = [view[i:i + CHUNK_BYTES] for i in range(0, view.nbytes, CHUNK_BYTES)]
    if len(chunks) > 1 and _pool is not None:
        digests = list(_pool.map(_chunk_digest, chunks))
    else:
        digests = [_chunk_digest(c) for c in chunks]
    return hashlib.sha256(view.nbytes.to_bytes(8, "big") + b"".join(digests)).digest()


def value_digest(value) -> str:
    """SHA-256 over a value's wire form: its JSON skeleton (tensors' dtypes and shapes), then each
    blob's own digest (a tree over 4 MiB chunks)."""
    blobs: list = []
    body = _skeleton(encode_value(value, blobs))
    outer = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
    for blob in blobs:
        outer.update(_blob_digest(blob))
    return outer.hexdigest()


def _skeleton(body):
    """The wire form less what differs between the child's copy and the received tensor (its device
    and class: both ends hold plain CPU tensors, and the call's answer describes the original)."""
    if isinstance(body, list):
        return [_skeleton(v) for v in body]
    if isinstance(body, dict):
        return {k: _skeleton(v) for k, v in body.items() if not ("__tensor__" in body and k in ("device", "cls"))}
    return body

