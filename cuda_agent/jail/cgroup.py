"""A memory and pids cgroup for one jail. Standard library only.

RLIMIT_AS cannot bound a CUDA process (the driver reserves far more address space than it uses),
so without a cgroup a jailed CUDA candidate could take all of the host's memory. A cgroup counts
what the jail really uses (its pages, its private /tmp, the page cache it fills) and the kernel
kills inside it, and only inside it, when the limit is reached.

    group = create_cgroup(memory_bytes=16 << 30, processes=256)   # CgroupUnavailable: why not
    spec = JailSpec(..., cgroup_procs=group.procs_files)           # the stage joins it first
    ...
    group.oom_kills()                                              # after the command ended
    group.remove()                                                 # kills what is left, rmdir

Both cgroup versions. v2: under `/sys/fs/cgroup/cuda-agent-jails/` (a group of the root, because
a group holding processes, such as the launcher's own, cannot pass controllers to children).
v1: `cuda-agent-jails/` under the launcher's own group in the memory and pids hierarchies. Each
group is named after the launcher's pid, so a later launcher removes the groups of dead ones.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from dataclasses import dataclass

from cuda_agent.jail.uids import pid_alive

ROOT = "/sys/fs/cgroup"
FOLDER = "cuda-agent-jails"
EXTRA_PROCESSES = 8  # the stage's own processes (outer and init) and a margin over the jail's RLIMIT_NPROC
_serial = itertools.count()


class CgroupUnavailable(RuntimeError):
    """No memory cgroup can be made here (not root, no writable cgroup file system, no controller)."""


@dataclass(frozen=True)
class JailCgroup:
    version: int
    folders: tuple[str, ...]  # v2: one; v1: the memory group, then the pids group
    memory_bytes: int
    processes: int | None

    @property
    def procs_files(self) -> tuple[str, ...]:
        return tuple(os.path.join(folder, "cgroup.procs") for folder in self.folders)

    def describe(self) -> dict:
        return {"version": self.version, "memory_bytes": self.memory_bytes, "processes": self.processes,
                "path": self.folders[0]}

    def oom_kills(self) -> int:
        """How many processes the kernel killed in the group for want of memory."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            with open(os.path.join(self.folders[0], name)) as handle:
                for line in handle:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def remove(self, wait_s: float = 5.0) -> None:
        """Kill every process left in the group and remove it (and the v1 twin)."""
        deadline = time.monotonic() + wait_s
        for folder in self.folders:
            _empty(folder, deadline)
            try:
                os.rmdir(folder)
            except OSError:
                pass


def create_cgroup(memory_bytes: int, processes: int | None) -> JailCgroup:
    """A new group with `memory_bytes` (no swap where the kernel can say so) and `processes` (plus
    EXTRA_PROCESSES) as its limits; CgroupUnavailable when this machine cannot make one."""
    if os.geteuid() != 0:
        raise CgroupUnavailable("the launcher is not root")
    name = f"{os.getpid()}-{next(_serial)}"
    pids = processes + EXTRA_PROCESSES if processes else None
    try:
        if os.path.exists(os.path.join(ROOT, "cgroup.controllers")):
            folders = (_make_v2(name, memory_bytes, pids),)
            version = 2
        else:
            folders = _make_v1(name, memory_bytes, pids)
            version = 1
    except OSError as error:
        raise CgroupUnavailable(f"{error.strerror or error}: {error.filename or ROOT}") from None
    return JailCgroup(version=version, folders=folders, memory_bytes=memory_bytes, processes=pids)


def _make_v2(name: str, memory_bytes: int, pids: int | None) -> str:
    with open(os.path.join(ROOT, "cgroup.controllers")) as handle:
        available = handle.read().split()
    missing = [c for c in ("memory", "pids") if c not in available]
    if missing:
        raise CgroupUnavailable(f"cgroup v2 without the {', '.join(missing)} controller")
    parent = os.path.join(ROOT, FOLDER)
    _enable(ROOT, ("memory", "pids"))
    os.makedirs(parent, exist_ok=True)
    _enable(parent, ("memory", "pids"))
    _sweep(parent)
    folder = os.path.join(parent, name)
    os.mkdir(folder)
    try:
        _write(folder, "memory.max", str(memory_bytes))
        _write(folder, "memory.swap.max", "0", optional=True)
        _write(folder, "pids.max", str(pids) if pids else "max")
    except OSError:
        os.rmdir(folder)
        raise
    return folder


def _make_v1(name: str, memory_bytes: int, pids: int | None) -> tuple[str, str]:
    made = []
    try:
        for controller in ("memory", "pids"):
            base = os.path.join(ROOT, controller)
            if not os.path.isdir(base):
                raise CgroupUnavailable(f"no {controller} cgroup hierarchy at {base}")
            parent = os.path.join(base, _own_v1_path(controller).lstrip("/"), FOLDER)
            os.makedirs(parent, exist_ok=True)
            _sweep(parent)
            folder = os.path.join(parent, name)
            os.mkdir(folder)
            made.append(folder)
        _write(made[0], "memory.limit_in_bytes", str(memory_bytes))
        _write(made[0], "memory.memsw.limit_in_bytes", str(memory_bytes), optional=True)
        _write(made[1], "pids.max", str(pids) if pids else "max")
    except (OSError, CgroupUnavailable):
        for folder in made:
            try:
                os.rmdir(folder)
            except OSError:
                pass
        raise
    return made[0], made[1]


def _own_v1_path(controller: str) -> str:
    with open("/proc/self/cgroup") as handle:
        for line in handle:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controller in controllers.split(","):
                return path
    return "/"


def _enable(folder: str, controllers: tuple[str, ...]) -> None:
    """Pass the controllers to the folder's children (a no-op where they already are)."""
    with open(os.path.join(folder, "cgroup.subtree_control")) as handle:
        enabled = handle.read().split()
    wanted = [c for c in controllers if c not in enabled]
    if wanted:
        _write(folder, "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))


def _write(folder: str, name: str, value: str, optional: bool = False) -> None:
    path = os.path.join(folder, name)
    if optional and not os.path.exists(path):
        return
    with open(path, "w") as handle:
        handle.write(value)


def _sweep(parent: str) -> None:
    """Remove the groups that launchers which have since exited left behind."""
    for entry in os.scandir(parent):
        owner = entry.name.split("-", 1)[0]
        if entry.is_dir(follow_symlinks=False) and owner.isdigit() and not pid_alive(int(owner)):
            _empty(entry.path, time.monotonic() + 1.0)
            try:
                os.rmdir(entry.path)
            except OSError:
                pass


def _empty(folder: str, deadline: float) -> None:
    """SIGKILL every process in the group until none is left or the deadline passes."""
    if os.path.exists(os.path.join(folder, "cgroup.kill")):
        try:
            _write(folder, "cgroup.kill", "1")
        except OSError:
            pass
    while True:
        try:
            with open(os.path.join(folder, "cgroup.procs")) as handle:
                pids = [int(line) for line in handle if line.strip()]
        except (OSError, ValueError):
            return
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
