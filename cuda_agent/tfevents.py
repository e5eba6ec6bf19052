"""TensorBoard scalars without TensorBoard: an event file written with the standard library only.

An event file is a sequence of TFRecords (length, masked CRC-32C of the length, the bytes, masked
CRC-32C of the bytes); each record is an `Event` protocol buffer. Only the fields scalars need are
written: wall_time (1, double), step (2, int64), file_version (3, string) and summary (5) holding
values of tag (1, string) and simple_value (2, float). `tensorboard --logdir DIR` reads the files.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time
from pathlib import Path

_CRC32C_POLY = 0x82F63B78  # Castagnoli, reflected
_TABLE = []
for _byte in range(256):
    _crc = _byte
    for _ in range(8):
        _crc = (_crc >> 1) ^ _CRC32C_POLY if _crc & 1 else _crc >> 1
    _TABLE.append(_crc)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64 as protobuf encodes it (negative: ten bytes)
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field_bytes(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def event_bytes(wall_time: float, step: int, scalars: dict[str, float] | None = None,
                file_version: str | None = None) -> bytes:
    """One serialised Event: a file-version header, or scalar values at `step`."""
    out = _varint(1 << 3 | 1) + struct.pack("<d", wall_time) + _varint(2 << 3 | 0) + _varint(step)
    if file_version is not None:
        out += _field_bytes(3, file_version.encode())
    if scalars:
        values = b"".join(_field_bytes(1, _scalar_value(tag, value)) for tag, value in scalars.items())
        out += _field_bytes(5, values)
    return out


def _scalar_value(tag: str, value: float) -> bytes:
    """A Summary.Value: its tag (field 1) and simple_value (field 2, a 32-bit float)."""
    return _field_bytes(1, tag.encode()) + _varint(2 << 3 | 5) + struct.pack("<f", value)


def record_bytes(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


class EventFileWriter:
    """Scalars of a run, appended to a new event file in `logdir` (flushed after every step)."""

    def __init__(self, logdir: str | Path):
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        self.path = self.logdir / name
        self._file = open(self.path, "ab")
        self._file.write(record_bytes(event_bytes(time.time(), 0, file_version="brain.Event:2")))
        self._file.flush()

    def scalars(self, step: int, values: dict[str, float]) -> int:
        """Write the finite numeric values of `values` at `step`; returns how many were written."""
        kept = {tag: float(v) for tag, v in values.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        if kept:
            self._file.write(record_bytes(event_bytes(time.time(), int(step), kept)))
            self._file.flush()
        return len(kept)

    def close(self) -> None:
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
