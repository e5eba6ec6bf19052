"""How fast one large tensor crosses between two processes, by transport, side by side in one run.

The evaluator's verdict process sends each candidate call its input set and gets the output back over
a socket pair (evaluator_cuda/isolation/wire.py). This measures one round trip of a tensor of --mib MiB
each way between this process and a child it starts, for each transport:

- `wire`: wire.send_message / recv_message with a CPU tensor (the evaluator's path today);
- `socket`: the raw bytes over the same kind of socket pair, default buffers;
- `socket_4m`: the same with 4 MiB send and receive buffers asked for (the kernel may cap them);
- `memfd`: the bytes written into a sealed memfd, its descriptor passed over the socket (SCM_RIGHTS),
  mapped by the receiver.
The receiver of every transport then copies the tensor into a resident buffer of its own (what a
judge's copy to the GPU reads), so every transport ends with the bytes read once.

Prints each round as it goes and a table of medians; with $OUT set writes $OUT/bench_channel.json.
    python scripts/bench_channel.py [--mib 64] [--rounds 9] [--budget-s 90]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import mmap
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TRANSPORTS = ("wire", "socket", "socket_4m", "memfd")
SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:], min(len(view) - got, 1 << 24))
        if not n:
            raise EOFError("peer closed the socket")
        got += n


def _send_memfd(sock: socket.socket, data: memoryview) -> None:
    fd = os.memfd_create("tensor", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
        socket.send_fds(sock, [len(data).to_bytes(8, "big")], [fd])
    finally:
        os.close(fd)


def _recv_memfd(sock: socket.socket):
    """A read-only-in-effect private map of the sealed memfd (the sender can no longer change it)."""
    message, fds, _, _ = socket.recv_fds(sock, 8, 1)
    if len(fds) != 1:
        raise EOFError("no descriptor arrived")
    fd = fds[0]
    try:
        if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS != SEALS:
            raise ValueError("the memfd is not sealed")
        size = int.from_bytes(message, "big")
        if os.fstat(fd).st_size != size:
            raise ValueError("the memfd's size is not the one announced")
        return mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


class Endpoint:
    """One side: receives a tensor by a transport, copies it into its resident buffer, and can send one."""

    def __init__(self, sock: socket.socket, nbytes: int):
        import torch

        self.sock, self.nbytes = sock, nbytes
        self.resident = torch.empty(nbytes, dtype=torch.uint8)
        self.resident.fill_(1)
        self.landing = bytearray(nbytes)  # the raw sockets' receive buffer, reused
        self.outgoing = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)

    def send(self, transport: str) -> None:
        from evaluator_cuda.isolation import wire

        if transport == "wire":
            wire.send_message(self.sock, {"t": self.outgoing.view(-1)})
        elif transport == "memfd":
            _send_memfd(self.sock, memoryview(self.outgoing.numpy()))
        else:
            self.sock.sendall(memoryview(self.outgoing.numpy()))

    def receive(self, transport: str) -> None:
        import torch

        from evaluator_cuda.isolation import wire

        if transport == "wire":
            tensor = wire.recv_message(self.sock)["t"]
        elif transport == "memfd":
            mapped = _recv_memfd(self.sock)
            tensor = torch.frombuffer(mapped, dtype=torch.uint8)
        else:
            _recv_exact(self.sock, memoryview(self.landing))
            tensor = torch.frombuffer(self.landing, dtype=torch.uint8)
        self.resident.copy_(tensor)
        del tensor


def _set_buffers(sock: socket.socket, transport: str) -> None:
    size = 4 * 1024 * 1024 if transport == "socket_4m" else 212992
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, size)


def serve(fd: int, nbytes: int) -> None:
    """The child: for each (transport) line it is told, receive a tensor and send one back, forever."""
    import torch

    torch.set_num_threads(1)
    sock = socket.socket(fileno=fd)
    end = Endpoint(sock, nbytes)
    while True:
        head = sock.recv(16)
        if not head:
            return
        transport = TRANSPORTS[head[0]]
        _set_buffers(sock, transport)
        sock.sendall(b"k")
        end.receive(transport)
        end.send(transport)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="tensor size each way (MiB)")
    parser.add_argument("--rounds", type=int, default=9, help="round trips per transport")
    parser.add_argument("--budget-s", type=float, default=90.0, help="stop starting rounds past this")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    nbytes = args.mib * 1024 * 1024
    if args.serve is not None:
        serve(args.serve, nbytes)
        return 0
    import torch

    torch.set_num_threads(1)
    begin = time.monotonic()
    parent, child = socket.socketpair()
    proc = subprocess.Popen([sys.executable, __file__, "--mib", str(args.mib), "--serve", str(child.fileno())],
                            pass_fds=[child.fileno()])
    child.close()
    end = Endpoint(parent, nbytes)
    times: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
    try:
        for round_ in range(args.rounds):
            for transport in TRANSPORTS:  # interleaved: every transport sees the same seconds of the machine
                if time.monotonic() - begin > args.budget_s:
                    print(f"budget of {args.budget_s:.0f} s spent at round {round_ + 1}", flush=True)
                    raise StopIteration
                parent.sendall(bytes([TRANSPORTS.index(transport)]))
                _set_buffers(parent, transport)
                if parent.recv(1) != b"k":
                    raise EOFError("the child did not answer")
                start = time.perf_counter()
                end.send(transport)
                end.receive(transport)
                times[transport].append((time.perf_counter() - start) * 1e3)
            print(f"round {round_ + 1}: " + ", ".join(f"{t} {times[t][-1]:.1f} ms" for t in TRANSPORTS), flush=True)
    except StopIteration:
        pass
    finally:
        parent.close()
        proc.wait(10)
    return _report(times, args.mib)


def _report(times: dict, mib: int) -> int:
    rows = {t: {"median_ms": round(statistics.median(v), 2), "rounds": len(v),
                "gb_per_s_each_way": round(2 * mib * 1024**2 / (statistics.median(v) / 1e3) / 1e9 / 2, 2)}
            for t, v in times.items() if v}
    if not rows:
        print("no round finished", file=sys.stderr)
        return 1
    print(f"\n{mib} MiB each way, one round trip (median ms; GB/s each way):")
    for transport, row in rows.items():
        ratio = row["median_ms"] / rows["wire"]["median_ms"] if "wire" in rows else float("nan")
        print(f"  {transport:10s} {row['median_ms']:8.2f} ms  {row['gb_per_s_each_way']:6.2f} GB/s  "
              f"{ratio:.2f}x wire  ({row['rounds']} rounds)")
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "bench_channel.json").write_text(json.dumps({"mib": mib, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
