"""Each candidate's in-process checks in a process of its own, forked from a zygote.

A worker forks the zygote as it starts, once torch and the checks are imported and before anything
runs on a GPU or starts a thread. For each candidate the zygote forks a child that runs the in-process
checks (execution.run_checks), sends back what it measured or why it rejected, and exits. Whatever
the task's code changes in its process (torch's defaults, patched functions, imported modules, signal
handlers, leaked threads) dies with it: the next candidate starts again from the zygote, which never
runs task code. The child holds none of the worker's pipes, only its own pipe to the zygote, and
cannot open theirs or reach their memory through /proc: the worker and the zygote are not dumpable.

The zygote stops a child that outlives the checks' limit by GRACE_S (SIGKILL to its process group: a
`timeout`) and reports one that dies or answers with something else (a `crash`). It dies with its
worker. In its jail a worker also kills, before each candidate, whatever earlier ones left running
(kill_leftovers). Standard library only here; the child imports what the checks need from the
zygote's memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import signal
import socket
import time

from . import wire

GRACE_S = 5.0  # beyond the checks' own limit (their alarm) before the zygote kills the child
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4


class TimeLimit(BaseException):
    """The in-process checks ran past their limit (a BaseException: the task's code cannot catch it as an Exception)."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """SIGALRM after `seconds` raises TimeLimit in this process's main thread (the candidate's)."""
    def expire(signum, frame):
        raise TimeLimit(f"the in-process checks ran past {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class ZygoteLost(Exception):
    """The zygote died or broke its protocol: the worker can check no more candidates; str() is one line."""


class Zygote:
    """The worker's side: `outcome(job, limit_s)` runs one candidate's checks in a fresh child."""

    def __init__(self):
        ours, theirs = socket.socketpair()
        worker = os.getpid()
        pid = os.fork()
        if pid == 0:  # the zygote
            code = 0
            try:
                ours.close()
                _serve(theirs.detach(), worker)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        theirs.close()
        self.pid, self.sock = pid, ours

    def outcome(self, job: dict, limit_s: float) -> dict:
        """{"measured": {...}} or {"rejected": {"stage", "reason", "measured"}}, as the child sent it
        (untrusted: the caller checks it), or a `timeout` / `crash` rejection made by the zygote."""
        try:
            wire.send(self.sock.fileno(), {"job": job, "limit_s": limit_s})
            return wire.receive(self.sock.fileno())
        except (wire.WireError, OSError) as exc:
            raise ZygoteLost(f"the worker's zygote is gone ({exc})") from None



def not_dumpable() -> None:
    """This process's memory and open files are out of reach through /proc (`mem`, `fd/`) for other
    processes of its uid, the candidates' among them: that access needs the process dumpable. Forked
    processes inherit it (a candidate's process may make itself dumpable again, which opens only itself)."""
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def _die_with_parent(parent: int) -> None:
    """SIGKILL when the parent exits (Linux); exit at once if `parent` (its pid before the fork) already has."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)


def _only_our_fds(keep: int) -> None:
    """stdin from /dev/null, stdout to stderr, and nothing else open but `keep`: the worker's pipes to the
    run (its jobs and its verdicts) are not the zygote's, nor its children's."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    os.closerange(3, keep)
    os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))


def _serve(fd: int, worker: int) -> None:
    """The zygote's loop: a job in, its child's outcome out, until the worker closes the socket."""
    _die_with_parent(worker)
    _only_our_fds(fd)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM):
        signal.signal(signum, signal.SIG_DFL)
    # The worker's objects stay as they are: none is collected here (one that owned an fd closed above
    # would close whatever now has its number), and the children's copies of them are not written to.
    gc.disable()
    gc.freeze()
    while True:
        try:
            request = wire.receive(fd)
        except wire.WireError:
            return
        wire.send(fd, _one_child(request["job"], float(request["limit_s"]), fd))


def _one_child(job: dict, limit_s: float, server_fd: int) -> dict:
    read_end, write_end = os.pipe()
    zygote = os.getpid()
    pid = os.fork()
    if pid == 0:  # the candidate's process
        os.close(read_end)
        os.close(server_fd)
        os.setpgid(0, 0)
        _die_with_parent(zygote)
        gc.enable()  # for the candidate's own objects; the worker's stay frozen
        code = 0
        try:
            wire.send(write_end, _checks(job, limit_s))
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        os.setpgid(pid, pid)  # as the child does itself: the group exists whichever runs first
    except OSError:
        pass
    try:
        outcome = wire.receive(read_end, time.monotonic() + limit_s + GRACE_S)
        if not isinstance(outcome.get("measured", outcome.get("rejected")), dict):
            outcome = _crash("answered with something other than its checks' outcome")
    except wire.WireTimeout:
        _kill_group(pid)
        outcome = _rejected("timeout", f"the in-process checks ran past {limit_s:g} s and were stopped")
    except wire.WireError as exc:
        outcome = {"pending": str(exc)}
    finally:
        os.close(read_end)
    _kill_group(pid)  # whatever the child left running
    _, status = os.waitpid(pid, 0)
    if "pending" in outcome:
        how = describe_exit(os.waitstatus_to_exitcode(status))
        outcome = _crash(f"{how} before its checks' outcome ({outcome['pending']})")
    return outcome


def _checks(job: dict, limit_s: float) -> dict:
    """In the candidate's process: the in-process checks under the worker's alarm."""
    from . import gpu_memory
    from .execution import Rejected, run_checks

    try:
        with time_limit(limit_s):
            measured = run_checks(job["name"], job["source"], job.get("expected_shape"), job.get("shapes"),
                                  job["window_ms"], job["memory_bytes"], job.get("input_shapes"),
                                  job.get("device", "cpu"))
        return {"measured": measured}
    except Rejected as exc:
        return {"rejected": {"stage": exc.stage, "reason": exc.reason, "measured": exc.measured}}
    except TimeLimit as exc:
        return _rejected("timeout", str(exc))
    except Exception as exc:  # out of memory, or a fault of the checks themselves
        reason = f"{type(exc).__name__}: {exc}"[:200]
        return _rejected("gpu_memory" if gpu_memory.out_of_memory(exc) else "filter_error", reason)


def kill_leftovers(zygote: int) -> list[int]:
    """Called by a worker alone in its pid namespace with what it started (its jail): SIGKILL every process
    that is neither the namespace's init, the worker nor one of its descendants outside the zygote's subtree
    (the evaluator's children): what an earlier candidate left running (a daemon that left its process group
    and was handed to init, a child of the zygote's child). Returns the pids killed."""
    parents = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as handle:
                parents[int(entry)] = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    worker = os.getpid()

    def spared(pid: int) -> bool:
        if pid in (1, worker, zygote):
            return True
        while pid in parents and pid > 1:
            pid = parents[pid]
            if pid in (worker, zygote):
                return pid == worker
        return False

    victims = [pid for pid in parents if not spared(pid)]
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return victims


def _rejected(stage: str, reason: str) -> dict:
    return {"rejected": {"stage": stage, "reason": reason, "measured": {}}}


def _crash(what: str) -> dict:
    return _rejected("crash", f"the candidate's process {what}")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def describe_exit(code: int | None) -> str:
    """How a process ended, from its return code (negative: the signal): "was killed by SIGKILL", ..."""
    if code is None:
        return "was still running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"
