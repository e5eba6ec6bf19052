"""The fork server of children: `python -m evaluator_cuda.roles.forkserver` (the server's side;
isolation/forkserver.py starts it and asks for children).

It imports torch and the reference role, says it is ready, and then serves requests on the channel
named by CONTROL_FD_ENV: each brings a working folder, an environment and three descriptors (the
child's channel, its log, a status socket). It forks; the child becomes what `python -m
evaluator_cuda.roles.child reference` started there would be: a session of its own, the folder as
working folder and first import path, /dev/null as stdin, the log as stdout and stderr, the channel
as its only other descriptor, exactly the request's environment, fresh random states; then it
serves its role and exits. The server answers with the child's pid (once the child has its own
session, so that killing its process group reaches it), reaps it when it exits and writes its exit
code to the status socket. It exits when the channel closes (the evaluator is gone); the children
it forked end with their own channels.

A request with a jail plan (cuda_agent.jail's, for a candidate or build child) is served by a server
started with the environment that plan gives the command: the child, in a session of its own with
the log and the channel only, runs the jail's stage itself (cuda_agent.jail._stage.run): the same
three processes, namespaces, view, uid, capability drop, rlimits and seccomp filter as a jail
started fresh, except that the command does not exec `python -m evaluator_cuda.roles.child <role>`
but serves the role in the memory it was forked with. That memory is the server's: torch and the
evaluator's roles imported, nothing of a task or a candidate (the server never runs either), no
descriptor (all are closed before the jail is built). What the fork does not renew is the address
layout: every forked child has the server's, which gives a candidate nothing it could not read of
its own process.

Nothing of a request reaches a later child: the server keeps only pids and status descriptors.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import select
import signal
import socket
import sys
import traceback

from cuda_agent.jail import _stage

from ..isolation.forkserver import CONTROL_FD_ENV, JAILED_ROLES, PARENT_ENV, STATUS
from ..isolation.sandbox import CHANNEL_FD_ENV
from .errors import one_line

PR_SET_PDEATHSIG = 1


_server_pid = 0  # this server's pid, for its children: a child whose parent is no longer it exits


def main() -> None:
    global _server_pid
    _server_pid = os.getpid()
    control = socket.socket(fileno=int(os.environ.pop(CONTROL_FD_ENV)))
    parent = _die_with_parent(os.environ.pop(PARENT_ENV, ""))
    import torch  # noqa: F401  (what the children would each import)

    from . import build, candidate, reference  # noqa: F401
    from .child import serve  # noqa: F401

    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    statuses: dict[int, int] = {}
    control.send(json.dumps({"ready": True}).encode())
    while os.getppid() == parent:
        readable, _, _ = select.select([control, wake_read], [], [], 1.0)
        if wake_read in readable:
            while _drained(wake_read):
                pass
            _reap(statuses)
        if control in readable:
            data, fds, _, _ = socket.recv_fds(control, 1 << 22, 3)
            if not data:
                return
            own = (control.fileno(), wake_read, wake_write, *statuses.values())
            _fork_one(json.loads(data), fds, control, own, statuses)


def _die_with_parent(said: str) -> int:
    """The evaluator's pid. Killed when it dies if it started this server from its main thread (a
    parent-death signal follows the starting thread); the serving loop also ends when it is gone."""
    pid, _, thread = said.partition(":")
    if not thread:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if not pid.isdigit() or os.getppid() != int(pid):
        raise SystemExit("fork server: the evaluator that started it is gone")
    return int(pid)


def _drained(fd: int) -> bool:
    try:
        return bool(os.read(fd, 4096))
    except BlockingIOError:
        return False


def _reap(statuses: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = statuses.pop(pid, None)
        if fd is not None:
            try:
                os.write(fd, STATUS.pack(os.waitstatus_to_exitcode(status)))
            except OSError:
                pass
            os.close(fd)


def _fork_one(request: dict, fds: list[int], control: socket.socket, own: tuple, statuses: dict[int, int]) -> None:
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        control.send(json.dumps({"error": f"expected 3 descriptors, got {len(fds)}"}).encode())
        return
    channel, log, status = fds
    session_read, session_write = os.pipe()
    try:
        pid = os.fork()
    except OSError as exc:
        for fd in (*fds, session_read, session_write):
            os.close(fd)
        control.send(json.dumps({"error": one_line(exc)}).encode())
        return
    if pid == 0:
        os.close(session_read)
        if "plan" in request:
            _become_jailed_child(request, channel, log, session_write, (*own, status))
        _become_reference_child(request, channel, log, session_write, (*own, status))
    os.close(session_write)
    os.read(session_read, 1)  # end of file once the child has its session (or died)
    for fd in (channel, log, session_read):
        os.close(fd)
    statuses[pid] = status
    control.send(json.dumps({"pid": pid}).encode())


def _become_reference_child(request: dict, channel: int, log: int, session_write: int, inherited: tuple) -> None:
    """The forked child: set up as a fresh reference child would be, serve, exit. Never returns."""
    try:
        _own_session(channel, log, session_write, inherited)
        os.chdir(request["cwd"])
    except BaseException:
        traceback.print_exc()
        _exit(1)
    _serve_as("reference", request["env"], channel)


def _become_jailed_child(request: dict, channel: int, log: int, session_write: int, inherited: tuple) -> None:
    """The forked child of a jail plan: be the jail's stage for it, the command serving its role in
    this memory (see the module docstring). Never returns."""
    try:
        _own_session(channel, log, session_write, inherited)
        plan, role = request["plan"], request["role"]
        if role not in JAILED_ROLES:
            raise ValueError(f"no jailed role {role!r}")
        # The channel's number here replaces the one the evaluator planned with.
        plan = {**plan, "pass_fds": [channel], "env": {**plan["env"], CHANNEL_FD_ENV: str(channel)},
                "die_with_parent": True, "parent_pid": _server_pid}
    except BaseException:
        traceback.print_exc()
        _exit(1)
    _stage.run(plan, lambda plan: _serve_as(role, plan["env"], channel))


def _own_session(channel: int, log: int, session_write: int, inherited: tuple) -> None:
    """A session of its own, /dev/null as stdin, the log as stdout and stderr, and no descriptor but
    those and the channel (the server's and other children's are closed)."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    os.close(session_write)
    for fd in inherited:
        os.close(fd)
    sys.stdout.flush()
    sys.stderr.flush()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    _close_all_but((0, 1, 2, channel))


def _serve_as(role: str, env: dict, channel: int) -> None:
    """What `python -m evaluator_cuda.roles.child <role>` does, in the working folder set already,
    with exactly `env`: serve, then exit. Never returns."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(env)
        os.environ[CHANNEL_FD_ENV] = str(channel)
        sys.path[0] = os.getcwd()
        sys.argv = [sys.argv[0], role]
        _fresh_random_states()
        from .child import serve

        serve(role)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    _exit(code)


def _exit(code: int) -> None:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _close_all_but(keep: tuple) -> None:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own descriptor, closed already


def _fresh_random_states() -> None:
    """A fresh process's random states: Python reseeds `random` after a fork by itself; numpy's
    global state, seeded from the system when the server imported numpy.random, would be the server's
    (a numpy.random the server never imported is seeded in the child, at its first use)."""
    random.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


if __name__ == "__main__":
    main()
