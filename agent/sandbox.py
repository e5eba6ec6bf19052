"""Commands of the agent run in a child process the agent loop controls, inside a jail
(`cuda_agent.jail`): its own mount, pid, network, IPC and UTS namespaces; a view of the workspace
(read-write) and read-only system directories, the Python installation and the CUDA toolchain
under /usr, nothing else (no /root, no harness source, no other workspace); an unprivileged uid
of its own when the agent runs as root, no capabilities, no_new_privs, a seccomp filter; resource
limits (CPU time, address space, processes, file size, no core files); a fixed environment.

A command sees only its own processes, and everything it starts dies when it exits or when it is
killed at its timeout (the jail's pid namespace ends). `sandbox_report()` says which of these the
current machine gives; where the machine cannot build the jail the report says what is missing,
and `SandboxLimits.require_jail` turns that into an error instead.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sys
import time
from dataclasses import dataclass

from agent.config import SandboxLimits
from cuda_agent.jail import Bind, JailSpec, Limits, gpu_devices, jail_command, nvidia_library_binds, probe, protections, python_binds

# Cap on bytes kept from one command's output in memory (the tool truncates further).
OUTPUT_MEMORY_CAP_BYTES = 8 * 1024 * 1024
# The uid of commands when the agent is root but the workspace has no uid of its own.
FALLBACK_UID = 65534


@dataclass(frozen=True)
class CommandResult:
    """What a finished (or killed) command left: merged stdout+stderr and how it ended."""

    output: bytes
    total_output_bytes: int
    exit_code: int | None
    timed_out: bool
    seconds: float


def can_switch_uid() -> bool:
    """Whether commands can run as an unprivileged uid of their own (needs root)."""
    return os.geteuid() == 0


def jail_has_view() -> bool:
    """Whether this machine builds the jail's own namespaces and file-system view."""
    return bool(probe()["namespaces"])


def _count_processes_of(uid: int) -> int:
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += 1
            except OSError:
                pass
    return count


def _process_limit(limits: SandboxLimits, switching_uid: bool) -> int:
    # RLIMIT_NPROC counts every process of the uid, the jail's init included: for a shared uid,
    # leave room for the ones that already exist.
    return limits.max_processes + 1 if switching_uid else limits.max_processes + 1 + _count_processes_of(os.getuid())


def sandbox_env(workspace: str) -> dict[str, str]:
    """The variables a command gets besides PATH and LANG: the workspace as HOME and TMPDIR (so
    files there outlive one command), no secrets of the agent's environment."""
    env = {"HOME": workspace, "TMPDIR": workspace, "TERM": "dumb"}
    for name in ("CUDA_HOME", "CUDA_PATH", "TORCH_CUDA_ARCH_LIST"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def sandbox_path() -> str:
    """PATH in the jail: this Python's bin folder, the CUDA toolchain, the system folders."""
    folders = [os.path.dirname(sys.executable), "/usr/local/cuda/bin", "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
    return ":".join(dict.fromkeys(folders))


def jail_spec(limits: SandboxLimits, workspace: str | None, uid: int | None) -> JailSpec:
    """The jail of a command run in `workspace` (None: the spec without a workspace, for reports)."""
    binds: list[Bind] = [Bind(workspace, writable=True)] if workspace else []
    binds += python_binds()
    binds += [Bind(path) for path in limits.read_only_paths if os.path.exists(path)]
    devices = gpu_devices() if limits.gpu else ()
    if devices:
        binds += nvidia_library_binds()
    switching = can_switch_uid()
    return JailSpec(
        binds=tuple(binds),
        uid=uid if (uid is not None and switching) else FALLBACK_UID,
        cwd=workspace,
        env=sandbox_env(workspace or "/tmp"),
        path=sandbox_path(),
        limits=Limits(
            cpu_seconds=limits.cpu_seconds,
            address_space_bytes=limits.memory_bytes,
            processes=_process_limit(limits, switching and uid is not None),
            file_size_bytes=limits.max_file_bytes,
        ),
        devices=devices,
        share_network=not limits.no_network,
        require=limits.require_jail,
    )


@functools.lru_cache(maxsize=None)
def _report(limits: SandboxLimits) -> dict:
    record = protections(jail_spec(limits, None, FALLBACK_UID if can_switch_uid() else None))
    return {
        "process_group_kill": True,
        "resource_limits": True,
        "no_network": bool(limits.no_network and "network" in record["namespaces"]),
        "own_uid": can_switch_uid(),
        "own_pid_namespace": "pid" in record["namespaces"],
        "file_system_view": isinstance(record["filesystem"], dict),
        "seccomp": record["seccomp"] is not None,
        "missing": record["missing"],
    }


def sandbox_report(limits: SandboxLimits | None = None) -> dict:
    """Which isolation features this machine gives commands (for logs and the transcript)."""
    return dict(_report(limits or SandboxLimits()))


def _group_has_live_members(pgid: int) -> bool:
    """Whether a process of group `pgid` is still running (zombies, which killpg still counts
    until their parent reaps them, do not)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def kill_process_group(pgid: int) -> None:
    """SIGKILL a whole process group, repeating until it is gone (a fork loop cannot outrun it)."""
    for _ in range(100):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        except PermissionError:
            return
        time.sleep(0.01)
        if not _group_has_live_members(pgid):
            return


async def start_command(command: str, cwd: str, limits: SandboxLimits, uid: int | None) -> asyncio.subprocess.Process:
    """Start `command` with bash in the jail; stdout and stderr merged into one pipe."""
    jailed = jail_command(jail_spec(limits, cwd, uid), ["bash", "--noprofile", "--norc", "-c", command])
    return await asyncio.create_subprocess_exec(
        *jailed.argv,
        cwd=cwd,
        env=jailed.env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )


async def _drain(stream: asyncio.StreamReader, sink: bytearray, counter: list[int]) -> None:
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return
        counter[0] += len(chunk)
        room = OUTPUT_MEMORY_CAP_BYTES - len(sink)
        if room > 0:
            sink += chunk[:room]


async def run_command(
    command: str, cwd: str, limits: SandboxLimits, uid: int | None, timeout_seconds: float
) -> CommandResult:
    """Run `command` to completion or kill its process group at `timeout_seconds`."""
    start = time.monotonic()
    process = await start_command(command, cwd, limits, uid)
    sink, counter = bytearray(), [0]
    reader = asyncio.ensure_future(_drain(process.stdout, sink, counter))
    timed_out = False
    try:
        await asyncio.wait_for(process.wait(), timeout=timeout_seconds)
    except asyncio.TimeoutError:
        timed_out = True
        kill_process_group(process.pid)
        await process.wait()
    # Children that keep the pipe open (e.g. `sleep 100 &`) must not hold the tool forever.
    try:
        await asyncio.wait_for(asyncio.shield(reader), timeout=1.0)
    except asyncio.TimeoutError:
        kill_process_group(process.pid)
        try:
            await asyncio.wait_for(reader, timeout=2.0)
        except asyncio.TimeoutError:
            reader.cancel()
    return CommandResult(
        output=bytes(sink),
        total_output_bytes=counter[0],
        exit_code=None if timed_out else process.returncode,
        timed_out=timed_out,
        seconds=time.monotonic() - start,
    )


class BackgroundCommand:
    """A command left running; its output accumulates until read with `take_new_output`."""

    def __init__(self, command: str, process: asyncio.subprocess.Process):
        self.command = command
        self.process = process
        self._buffer = bytearray()
        self._counter = [0]
        self._read_upto = 0
        self._reader = asyncio.ensure_future(_drain(process.stdout, self._buffer, self._counter))

    @classmethod
    async def start(cls, command: str, cwd: str, limits: SandboxLimits, uid: int | None) -> "BackgroundCommand":
        return cls(command, await start_command(command, cwd, limits, uid))

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    def take_new_output(self) -> bytes:
        """Output produced since the last call."""
        data = bytes(self._buffer[self._read_upto :])
        self._read_upto = len(self._buffer)
        return data

    async def kill(self) -> None:
        kill_process_group(self.process.pid)
        await self.process.wait()
        try:
            await asyncio.wait_for(self._reader, timeout=2.0)
        except asyncio.TimeoutError:
            self._reader.cancel()
