"""A uid of its own for each jail: claimed from a range, released when its processes are gone.

RLIMIT_NPROC counts every process and thread of a uid on the host, and files are checked as that
uid, so jails that share a uid share a process budget (one busy jail starves the others' forks)
and can reach each other's files. Each holder (an agent episode, an evaluation's candidate, one
build) therefore claims a uid nobody else on the host holds:

    uid = claim_uid(300_000)          # a uid in [300_000, 300_000 + UID_SPAN)
    ...                               # start jails with JailSpec(uid=uid)
    release_uid(uid)                  # kills what is left of that uid, then frees the claim

A claim is a file named after the uid, holding the claimer's pid, created with O_EXCL in a
root-only folder; the claim of a dead process is taken over. Standard library only.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

UID_CLAIMS_DIR = Path("/tmp/cuda-agent-uids")
UID_SPAN = 100_000

_counter = itertools.count()


class NoFreeUid(RuntimeError):
    """Every uid of the range is held by a live process."""


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _try_claim(claim: Path) -> bool:
    """Create the claim file; take it over once if its holder is dead."""
    for _ in range(2):
        try:
            fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            try:
                holder = int(claim.read_text() or "0")
            except (OSError, ValueError):
                return False
            if holder and not pid_alive(holder):
                claim.unlink(missing_ok=True)
                continue
            return False
        with os.fdopen(fd, "w") as handle:
            handle.write(str(os.getpid()))
        return True
    return False


def claim_uid(base: int, claims_dir: Path = UID_CLAIMS_DIR, span: int = UID_SPAN) -> int:
    """A uid in [base, base + span) that no other live process on this host holds."""
    if base <= 0:
        raise ValueError("the uid range must start above 0")
    claims_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    start = (os.getpid() * 7919 + next(_counter)) % span
    for offset in range(span):
        uid = base + (start + offset) % span
        if _try_claim(claims_dir / str(uid)):
            return uid
    raise NoFreeUid(f"no free uid in [{base}, {base + span})")


def kill_processes_of_uid(uid: int) -> int:
    """SIGKILL every process owned by `uid` (a jail's uid: its own processes only); returns the count."""
    if uid <= 0:
        raise ValueError("refusing to kill the processes of uid 0")
    killed = 0
    for _ in range(20):
        found = 0
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                if entry.stat().st_uid != uid:
                    continue
                os.kill(int(entry.name), signal.SIGKILL)
                found += 1
            except (OSError, ProcessLookupError):
                pass
        killed += found
        if not found:
            break
        time.sleep(0.02)
    return killed


def release_uid(uid: int, claims_dir: Path = UID_CLAIMS_DIR, kill: bool = True) -> None:
    """Kill the uid's remaining processes (unless `kill` is False), then free its claim."""
    if kill:
        kill_processes_of_uid(uid)
    (claims_dir / str(uid)).unlink(missing_ok=True)
