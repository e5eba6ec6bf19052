"""How a filter worker is started: in cuda_agent.jail's jail (the default), or as a plain process where the
jail is off.

A jailed worker gets a uid of its own, its own mount, pid, network, IPC and UTS namespaces, no
capabilities, seccomp, a fixed environment, rlimits (address space, processes, file size, open files)
and, where one can be made, a memory and pids cgroup for the whole worker (a bound on cuda too, where
the address space cannot be limited). It sees the system folders, the Python installation and the
packages it runs (task_synthesis, evaluator_cuda, cuda_agent), all read-only, and a private /tmp (a
tmpfs of `scratch_bytes`) that holds the evaluator's workspaces and caches: never the user's home or
caches, never the run's output folder.
The jail cannot be nested, so the evaluator inside runs its children without its own jail; the
worker's jail holds them too (same uid, namespaces and limits). On the cuda backend the GPU device
nodes and the driver's libraries are shown as the evaluator shows them to its own jailed children.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import cuda_agent.jail as jail
from cuda_agent.contracts import visible_gpu_count
from cuda_agent.jail import cgroup, uids
from evaluator_cuda.isolation.sandbox import HARNESS_PACKAGES, JAIL_ENV_FIXED, JAIL_ENV_KEEP
from evaluator_cuda.settings import CHILD_FILE_SIZE_BYTES

GiB = 1024**3
PACKAGE = Path(__file__).resolve().parents[1]
ROOT = str(PACKAGE.parent)
SCRATCH = "/tmp"  # the jail's private tmpfs
WORKER_ARGV = ("-m", "task_synthesis.filter.worker_main")
JAILED_ENV = "CUDA_AGENT_SYNTHESIS_JAILED"  # set for a jailed worker: alone with its own in a pid namespace


@dataclasses.dataclass(frozen=True)
class WorkerLimits:
    """Limits of one worker and everything it starts. `memory_bytes` is RLIMIT_AS of each of those
    processes (None: no limit; the default on cuda, where the driver reserves far more address space
    than it uses, as the evaluator does for its own children). `group_memory_bytes` bounds what a jailed
    worker uses in all (its processes' memory, its /tmp, the page cache it fills) in a cgroup, on both
    backends; the kernel kills inside the group at the limit (None: no group)."""

    memory_bytes: int | None = 8 * GiB
    group_memory_bytes: int | None = 16 * GiB
    scratch_bytes: int = 2 * GiB
    processes: int = 4096
    open_files: int = 4096
    job_timeout_s: float = 1800.0  # one candidate, in-process checks and evaluator together
    start_timeout_s: float = 300.0  # from the start to the worker's first frame
    uid_base: int = 400_000  # the evaluator's children use 300000 up, agent episodes 200000 up

    @classmethod
    def for_backend(cls, backend: str, **overrides) -> "WorkerLimits":
        base = {"memory_bytes": None} if backend == "cuda" else {}
        return cls(**{**base, **overrides})


def jail_problem() -> str | None:
    """Why this machine cannot build the jail (None: it can)."""
    machine = jail.probe()
    if machine["namespaces"] and machine["seccomp"]:
        return None
    return machine["reason"] or "the jail's namespaces cannot be made here"


def evaluator_inside(settings: dict | None, limits: WorkerLimits) -> dict | None:
    """The evaluator's settings for a jailed worker: no jail of its own (it cannot be nested), no namespace
    or process limit of its own (the worker's jail has them), its children's address space no larger than
    the worker's (an rlimit cannot be raised), its cache in the worker's private /tmp."""
    if settings is None:
        return None
    inside = {**settings, "jail_children": False, "require_jail": False, "isolate_network": False,
              "child_max_processes": 0, "cache_dir": f"{SCRATCH}/cuda-agent-cache"}
    if limits.memory_bytes:
        asked = settings.get("child_memory_bytes") or limits.memory_bytes
        inside["child_memory_bytes"] = min(limits.memory_bytes, asked)
    return inside


def _environment() -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if k in JAIL_ENV_KEEP}
    python_path = ROOT if ROOT == JAIL_ENV_FIXED["PYTHONPATH"] else f"{ROOT}:{JAIL_ENV_FIXED['PYTHONPATH']}"
    return {**kept, **JAIL_ENV_FIXED, "PYTHONPATH": python_path, "PYTHONDONTWRITEBYTECODE": "1",
            "CUDA_AGENT_CACHE": f"{SCRATCH}/cuda-agent-cache", JAILED_ENV: "1"}


def worker_spec(backend: str, limits: WorkerLimits, uid: int, group: cgroup.JailCgroup | None = None) -> jail.JailSpec:
    gpu = backend == "cuda"
    packages = {str(p) for p in (*HARNESS_PACKAGES, PACKAGE)}
    binds = (*jail.python_binds(), *(jail.Bind(p) for p in sorted(packages)),
             *(jail.nvidia_library_binds() if gpu else ()))
    memory = limits.memory_bytes
    rlimits = jail.Limits(address_space_bytes=memory, data_bytes=memory, processes=limits.processes,
                          file_size_bytes=CHILD_FILE_SIZE_BYTES, open_files=limits.open_files)
    return jail.JailSpec(binds=binds, uid=uid, cwd=SCRATCH, env=_environment(), limits=rlimits,
                         path=os.path.dirname(sys.executable) + ":" + jail.DEFAULT_PATH,
                         devices=jail.gpu_devices() if gpu else (), tmp_bytes=limits.scratch_bytes,
                         shm_bytes=256 * 1024**2, die_with_parent=True, require=True,
                         cgroup_procs=group.procs_files if group else ())


@dataclasses.dataclass
class Started:
    process: subprocess.Popen
    uid: int | None  # the jail's claimed uid, released when the worker is gone
    group: cgroup.JailCgroup | None = None  # the jailed worker's memory and pids group, removed with it

    def oom_kills(self) -> int:
        """How many processes the kernel killed in the worker's group for want of memory (0: no group)."""
        return self.group.oom_kills() if self.group else 0

    def memory_note(self, oom_kills_before: int) -> str:
        """What to add to a verdict when the kernel killed in the worker's group since `oom_kills_before`."""
        if self.oom_kills() <= oom_kills_before:
            return ""
        return f" (at the worker's memory limit of {self.group.memory_bytes / GiB:g} GiB)"


def visible_gpus(environ: dict | None = None, count=visible_gpu_count) -> tuple[str, ...]:
    """The GPUs the run may spread its workers over: CUDA_VISIBLE_DEVICES's entries where it is set, else
    one index per GPU the driver shows (`count`)."""
    listed = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return tuple(e.strip() for e in listed.split(",") if e.strip())
    return tuple(str(i) for i in range(count()))


class Launcher:
    """Starts workers for one run: jailed or plain, for a backend, within `limits`. On cuda with several GPUs,
    the worker of pool slot n sees only GPU n modulo their number (its evaluator's children with it)."""

    def __init__(self, backend: str, jailed: bool, limits: WorkerLimits, gpus: tuple[str, ...] | None = None):
        self.backend, self.jailed, self.limits = backend, jailed, limits
        self.gpus = (visible_gpus() if gpus is None else gpus) if backend == "cuda" else ()

    def gpu_of(self, slot: int | None) -> str | None:
        """The GPU of the pool's `slot` (None: one GPU or none, the environment's choice is kept)."""
        if slot is None or len(self.gpus) < 2:
            return None
        return self.gpus[slot % len(self.gpus)]

    def start(self, slot: int | None = None) -> Started:
        """A new worker (call from the thread that outlives it: the jail dies with its starting thread).
        `slot`: the pool's slot starting it, which picks its GPU (a restarted worker keeps its slot's GPU)."""
        uid = uids.claim_uid(self.limits.uid_base) if self.jailed and jail.probe()["root"] else None
        group = None
        try:
            group = self._group(uid)
            argv, env = self._command(uid, group, self.gpu_of(slot))
            process = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, start_new_session=True)
        except BaseException:
            self.release(Started(None, uid, group))
            raise
        return Started(process, uid, group)

    def _group(self, uid: int | None) -> cgroup.JailCgroup | None:
        """The worker's memory group: jailed as root with a limit set, where the machine can make one."""
        if uid is None or not self.limits.group_memory_bytes:
            return None
        try:
            return cgroup.create_cgroup(self.limits.group_memory_bytes, self.limits.processes)
        except cgroup.CgroupUnavailable:
            return None

    def _command(self, uid: int | None, group: cgroup.JailCgroup | None,
                 gpu: str | None = None) -> tuple[list[str], dict[str, str]]:
        argv = [sys.executable, *WORKER_ARGV]
        gpu_env = {"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {}
        if not self.jailed:
            python_path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
            return argv, {**os.environ, "PYTHONPATH": python_path, **gpu_env}
        spec = worker_spec(self.backend, self.limits, uid or jail.NOBODY, group)
        command = jail.jail_command(dataclasses.replace(spec, env={**spec.env, **gpu_env}), argv)
        return command.argv, command.env

    @staticmethod
    def release(started: Started) -> None:
        """Kill whatever is left in the worker's group and runs as its uid; remove the group, free the uid."""
        if started.group is not None:
            started.group.remove()
        if started.uid is not None:
            uids.release_uid(started.uid)
