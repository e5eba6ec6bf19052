"""Frames between the run and its filter workers: a 4-byte big-endian length, then that many bytes of
UTF-8 JSON. Standard library only. The run reads a worker's frames with a deadline and a size bound:
a worker runs candidate code, so what it sends is untrusted data."""

from __future__ import annotations

import json
import os
import select
import struct
import time

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 1 << 20


class WireError(Exception):
    """The other side closed the pipe or broke the framing; str() is one line."""


class WireTimeout(WireError):
    """Nothing came before the deadline."""


def encode(message: dict) -> bytes:
    body = json.dumps(message, allow_nan=False).encode()
    return HEADER.pack(len(body)) + body


def send(fd: int, message: dict) -> None:
    data = memoryview(encode(message))
    while data:
        data = data[os.write(fd, data):]


def _read_exactly(fd: int, size: int, deadline: float | None) -> bytes:
    chunks, left = [], size
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise WireTimeout("no answer before the deadline")
        chunk = os.read(fd, min(left, 1 << 16))
        if not chunk:
            raise WireError("the pipe was closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(fd: int, deadline: float | None = None, max_bytes: int = MAX_FRAME_BYTES) -> dict:
    """The next frame as a mapping; WireError when it cannot be had (deadline: time.monotonic() value)."""
    (size,) = HEADER.unpack(_read_exactly(fd, HEADER.size, deadline))
    if size > max_bytes:
        raise WireError(f"a frame of {size} bytes (at most {max_bytes})")
    try:
        message = json.loads(_read_exactly(fd, size, deadline), parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise WireError(f"a frame that is not JSON ({type(exc).__name__})") from None
    if not isinstance(message, dict):
        raise WireError(f"a frame holding {type(message).__name__}, not a mapping")
    return message


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")
