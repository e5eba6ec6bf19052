"""Commands of the agent run in a child process the agent loop controls.

Every command gets: its own session and process group (killed as a whole at its timeout),
resource limits (CPU time, address space, processes, file size, no core files), no network
(`unshare -n`, when the OS allows it), and, when the agent runs as root, an unprivileged uid
of its own (so it cannot write the harness files, other workspaces or the host).
`sandbox_report()` says which of these the current machine gives.
"""

from __future__ import annotations

import asyncio
import functools
import os
import resource
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

from agent.config import SandboxLimits

# Cap on bytes kept from one command's output in memory (the tool truncates further).
OUTPUT_MEMORY_CAP_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class CommandResult:
    """What a finished (or killed) command left: merged stdout+stderr and how it ended."""

    output: bytes
    total_output_bytes: int
    exit_code: int | None
    timed_out: bool
    seconds: float


@functools.lru_cache(maxsize=None)
def _network_isolation_prefix() -> tuple[str, ...] | None:
    """`unshare` arguments that drop the network on this machine, or None if impossible."""
    if shutil.which("unshare") is None:
        return None
    candidates = [("unshare", "-n")] if os.geteuid() == 0 else [("unshare", "-rn")]
    for prefix in candidates:
        try:
            probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return prefix
    return None


def can_switch_uid() -> bool:
    """Whether commands can run as an unprivileged uid of their own (needs root)."""
    return os.geteuid() == 0 and shutil.which("unshare") is not None


def sandbox_report(limits: SandboxLimits | None = None) -> dict[str, bool]:
    """Which isolation features this machine gives commands (for logs and the transcript)."""
    limits = limits or SandboxLimits()
    return {
        "process_group_kill": True,
        "resource_limits": True,
        "no_network": bool(limits.no_network and _network_isolation_prefix() is not None),
        "own_uid": can_switch_uid(),
    }


def sandbox_argv(command: str, limits: SandboxLimits, uid: int | None) -> list[str]:
    """The argv that runs `command` with bash under the isolation this machine allows."""
    argv: list[str] = []
    net = _network_isolation_prefix() if limits.no_network else None
    if uid is not None and can_switch_uid():
        # `unshare` enters a namespace (network if asked) and drops to the sandbox uid/gid.
        argv = ["unshare", *(["-n"] if net else []), "-S", str(uid), "-G", str(uid), "--"]
    elif net:
        argv = [*net, "--"]
    return [*argv, "bash", "--noprofile", "--norc", "-c", command]


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
    # RLIMIT_NPROC counts every process of the uid: for a shared uid, leave room for the ones
    # that already exist.
    return limits.max_processes if switching_uid else limits.max_processes + _count_processes_of(os.getuid())


def _limit_pairs(limits: SandboxLimits, switching_uid: bool) -> list[tuple[int, str, int]]:
    """(resource, prlimit option, value) of every limit a command gets."""
    return [
        (resource.RLIMIT_CPU, "--cpu", limits.cpu_seconds),
        (resource.RLIMIT_AS, "--as", limits.memory_bytes),
        (resource.RLIMIT_FSIZE, "--fsize", limits.max_file_bytes),
        (resource.RLIMIT_CORE, "--core", 0),
        (resource.RLIMIT_NPROC, "--nproc", _process_limit(limits, switching_uid)),
    ]


def limits_prefix(limits: SandboxLimits, switching_uid: bool) -> list[str] | None:
    """`prlimit` arguments applying the limits, or None when prlimit is missing.

    prlimit (util-linux) sets the limits and execs the command, so no Python runs between fork
    and exec (a preexec function can deadlock in a multithreaded process such as a JAX sampler's).
    """
    if shutil.which("prlimit") is None:
        return None
    return ["prlimit", *(f"{option}={value}:{value}" for _, option, value in _limit_pairs(limits, switching_uid)), "--"]


def _limit_setter(limits: SandboxLimits, switching_uid: bool):
    """Fallback without prlimit: a preexec function applying the limits in the child before exec."""
    pairs = _limit_pairs(limits, switching_uid)  # computed in the parent, not between fork and exec

    def apply() -> None:
        for which, _, value in pairs:
            resource.setrlimit(which, (value, value))

    return apply


def sandbox_env(workspace: str) -> dict[str, str]:
    """A small environment: the workspace as HOME and TMPDIR, the host's PATH, no secrets."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": workspace,
        "TMPDIR": workspace,
        "LANG": "C.UTF-8",
        "TERM": "dumb",
    }
    for name in ("CUDA_HOME", "CUDA_PATH", "TORCH_CUDA_ARCH_LIST"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


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


def kill_processes_of_uid(uid: int) -> int:
    """SIGKILL every process owned by `uid` (a sandbox uid: its own commands only); returns count."""
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


async def start_command(command: str, cwd: str, limits: SandboxLimits, uid: int | None) -> asyncio.subprocess.Process:
    """Start `command` in the sandbox; stdout and stderr merged into one pipe."""
    switching = uid is not None and can_switch_uid()
    prefix = limits_prefix(limits, switching)
    return await asyncio.create_subprocess_exec(
        *(prefix or []),
        *sandbox_argv(command, limits, uid),
        cwd=cwd,
        env=sandbox_env(cwd),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=None if prefix else _limit_setter(limits, switching),
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
