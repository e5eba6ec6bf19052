"""Reference children forked from a process that has imported torch once (the parent's side).

A child that starts with `python -m evaluator_cuda.roles.child reference` spends one to two seconds
of CPU importing torch before it does any work: on a busy host, or a test suite of two hundred
evaluations, that is most of what a reference child costs. A fork server is started the same way,
with the environment the reference children would get, imports torch and the reference role, and
forks one child per request; each fork becomes what the fresh process would have been (its own
session, working folder, log as stdout and stderr, the channel as its only other descriptor, the
request's environment: see roles/forkserver.py).

The candidate and build children, which run untrusted code, are forked as well, but only from a
server of their own, started with exactly the environment their jail gives them (never the
evaluator's), and each builds its jail after the fork, before anything of the candidate loads: the
same namespaces, view, uid, capability drop, rlimits and seccomp filter as a jail started fresh
(spawn_jailed; roles/forkserver.py says what differs).

Used where `enabled()`: a long-lived caller turns it on (evaluation.keep_children_warm), or the
environment variable FORK_ENV says so ("1" or "0", over what the caller chose). A server is keyed by
the variables read while a process starts and imports torch (STARTUP_PREFIXES), at most MAX_SERVERS
are kept, and any failure falls back to a fresh process.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import socket
import struct
import subprocess
import threading

import cuda_agent.jail as jail_mod

FORK_ENV = "CUDA_AGENT_FORK_REFERENCE"
CONTROL_FD_ENV = "CUDA_AGENT_FORKSERVER_FD"
PARENT_ENV = "CUDA_AGENT_FORKSERVER_PARENT"  # "<pid>" or "<pid>:thread" (started by another thread)
SERVER_MODULE = "evaluator_cuda.roles.forkserver"
MAX_SERVERS = 3  # the reference children's, the candidate and build children's, one more while settings change
JAILED_ROLES = ("candidate", "build")
REPLY_TIMEOUT_S = 60.0  # a fork and a reply; a server that takes longer is closed and not used again
# What differs from one reference child to the next and is read after the fork, never at import.
PER_CHILD = ("CUDA_AGENT_CHANNEL_FD", "CUDA_AGENT_CHILD_LIMITS", "CUDA_AGENT_CHILD_WARM", "CUDA_AGENT_SLOT_DIR",
             "TORCH_EXTENSIONS_DIR")
# A forked child gets exactly its request's environment; only what the server read while it started
# and imported torch can differ from a fresh child's. These are the variables read then (the
# interpreter's, the loader's and the allocator's, the thread pools', torch's, CUDA's, the locale, the
# paths): a server is keyed by them, and a variable outside them (a test's name, say) shares one.
STARTUP_PREFIXES = ("PYTHON", "LD_", "MALLOC_", "GLIBC_", "THP_", "OMP_", "MKL_", "OPENBLAS_", "GOTO", "KMP_",
                    "TORCH", "CUDA", "NVIDIA", "XLA", "PATH", "HOME", "TMPDIR", "LANG", "LC_")
STATUS = struct.Struct("<i")

_enabled = False


def enable(on: bool = True) -> None:
    """Fork reference children from a server in this process from now on (or not)."""
    global _enabled
    _enabled = on
    if not on:
        close_all()


def enabled() -> bool:
    """FORK_ENV decides where it is set ("1" or "0"); else enable() does."""
    said = os.environ.get(FORK_ENV)
    return said == "1" if said in ("0", "1") else _enabled


class ForkedProcess:
    """What sandbox.Child needs of a Popen for a forked child: pid, returncode, poll() and wait().

    The server reaps the child and sends its exit code (Popen's convention: -N for signal N) on the
    status socket. If the server dies first, the code cannot be known: it reads as -9 (SIGKILL)."""

    def __init__(self, pid: int, status: socket.socket):
        self.pid = pid
        self.returncode: int | None = None
        self._status = status

    def poll(self) -> int | None:
        if self.returncode is None:
            self._collect(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._collect(timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(f"forked reference child {self.pid}", timeout)
        return self.returncode

    def _collect(self, timeout: float | None) -> None:
        ready, _, _ = select.select([self._status], [], [], timeout)
        if not ready:
            return
        data = b""
        while len(data) < STATUS.size:
            chunk = self._status.recv(STATUS.size - len(data))
            if not chunk:
                break
            data += chunk
        self.returncode = STATUS.unpack(data)[0] if len(data) == STATUS.size else -9
        self._status.close()


class ForkServer:
    """One server process; spawn() forks a child from it (thread-safe)."""

    def __init__(self, env: dict[str, str]):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        self._lock = threading.Lock()
        self.ready = False  # the server says so once torch and the role are imported
        try:
            self.proc = subprocess.Popen([jail_mod.this_python(), "-m", SERVER_MODULE], cwd="/",
                                         env={**env, CONTROL_FD_ENV: str(theirs.fileno()), PARENT_ENV: _parent()},
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
                                         start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()

    def is_ready(self) -> bool:
        """True once the server has imported what its children need (never waits)."""
        with self._lock:
            if not self.ready and self.proc.poll() is None:
                readable, _, _ = select.select([self._sock], [], [], 0)
                if readable:
                    self.ready = json.loads(self._sock.recv(4096) or b"{}").get("ready") is True
        return self.ready and self.proc.poll() is None

    def spawn(self, request: dict, channel_fd: int, log_fd: int) -> ForkedProcess:
        """A child for `request` ({"cwd", "env"} of a reference child, or {"role", "plan"} of a jailed
        one), `channel_fd` as its channel and `log_fd` as stdout and stderr. OSError when the server
        cannot fork it (the caller starts it fresh)."""
        status, theirs = socket.socketpair()
        try:
            with self._lock:
                request = json.dumps(request).encode()
                socket.send_fds(self._sock, [request], [channel_fd, log_fd, theirs.fileno()])
                readable, _, _ = select.select([self._sock], [], [], REPLY_TIMEOUT_S)
                reply = json.loads(self._sock.recv(65536) or b"{}") if readable else {}
        except BaseException:
            status.close()
            raise
        finally:
            theirs.close()
        if not isinstance(reply.get("pid"), int):
            status.close()
            raise OSError(f"the fork server did not fork: {reply.get('error') or 'no answer'}")
        return ForkedProcess(reply["pid"], status)

    def close(self) -> None:
        """Close the channel (the server exits when it reads its end) and make sure it is gone."""
        self._sock.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _parent() -> str:
    """Who the server must not outlive. Started by the main thread, it is killed when this process
    dies; started by another, that thread's end would kill it too, so it only watches this process."""
    main = threading.current_thread() is threading.main_thread()
    return str(os.getpid()) + ("" if main else ":thread")


_servers: dict[tuple, ForkServer] = {}
_servers_lock = threading.Lock()


def server_key(env: dict[str, str], jailed: bool = False) -> tuple:
    """A reference server's key: the variables read at start-up. A jailed children's server is keyed
    by its whole environment (the jail's, nothing else)."""
    if jailed:
        return ("jailed", jail_mod.this_python(), tuple(sorted((k, v) for k, v in env.items() if k not in PER_CHILD)))
    return (jail_mod.this_python(), tuple(sorted((k, v) for k, v in env.items()
                                         if k.startswith(STARTUP_PREFIXES) and k not in PER_CHILD)))


def spawn_reference(cwd: str, env: dict[str, str], channel_fd: int, log_fd: int) -> ForkedProcess | None:
    """The reference child forked from the server for `env`, or None when it cannot be: the server is
    still importing (it was started now if there was none, or a new one replaced a dead one) or it
    failed to fork (it is closed). The caller then starts a fresh child."""
    return _spawn(server_key(env), env, {"cwd": cwd, "env": env}, channel_fd, log_fd)


def spawn_jailed(role: str, plan: dict, channel_fd: int, log_fd: int) -> ForkedProcess | None:
    """A candidate or build child jailed by `plan` (cuda_agent.jail's, as the stage would get it),
    forked from a server started with the plan's environment; None when it cannot be (as for
    spawn_reference). The plan's working folder, uid, binds, limits and cgroup are its own."""
    if role not in JAILED_ROLES:
        raise ValueError(f"only {', '.join(JAILED_ROLES)} children are jailed, not {role!r}")
    env = plan["env"]
    return _spawn(server_key(env, jailed=True), env, {"role": role, "plan": plan}, channel_fd, log_fd)


def _spawn(key: tuple, env: dict[str, str], request: dict, channel_fd: int, log_fd: int) -> ForkedProcess | None:
    dead = None
    with _servers_lock:
        server = _servers.get(key)
        if server is not None and server.proc.poll() is not None:
            dead, server = _servers.pop(key), None
        if server is None:
            server = _start(key, {k: v for k, v in env.items() if k not in PER_CHILD})
    if dead is not None:
        dead.close()
    if server is None or not server.is_ready():
        return None
    try:
        return server.spawn(request, channel_fd, log_fd)
    except (OSError, ValueError):
        _drop(key, server)
        return None


def _start(key: tuple, env: dict[str, str]) -> ForkServer | None:
    """A new server for `key` (holding _servers_lock); the oldest goes when there are MAX_SERVERS."""
    while len(_servers) >= MAX_SERVERS:
        _servers.pop(next(iter(_servers))).close()
    try:
        server = ForkServer(env)
    except OSError:
        return None
    _servers[key] = server
    return server


def _drop(key: tuple, server: ForkServer) -> None:
    with _servers_lock:
        if _servers.get(key) is server:
            del _servers[key]
    server.close()


def servers() -> list[ForkServer]:
    """The servers this process keeps now, oldest first."""
    with _servers_lock:
        return list(_servers.values())


def close_all() -> None:
    with _servers_lock:
        servers = list(_servers.values())
        _servers.clear()
    for server in servers:
        server.close()


atexit.register(close_all)
