"""The one place where the evaluator starts child processes.

A child is `python -m evaluator_cuda.roles.child <role>` in its own session (process group), with
resource limits, its stdout/stderr going to a log file that is never parsed for a verdict,
and one end of a socket pair the parent owns as its only channel (see wire.py). On timeout
the whole process group is killed.

An untrusted child (the candidate and the build child) starts in cuda_agent.jail's jail: a uid
of its own, its own mount/pid/network/IPC/UTS namespaces, no capabilities, no_new_privs,
seccomp, rlimits and a fixed environment. It sees read-only system folders, the Python
installation, the evaluator's own code (read-only: the child's entry point) and the folders
its Child is given (the candidate: its solution copy and its extension, read-only; the build
child: its build folder, writable), a private /tmp and nothing else. child_guard() decides from
the settings whether the jail is used and required; protections() records what applied.
Without the jail (jails_children() False: the setting, or the cuda backend's default; or a
machine that cannot build it while it is not required) the child gets rlimits and, where
`unshare` works, its own network namespace.
EvaluationSlot / StandbySlots start an evaluation's two children ahead of their work,
warming (torch imported, CUDA context made). Where forking is on (forkserver.py), children are
forked from a server that has imported torch instead of starting fresh: a reference child (trusted:
it runs the task's own code) from one started with the evaluator's environment, a jailed child
from one started with its jail's environment, building its jail after the fork.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import cuda_agent.jail as jail_mod
from cuda_agent.jail import cgroup as jail_cgroup
from cuda_agent.jail import uids as jail_uids

from ..settings import CHILD_FILE_SIZE_BYTES, CHILD_OPEN_FILES
from . import forkserver, wire

CHANNEL_FD_ENV = "CUDA_AGENT_CHANNEL_FD"


class ChildFailed(Exception):
    """The child did not answer: it died, hung past its deadline, or broke the protocol.

    `kind` is "died", "timeout" or "protocol"; `log_tail` holds the end of its stdout/stderr.
    """

    def __init__(self, kind: str, message: str, log_tail: str = "", returncode: int | None = None):
        super().__init__(message)
        self.kind = kind
        self.log_tail = log_tail
        self.returncode = returncode


LIMITS_ENV = "CUDA_AGENT_CHILD_LIMITS"


def _user_task_count() -> int:
    """Processes and threads of this user now (what RLIMIT_NPROC counts)."""
    uid, count = os.getuid(), 0
    try:
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    if entry.stat().st_uid == uid:
                        count += len(os.listdir(f"/proc/{entry.name}/task"))
                except OSError:
                    pass
    except OSError:
        return 0
    return count


def limit_resources(file_size_limit: int, open_files_limit: int, memory_bytes: int = 0, extra_processes: int = 0,
                    cpu_seconds: int = 0) -> None:
    """Applied by the child to itself first thing, before any candidate code can run
    (not a preexec_fn: the parent may be multi-threaded). 0 leaves a limit unset."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = open_files_limit if hard == resource.RLIM_INFINITY else min(open_files_limit, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    if memory_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    if cpu_seconds:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
    if extra_processes:
        n = _user_task_count() + extra_processes
        resource.setrlimit(resource.RLIMIT_NPROC, (n, n))


_NETNS_PREFIX: list | None = None


def network_namespace_prefix() -> list[str]:
    """The command prefix that starts a child without network (`unshare -n`, or `unshare -rn`
    through a user namespace), or [] when the OS allows neither. Probed once per process."""
    global _NETNS_PREFIX
    if _NETNS_PREFIX is None:
        _NETNS_PREFIX = []
        for prefix in (["unshare", "-n"], ["unshare", "-rn"]):
            try:
                if subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0:
                    _NETNS_PREFIX = [*prefix, "--"]
                    break
            except (OSError, subprocess.TimeoutExpired):
                continue
    return list(_NETNS_PREFIX)


def protections(memory_bytes: int | None, extra_processes: int, cpu_seconds: int, isolate_network: bool,
                file_size_bytes: int = CHILD_FILE_SIZE_BYTES, open_files: int = CHILD_OPEN_FILES) -> dict:
    """What a child gets, as recorded in the result: which protections applied and which not."""
    prefix = network_namespace_prefix() if isolate_network else []
    return {
        "process_group": True,
        "network": _network_protection(prefix, isolate_network),
        "memory_bytes": memory_bytes or None,
        "extra_processes": (extra_processes if os.getuid() != 0
                            else f"{extra_processes} (not enforced: running as root)"),
        "cpu_seconds": cpu_seconds,
        "file_size_bytes": file_size_bytes,
        "open_files": open_files,
        "solution_read_only": "by permissions" + (" (not enforced: running as root)" if os.getuid() == 0 else ""),
        "command_prefix": prefix,
    }


def _network_protection(prefix: list[str], isolate_network: bool) -> str:
    if prefix:
        return "namespace (" + " ".join(prefix[:-1]) + ")"
    return "not isolated: unshare unavailable" if isolate_network else "not isolated: disabled"


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


def _own_limits(guard: dict, jailed: bool) -> tuple[int, int, int, int, int]:
    """limit_resources()'s arguments for a child with `guard`. Jailed, only file size and open files
    (the jail's own values): the jail sets memory, processes (of its own uid) and CPU time as hard
    limits the child cannot raise."""
    jail_settings = guard.get("jail") or {}
    file_size = jail_settings.get("file_size_bytes") or guard.get("file_size_bytes") or CHILD_FILE_SIZE_BYTES
    open_files = jail_settings.get("open_files") or guard.get("open_files") or CHILD_OPEN_FILES
    if jailed:
        return file_size, open_files, 0, 0, 0
    procs = guard.get("extra_processes") or 0
    procs = procs if isinstance(procs, int) else 0
    return file_size, open_files, guard.get("memory_bytes") or 0, procs, guard.get("cpu_seconds") or 0


class Child:
    """A running child process with its channel. Use as a context manager; close() kills the group."""

    def __init__(
        self,
        role: str,
        workdir: Path,
        env: dict[str, str] | None = None,
        log_name: str | None = None,
        guard: dict | None = None,
        binds: tuple = (),
    ):
        """`guard`: child_guard() for an untrusted child (the jail, or rlimits and a network
        namespace); None: the default file-size and open-files limits only. `binds`: what a jailed child
        sees besides the system, Python and the evaluator's code (jail.Bind; the working folder is not
        shown unless bound)."""
        self.role = role
        self.workdir = Path(workdir)
        self.log_path = self.workdir / (log_name or f"{role}.log")
        parent_sock, child_sock = socket.socketpair()
        self.sock = parent_sock
        guard = guard or {}
        jail_settings = guard.get("jail") or {}
        jailed = bool(jail_settings.get("enabled"))
        limits = _own_limits(guard, jailed)
        child_env = {} if jailed else dict(os.environ)
        child_env.update(env or {})
        child_env.update(MALLOC_ENV)
        child_env[CHANNEL_FD_ENV] = str(child_sock.fileno())
        child_env[LIMITS_ENV] = ",".join(str(limit) for limit in limits)
        child_env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
        argv = [jail_mod.this_python(), "-m", "evaluator_cuda.roles.child", role]
        popen_env, cwd, self.protections = child_env, str(self.workdir), None
        self._claimed_uid = None  # a uid of its own, claimed here, released (with its processes) by kill()
        self._cgroup = None  # the jail's memory and pids cgroup, removed by kill()
        self._log = None
        try:
            plan = None
            if jailed:
                argv, popen_env, plan = self._jailed_command(jail_settings, argv, child_env, binds, child_sock.fileno())
            else:
                argv = [*guard.get("command_prefix", []), *argv]
            self._log = open(self.log_path, "ab")
            forked = None
            if forkserver.enabled() and role == "reference" and not guard:  # trusted: forked, torch imported
                forked = forkserver.spawn_reference(cwd, popen_env, child_sock.fileno(), self._log.fileno())
            elif forkserver.enabled() and plan is not None and role in forkserver.JAILED_ROLES:  # jailed after the fork
                forked = forkserver.spawn_jailed(role, plan, child_sock.fileno(), self._log.fileno())
            self.forked = forked is not None
            self.proc = forked or subprocess.Popen(
                argv,
                cwd=cwd,
                env=popen_env,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                pass_fds=(child_sock.fileno(),),
                start_new_session=True,
            )
        except BaseException:  # nothing claimed for a child that never started is kept
            if self._log is not None:
                self._log.close()
            parent_sock.close()
            self._release_uid()
            self._remove_cgroup()
            raise
        finally:
            child_sock.close()

    def _jailed_command(self, jail_settings: dict, argv: list, child_env: dict, binds: tuple, channel_fd: int):
        """The jail's argv and environment for `argv`, with a uid of its own claimed and a memory cgroup
        made where the settings ask for them (both given back by kill())."""
        if not jail_settings.get("uid"):
            self._claimed_uid = jail_uids.claim_uid(int(jail_settings["uid_base"]))
            jail_settings = {**jail_settings, "uid": self._claimed_uid}
        self._cgroup, cgroup_record = _jail_cgroup(jail_settings)
        shown = any(Path(b.target or b.source) == self.workdir for b in binds)
        spec = _jail_spec(jail_settings, child_env, binds, channel_fd, cwd=str(self.workdir) if shown else "/tmp")
        if self._cgroup is not None:
            spec = dataclasses.replace(spec, cgroup_procs=self._cgroup.procs_files)
        command = jail_mod.jail_command(spec, argv)
        self.protections = {**command.protections, "memory_cgroup": cgroup_record}
        return command.argv, command.env, command.plan

    def log_tail(self, max_chars: int = 4000) -> str:
        try:
            self._log.flush()
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-max_chars:].decode("utf-8", "replace")

    def submit(self, message: dict) -> None:
        """Send one request without waiting (the reply is collected by result())."""
        try:
            wire.send_message(self.sock, message)
        except wire.ChannelClosed:
            pass  # the child is gone; result() reports how it ended

    def result(self, timeout: float, tensor_meta: list | None = None) -> dict:
        """Wait for the reply to the last request; ChildFailed if the child dies, hangs or misbehaves."""
        try:
            reply = wire.recv_message(self.sock, timeout=timeout, tensor_meta=tensor_meta)
        except wire.ChannelTimeout:
            self.kill()
            raise ChildFailed("timeout", f"{self.role} process gave no answer within {timeout:.0f} s", self.log_tail())
        except wire.ChannelClosed:
            code = self._wait_exit(5.0)
            raise ChildFailed("died", f"{self.role} process {describe_exit(code)}{self._memory_note()}",
                              self.log_tail(), code)
        except wire.ProtocolError as exc:
            self.kill()
            raise ChildFailed("protocol", f"{self.role} process broke the protocol: {exc}", self.log_tail())
        if not isinstance(reply, dict):
            self.kill()
            raise ChildFailed("protocol", f"{self.role} process sent a reply that is not a mapping", self.log_tail())
        return reply

    def request(self, message: dict, timeout: float, tensor_meta: list | None = None) -> dict:
        self.submit(message)
        return self.result(timeout, tensor_meta)

    def _wait_exit(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.returncode

    def kill(self) -> None:
        """Kill the child's whole process group (it may have started its own children)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            try:  # the leader exited; kill stragglers left in its group
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._remove_cgroup()
        self._release_uid()

    def _memory_note(self) -> str:
        if self._cgroup is None or not self._cgroup.oom_kills():
            return ""
        return f" (killed at its memory limit of {self._cgroup.memory_bytes / 1024**3:.1f} GiB)"

    def _remove_cgroup(self) -> None:
        if self._cgroup is not None:
            group, self._cgroup = self._cgroup, None
            group.remove()

    def _release_uid(self) -> None:
        """Kill whatever still runs as the child's own uid and give the uid back."""
        if self._claimed_uid is not None:
            uid, self._claimed_uid = self._claimed_uid, None
            jail_uids.release_uid(uid)

    def close(self) -> None:
        """Ask politely, then kill the group."""
        if self.proc.poll() is None:
            try:
                wire.send_message(self.sock, {"cmd": "exit"})
                self.proc.wait(timeout=1.0)
            except (wire.ChannelClosed, subprocess.TimeoutExpired, OSError):
                pass
        self.kill()
        self.sock.close()
        self._log.close()

    def __enter__(self) -> "Child":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


HOST_CHILD_MEMORY_BYTES = 32 * 1024**3
# The memory cgroup limit of a jailed CUDA child (RLIMIT_AS cannot bound one): torch, the CUDA
# context and pinned staging buffers take a few GiB.
CUDA_CHILD_MEMORY_BYTES = 32 * 1024**3
# The folders holding the evaluator's own code: shown read-only to a jailed child (its entry point).
HARNESS_PACKAGES = (Path(__file__).resolve().parents[1], Path(jail_mod.__file__).resolve().parents[1])
HARNESS_ROOT = str(HARNESS_PACKAGES[0].parent)
# glibc's malloc, fixed alike in every child. By default a freed mmap-ed block raises the size above which
# blocks are mmap-ed, so whether an output of a few MiB comes from the heap or from fresh, page-faulting
# pages depends on what the process did before, and a timed call's time with it: one candidate timed
# 519 to 2,022 us across runs on the host, 489 to 769 us with these settings (docs/figures.md).
# torch's CPU allocator puts blocks of 2 MiB or more on transparent huge pages: a fresh 64 MiB output
# faults in 32 pages instead of 16,384 (torch.relu on 64 MiB: 47-55 ms with small pages, 12.8 ms).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 * 1024**2), "MALLOC_TRIM_THRESHOLD_": str(256 * 1024**2),
              "MALLOC_TOP_PAD_": str(64 * 1024**2), "THP_MEM_ALLOC_ENABLE": "1"}
# Variables a jailed child may get from its Child's env (everything else is dropped); those naming
# cache folders of the host are pointed inside the jail's private /tmp instead.
JAIL_ENV_KEEP = (CHANNEL_FD_ENV, LIMITS_ENV, "CUDA_AGENT_CHILD_WARM", "CUDA_AGENT_BINDING_RUNTIME",
                 "CUDA_AGENT_TRACE_KERNELS", "TORCH_CUDA_ARCH_LIST", "PYTHONDONTWRITEBYTECODE", "CUDA_VISIBLE_DEVICES",
                 "CUDA_DEVICE_ORDER", "CXX", "CUDA_HOME",  # the last two: set by the harness (build_env)
                 *MALLOC_ENV)
JAIL_ENV_FIXED = {
    "PYTHONPATH": HARNESS_ROOT,
    "PYTHONNOUSERSITE": "1",
    "TORCH_EXTENSIONS_DIR": "/tmp/torch_extensions",
    "XDG_CACHE_HOME": "/tmp/.cache",
    "TRITON_CACHE_DIR": "/tmp/.triton",
    "CUDA_CACHE_PATH": "/tmp/.nv",
    "TMPDIR": "/tmp",
}


def available_memory_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (None where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _jail_cgroup(jail_settings: dict) -> tuple["jail_cgroup.JailCgroup | None", dict]:
    """The memory and pids cgroup of one jailed child, and what the record says of it. A machine
    that cannot make one runs the child without (said in the record)."""
    memory = jail_settings.get("cgroup_memory_bytes")
    if not memory:
        return None, {"missing": "no memory limit set"}
    try:
        group = jail_cgroup.create_cgroup(int(memory), jail_settings.get("processes"))
    except jail_cgroup.CgroupUnavailable as exc:
        return None, {"missing": str(exc)}
    return group, group.describe()


def _whole_gib_of_available(memory: int) -> int:
    """`memory`, never more than the machine has available now, in whole GiB (at least one): a warm
    standby slot stays usable while free memory drifts. 0 stays 0 (no limit)."""
    available = available_memory_bytes()
    if memory and available:
        memory = min(memory, max(1024**3, available // 1024**3 * 1024**3))
    return memory


def cgroup_memory_limit(settings) -> int:
    """The memory cgroup limit of a jailed child: its address-space limit where it has one (the host),
    else CUDA_CHILD_MEMORY_BYTES, never more than the machine has available now."""
    return child_memory_limit(settings) or _whole_gib_of_available(CUDA_CHILD_MEMORY_BYTES)


def child_memory_limit(settings) -> int:
    """The address-space limit of an untrusted child: the setting (host default 32 GiB) but never
    more than the memory the machine has available now; 0 (none) on CUDA unless set."""
    memory = settings.child_memory_bytes
    if memory is None:
        memory = HOST_CHILD_MEMORY_BYTES if settings.backend == "host" else 0
    return _whole_gib_of_available(memory)


def require_jail_default() -> bool:
    """Where nothing is said: the jail is required on Linux when running as root."""
    return sys.platform.startswith("linux") and os.geteuid() == 0


def jails_children(settings) -> bool:
    """Whether the candidate and build children are jailed: the setting, else on (both backends)."""
    return True if settings.jail_children is None else bool(settings.jail_children)


def child_guard(settings) -> dict:
    """protections() for the candidate and build children of an evaluation with `settings`.

    No address-space limit on CUDA by default: the driver reserves far more virtual memory
    than it uses, so RLIMIT_AS would break every CUDA child.
    """
    memory = child_memory_limit(settings)
    guard = protections(memory, settings.child_max_processes, settings.child_cpu_seconds,
                        settings.isolate_network and not jails_children(settings),
                        settings.child_file_size_bytes, settings.child_open_files)
    require = settings.require_jail if settings.require_jail is not None else require_jail_default()
    if jails_children(settings):
        guard["jail"] = {
            "enabled": True, "require": bool(require), "uid_base": settings.jail_uid_base,
            "gpu": settings.backend == "cuda", "memory_bytes": memory, "processes": settings.child_max_processes,
            "cpu_seconds": settings.child_cpu_seconds, "file_size_bytes": settings.child_file_size_bytes,
            "open_files": settings.child_open_files, "tmp_bytes": settings.jail_tmp_bytes,
            "cgroup_memory_bytes": cgroup_memory_limit(settings),
        }
        guard["network"] = "namespace (the jail's)"
        guard["extra_processes"] = f"{settings.child_max_processes} (RLIMIT_NPROC of the jail's own uid)"
        guard["solution_read_only"] = "read-only bind in the jail, unprivileged uid"
        guard["command_prefix"] = []
        spec = _jail_spec(guard["jail"], {}, (), None)
        try:
            guard["jail_protections"] = jail_mod.protections(spec)
        except jail_mod.JailUnavailable as exc:
            guard["jail_protections"] = {"jail": "unavailable", "missing": [str(exc)]}
    else:
        why = "jail_children=False" if settings.jail_children is False else "the cuda backend's default"
        guard["jail"] = {"enabled": False, "reason": f"disabled by the settings ({why})"}
    return guard


@contextlib.contextmanager
def own_uid(jail_settings: dict | None):
    """`jail_settings` (child_guard()["jail"]) with a uid claimed for this holder alone: jails that
    shared a uid would share RLIMIT_NPROC (one busy jail starves the others' forks) and each other's
    files. On exit the uid's remaining processes are killed and the claim freed. Unchanged when the
    jail is off or a uid is set already."""
    if not (jail_settings and jail_settings.get("enabled")) or jail_settings.get("uid"):
        yield jail_settings
        return
    uid = jail_uids.claim_uid(int(jail_settings["uid_base"]))
    try:
        yield {**jail_settings, "uid": uid}
    finally:
        jail_uids.release_uid(uid)


def hand_over(folder: Path, uid: int) -> None:
    """A folder (and everything in it) to a jail's uid, which writes its output there."""
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, uid, uid, follow_symlinks=False)


def jailed_command(jail_settings: dict, argv: list[str], binds: tuple, cwd: str,
                   memory_bytes: int | None = None,
                   file_size_bytes: int | None = None) -> tuple[list[str], dict[str, str]]:
    """(argv, env) of a one-shot untrusted command (a compiler on a candidate's sources) in the
    jail of `jail_settings` (child_guard()["jail"]), seeing `binds` and the usual read-only
    folders; the caller starts it in its own session and kills the session on timeout."""
    if not jail_settings.get("uid"):
        raise ValueError("a jailed command needs a uid of its own (own_uid)")
    settings = dict(jail_settings)
    if memory_bytes:
        settings["memory_bytes"] = min(memory_bytes, settings.get("memory_bytes") or memory_bytes)
    if file_size_bytes:
        settings["file_size_bytes"] = file_size_bytes
    settings["gpu"] = False
    spec = _jail_spec(settings, {}, binds, None, cwd=cwd)
    spec = dataclasses.replace(spec, die_with_parent=True)  # the starting thread waits for it
    command = jail_mod.jail_command(spec, argv)
    return command.argv, command.env


def _jail_spec(settings: dict, env: dict[str, str], binds: tuple, channel_fd: int | None,
               cwd: str | None = None) -> "jail_mod.JailSpec":
    """The jail of one untrusted child (see the module docstring)."""
    kept = {k: v for k, v in env.items() if k in JAIL_ENV_KEEP}
    python_bin = os.path.dirname(jail_mod.this_python())
    path = python_bin + ":" + jail_mod.DEFAULT_PATH
    gpu = bool(settings.get("gpu"))
    all_binds = (*jail_mod.python_binds(), *(jail_mod.Bind(str(p)) for p in HARNESS_PACKAGES), *binds)
    if gpu:
        all_binds = (*all_binds, *jail_mod.nvidia_library_binds())
    memory = settings.get("memory_bytes") or None
    limits = jail_mod.Limits(address_space_bytes=memory, data_bytes=memory, processes=settings.get("processes"),
                             file_size_bytes=settings.get("file_size_bytes"), open_files=settings.get("open_files"),
                             cpu_seconds=settings.get("cpu_seconds") or None)
    return jail_mod.JailSpec(
        binds=tuple(all_binds), uid=int(settings.get("uid") or settings.get("uid_base") or jail_mod.NOBODY), cwd=cwd,
        env={**kept, **JAIL_ENV_FIXED}, path=path, limits=limits,
        devices=jail_mod.gpu_devices() if gpu else (), tmp_bytes=int(settings.get("tmp_bytes") or 256 * 1024**2),
        pass_fds=(channel_fd,) if channel_fd is not None else (),
        die_with_parent=threading.current_thread() is threading.main_thread(),
        require=bool(settings.get("require")),
    )


# --- Children started ahead of time -------------------------------------------------------
#
# Most of a cached evaluation's wall time used to be its children starting: Python, `import
# torch` and (on a GPU) the CUDA context, once per child, per evaluation. An EvaluationSlot is
# an evaluation's working folder with both children already started and warming (torch
# imported, the CUDA context made) before any task or candidate code reaches them. An
# evaluation takes its slot before its static checks and build, so a cold slot warms while the
# candidate compiles; a StandbySlots keeps the next slot warming in the background, so a
# worker's next evaluation finds its children ready. A slot's children never run code of two
# evaluations: a slot is handed out once, and closed (whole process groups killed) after use.

WARM_ENV = "CUDA_AGENT_CHILD_WARM"
SLOT_DIR_ENV = "CUDA_AGENT_SLOT_DIR"
SLOT_PREFIX = "cuda-agent-eval-"


def remove_slot_dir(path: str | Path) -> None:
    """Remove an evaluation slot's folder, read-only solution copy included (only a folder
    named like one: a stray environment variable cannot aim this elsewhere)."""
    folder = Path(path)
    if not folder.name.startswith(SLOT_PREFIX) or not folder.is_dir():
        return
    for sub in folder.rglob("*"):
        if sub.is_dir() and not sub.is_symlink():
            try:
                sub.chmod(0o755)
            except OSError:
                pass
    shutil.rmtree(folder, ignore_errors=True)


def warm_up(device_type: str) -> None:
    """What a fresh child does before its first request: import torch and, on a GPU, make the
    CUDA context. Failures are left for the first request to report."""
    try:
        import torch

        if device_type == "cuda" and torch.cuda.is_available():
            torch.empty(1, device="cuda")
    except Exception:
        pass


def _slot_key(env: dict[str, str], guard: dict) -> tuple:
    merged = dict(os.environ)
    merged.update(env)
    merged.pop(CHANNEL_FD_ENV, None)
    # The memory limits follow the machine's free memory (child_memory_limit, cgroup_memory_limit): a
    # standby slot started a moment earlier keeps its own, so they are not part of the key.
    stable = {k: v for k, v in guard.items() if k not in ("command_prefix", "memory_bytes", "jail_protections")}
    stable["jail"] = {k: v for k, v in (guard.get("jail") or {}).items()
                      if k not in ("memory_bytes", "cgroup_memory_bytes")}
    limits = tuple(sorted((k, str(v)) for k, v in stable.items()))
    return (jail_mod.this_python(), tuple(sorted(merged.items())), tuple(guard.get("command_prefix", [])), limits)


class EvaluationSlot:
    """A working folder with a reference child (cwd: the folder) and a candidate child (cwd: its
    empty `solution/`, log one level up), both started at once and warming."""

    def __init__(self, env: dict[str, str], guard: dict, device_type: str):
        self.key = _slot_key(env, guard)
        self.env, self.guard, self.device_type = dict(env), dict(guard), device_type
        self.workdir = Path(tempfile.mkdtemp(prefix=SLOT_PREFIX))
        (self.workdir / "solution").mkdir()
        self.extension_dir = self.workdir / "extension"  # the built extension's copy, for the candidate's eyes
        self.extension_dir.mkdir()
        self.started_at = time.monotonic()
        self.used = False  # set once a request reached either child: from then on, never reused
        warm_env = {**env, WARM_ENV: device_type}
        self.reference = Child("reference", self.workdir, env={**warm_env, SLOT_DIR_ENV: str(self.workdir)})
        try:
            self.candidate = Child("candidate", self.workdir / "solution", env=warm_env, log_name="../candidate.log",
                                   guard=guard, binds=(jail_mod.Bind(str(self.workdir / "solution")),
                                                       jail_mod.Bind(str(self.extension_dir))))
        except BaseException:
            self.reference.close()
            raise
        for child in (self.reference, self.candidate):  # answered once the child's start is done
            child.submit({"cmd": "ready"})
        self.start_marks: dict | None = None  # role -> marks, once both answered
        self._ready_lock = threading.Lock()
        self.taken_at: float | None = None  # when StandbySlots.take handed it to an evaluation

    def wait_ready(self, timeout: float) -> dict:
        """Wait until both children's start is done (torch imported, CUDA context made, kernel trace
        started); their start marks by role. ChildFailed when one died or hung (then killed)."""
        with self._ready_lock:
            if self.start_marks is None:
                deadline = time.monotonic() + timeout
                self.start_marks = {child.role: child.result(max(0.1, deadline - time.monotonic())).get("start_marks")
                                    for child in (self.reference, self.candidate)}
            return self.start_marks

    def alive(self) -> bool:
        return self.reference.proc.poll() is None and self.candidate.proc.poll() is None

    def close(self) -> None:
        """Kill both children's process groups at once and remove the folder. No polite exit:
        every reply has been read, the children flush their logs after each request, and an
        interpreter with torch (and a CUDA context) takes up to a second to exit on its own."""
        try:
            self.candidate.kill()
            self.reference.kill()
        finally:
            for child in (self.candidate, self.reference):
                child.sock.close()
                child._log.close()
            remove_slot_dir(self.workdir)


class StandbySlots:
    """Evaluation slots kept warming for the next evaluations, oldest first (thread-safe).

    take() hands out the oldest standby slot started for the same environment and protections
    whose children are both alive, else starts a fresh one; refill(depth=N) starts slots until N
    matching ones are warming, so that back to back each pair has N evaluations' time to start. A
    slot that was never used (no request sent) may be given back.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._queue: list[EvaluationSlot] = []  # oldest first
        self.hits = 0
        self.misses = 0

    def peek(self) -> EvaluationSlot | None:
        """The slot the next take() considers first (None without a standby)."""
        with self._lock:
            return self._queue[0] if self._queue else None

    def warming(self) -> int:
        """How many standby slots there are."""
        with self._lock:
            return len(self._queue)

    def take(self, env: dict[str, str], guard: dict, device_type: str) -> EvaluationSlot:
        key = _slot_key(env, guard)
        with self._lock:
            stale = [s for s in self._queue if s.key != key or not s.alive()]
            self._queue = [s for s in self._queue if s not in stale]
            slot = self._queue.pop(0) if self._queue else None
        for old in stale:
            old.close()
        if slot is not None:
            self.hits += 1
        else:
            self.misses += 1
            slot = EvaluationSlot(env, guard, device_type)
        slot.taken_at = time.monotonic()
        return slot

    def refill(self, env: dict[str, str], guard: dict, device_type: str, depth: int = 1) -> None:
        """Start slots for the next evaluations until `depth` matching ones are warming; slots for
        other settings, dead ones and any beyond `depth` are closed."""
        key = _slot_key(env, guard)
        with self._lock:
            keep = [s for s in self._queue if s.key == key and s.alive()][:depth]
            dropped = [s for s in self._queue if s not in keep]
            self._queue = keep
            missing = depth - len(keep)
        for old in dropped:
            old.close()
        for _ in range(missing):
            slot = EvaluationSlot(env, guard, device_type)
            with self._lock:
                self._queue.append(slot)

    def wait_ready(self, timeout: float) -> float | None:
        """Wait until every standby slot's start is done; the seconds waited (None without a standby).
        A standby that fails to start is closed (a later take starts a fresh one)."""
        with self._lock:
            slots = list(self._queue)
        if not slots:
            return None
        begin = time.monotonic()
        deadline = begin + timeout
        for slot in slots:
            try:
                slot.wait_ready(max(0.1, deadline - time.monotonic()))
            except ChildFailed:
                with self._lock:
                    if slot in self._queue:
                        self._queue.remove(slot)
                slot.close()
        return round(time.monotonic() - begin, 4)

    def give_back(self, slot: EvaluationSlot) -> None:
        """Keep an unused slot as the first standby (an evaluation that ended before its children ran)."""
        expected = ("solution", "extension", "reference.log", "candidate.log")
        leftovers = [p for p in slot.workdir.iterdir() if p.name not in expected] if slot.workdir.exists() else []
        used_dirs = any(any(slot.workdir.joinpath(d).iterdir()) for d in ("solution", "extension"))
        if slot.used or leftovers or used_dirs or not slot.alive():
            slot.close()
            return
        with self._lock:
            self._queue.insert(0, slot)

    def close(self) -> None:
        with self._lock:
            slots, self._queue = self._queue, []
        for slot in slots:
            slot.close()
