"""The structured channel between the verdict process and its children.

One message = a frame: 4-byte big-endian header length, a JSON header, then raw blobs whose
sizes the header lists. Values are JSON scalars, lists, `{"__tuple__": [...]}`,
`{"__dict__": {...}}` and tensors `{"__tensor__": i, "dtype", "shape", "device", "cls"}`
whose bytes are blob i. Nothing is ever unpickled: a child running untrusted code can send
wrong values, never code. torch is imported only when a tensor is encoded or decoded.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import time

MAX_HEADER_BYTES = 64 * 1024 * 1024
MAX_MESSAGE_BYTES = 16 * 1024**3


class ChannelClosed(Exception):
    """The other end closed the channel (for a child: it exited or crashed)."""


class ChannelTimeout(Exception):
    """No complete message arrived before the deadline."""


class ProtocolError(Exception):
    """A malformed frame or value."""


def _tensor_meta(t, index: int) -> dict:
    return {
        "__tensor__": index,
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "device": t.device.type,
        "cls": (type(t).__name__ if type(t).__module__.startswith("torch")
                else f"{type(t).__module__}.{type(t).__qualname__}"),
    }


def describe_tensors(value) -> list[dict]:
    """Class and device of each tensor in a nested value, in the order encode_value visits them.

    A child describes its tensors before copying them out to the host for sending, so that the
    description is of the tensor the code produced, not of the host copy.
    """
    import torch

    if isinstance(value, torch.Tensor):
        meta = _tensor_meta(value, 0)
        return [{"cls": meta["cls"], "device": meta["device"]}]
    if isinstance(value, (list, tuple)):
        return [m for v in value for m in describe_tensors(v)]
    if isinstance(value, dict):
        return [m for v in value.values() for m in describe_tensors(v)]
    return []


def host_copy(t):
    """A contiguous CPU copy of a tensor (the tensor itself when it is one already). A CUDA
    tensor is copied into page-locked memory, which the device writes several times faster."""
    import torch

    t = t.detach()
    if t.device.type == "cuda":
        return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t)
    return t.to("cpu").contiguous()


def _tensor_bytes(t) -> memoryview:
    """The tensor's bytes without an extra copy (a view of a contiguous CPU copy)."""
    import torch

    flat = host_copy(t).contiguous().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy())


def encode_value(value, blobs: list[bytes]):
    """Turn a nested value into its JSON form, appending tensor bytes to `blobs`."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [encode_value(v, blobs) for v in value]
    if isinstance(value, tuple):
        return {"__tuple__": [encode_value(v, blobs) for v in value]}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ProtocolError("only dicts with string keys can be sent")
        return {"__dict__": {k: encode_value(v, blobs) for k, v in value.items()}}
    if isinstance(value, (bytes, bytearray)):
        blobs.append(bytes(value))
        return {"__bytes__": len(blobs) - 1}
    import torch

    if isinstance(value, torch.Tensor):
        meta = _tensor_meta(value, len(blobs))
        blobs.append(_tensor_bytes(value))
        return meta
    if isinstance(value, torch.dtype):
        return {"__dtype__": str(value).removeprefix("torch.")}
    if isinstance(value, torch.Size):
        return {"__tuple__": list(value)}
    raise ProtocolError(f"cannot send a value of type {type(value).__name__}")


def _decode_tensor(meta: dict, blob: bytes):
    import torch

    dtype = getattr(torch, str(meta["dtype"]), None)
    if not isinstance(dtype, torch.dtype):
        raise ProtocolError(f"unknown dtype {meta['dtype']!r}")
    shape = [int(s) for s in meta["shape"]]
    numel = 1
    for s in shape:
        numel *= s
    itemsize = torch.empty((), dtype=dtype).element_size()
    if len(blob) != numel * itemsize:
        raise ProtocolError("tensor blob size does not match its shape and dtype")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    buffer = blob if isinstance(blob, bytearray) else bytearray(blob)
    return torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).reshape(shape)


def decode_value(value, blobs: list[bytes], tensor_meta: list | None = None):
    """Inverse of encode_value. Tensors come back on the CPU; their reported metadata is appended to tensor_meta."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [decode_value(v, blobs, tensor_meta) for v in value]
    if not isinstance(value, dict) or len(value) == 0:
        raise ProtocolError("malformed value")
    if "__tuple__" in value:
        return tuple(decode_value(v, blobs, tensor_meta) for v in value["__tuple__"])
    if "__dict__" in value:
        return {str(k): decode_value(v, blobs, tensor_meta) for k, v in value["__dict__"].items()}
    if "__bytes__" in value:
        return bytes(blobs[int(value["__bytes__"])])
    if "__dtype__" in value:
        import torch

        dtype = getattr(torch, str(value["__dtype__"]), None)
        if not isinstance(dtype, torch.dtype):
            raise ProtocolError("unknown dtype")
        return dtype
    if "__tensor__" in value:
        index = int(value["__tensor__"])
        if not 0 <= index < len(blobs):
            raise ProtocolError("tensor refers to a missing blob")
        tensor = _decode_tensor(value, blobs[index])
        if tensor_meta is not None:
            tensor_meta.append({k: value.get(k) for k in ("dtype", "shape", "device", "cls")})
        return tensor
    raise ProtocolError("malformed value")


def pack(message: dict) -> list:
    """The frame as a list of buffers: length + header, then each blob (sent without joining)."""
    blobs: list = []
    body = encode_value(message, blobs)
    header = json.dumps({"body": body, "blobs": [memoryview(b).nbytes for b in blobs]}).encode()
    return [struct.pack(">I", len(header)) + header, *blobs]


class ReceiveBuffers:
    """Buffers for the large blobs this process receives, used again once nothing refers to them.

    A fresh buffer of 64 MiB costs about as much in page faults as the socket copy into it (the
    allocator maps large blocks anew each time); a buffer kept from an earlier message is already
    resident. A kept buffer is handed out only when the pool holds the only reference to it (a
    decoded tensor or a caller's list of blobs keeps its buffer out of reuse), and it is filled to
    its last byte before anyone reads it. At most `keep_bytes` are kept, only blobs of `min_bytes`
    or more.
    """

    def __init__(self, keep_bytes: int = 1024**3, min_bytes: int = 4 * 1024**2):
        self.keep_bytes, self.min_bytes = keep_bytes, min_bytes
        self.kept: list[bytearray] = []

    def take(self, n: int) -> bytearray:
        if n < self.min_bytes:
            return bytearray(n)
        for index in range(len(self.kept)):
            if len(self.kept[index]) == n and self._free(index):
                return self.kept[index]
        buffer = bytearray(n)
        self._keep(buffer)
        return buffer

    def _free(self, index: int) -> bool:
        return sys.getrefcount(self.kept[index]) == 2  # the list's reference and getrefcount's argument

    def _keep(self, buffer: bytearray) -> None:
        while self.kept and sum(map(len, self.kept)) + len(buffer) > self.keep_bytes:
            free = [i for i in range(len(self.kept)) if self._free(i)]
            if not free:
                return  # every kept buffer is in use: this one is not kept
            del self.kept[free[0]]
        if len(buffer) <= self.keep_bytes:
            self.kept.append(buffer)


_BUFFERS = ReceiveBuffers()


def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytearray:
    """Exactly n bytes into one buffer (recv_into, no joins); a large one from _BUFFERS."""
    buffer = _BUFFERS.take(n)
    view = memoryview(buffer)
    received = 0
    while received < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChannelTimeout()
            sock.settimeout(left)
        else:
            sock.settimeout(None)
        try:
            got = sock.recv_into(view[received:], min(n - received, 1 << 24))
        except socket.timeout as exc:
            raise ChannelTimeout() from exc
        except OSError as exc:
            raise ChannelClosed(str(exc)) from exc
        if not got:
            raise ChannelClosed("peer closed the channel")
        received += got
    return buffer


def send_message(sock: socket.socket, message: dict) -> None:
    sock.settimeout(None)
    try:
        for part in pack(message):
            if memoryview(part).nbytes:
                sock.sendall(part)
    except OSError as exc:
        raise ChannelClosed(str(exc)) from exc


def recv_raw(sock: socket.socket, timeout: float | None = None) -> tuple[object, list[bytearray]]:
    """Receive one frame: (JSON body, blobs), without decoding tensors."""
    deadline = None if timeout is None else time.monotonic() + timeout
    (header_len,) = struct.unpack(">I", _recv_exact(sock, 4, deadline))
    if header_len > MAX_HEADER_BYTES:
        raise ProtocolError("header too large")
    try:
        header = json.loads(_recv_exact(sock, header_len, deadline))
        sizes = [int(s) for s in header["blobs"]]
        body = header["body"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ProtocolError(f"malformed header: {exc}") from exc
    if any(s < 0 for s in sizes) or sum(sizes) > MAX_MESSAGE_BYTES:
        raise ProtocolError("message too large")
    blobs = [_recv_exact(sock, s, deadline) for s in sizes]
    return body, blobs


def recv_message(sock: socket.socket, timeout: float | None = None, tensor_meta: list | None = None):
    body, blobs = recv_raw(sock, timeout)
    return decode_value(body, blobs, tensor_meta)
