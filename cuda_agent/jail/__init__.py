"""A jail for untrusted commands: its own namespaces, an unprivileged uid, no capabilities, a
seccomp filter, a file-system view of read-only system directories plus the folders it is given,
a fixed environment and resource limits. Standard library only.

    spec = JailSpec(binds=(Bind(job_dir, writable=True), *python_binds()), uid=slot_uid,
                    limits=Limits(cpu_seconds=60, file_size_bytes=1 << 30))
    command = jail_command(spec, ["python3", "-c", "print(1)"])
    subprocess.Popen(command.argv, env=command.env, pass_fds=command.pass_fds, ...)
    command.protections        # what applied, and what is missing on this machine

The command runs under `python -I -S -B _stage.py` (see _stage.py for the three processes and
what each does). Its exit is mirrored: the same exit code, or killed by the same signal; 125
means the jail could not be built (reason on stderr, "jail: ...").

Layers, and what each stops:
- mount namespace + pivot_root into a tmpfs root: the command sees /usr (and the /bin, /lib...
  links), a few /etc files, the binds of the spec, a private /tmp, a fresh /proc and a minimal
  /dev; never /root, /home, caches, harness source, journals or other jobs' folders. System
  binds are read-only, nosuid, nodev (recursively, with mount_setattr where the kernel has it).
- pid namespace: it sees only its own processes (no other process's command line or
  environment), and everything it starts dies when the command exits (the namespace's init
  exits, the kernel kills the rest), or when the launcher dies (parent-death signals).
- network namespace: only `lo`, up, and nothing behind it. IPC and UTS namespaces: no shared
  System V memory or message queues with the host, its own host name.
- uid/gid of the spec (never 0), no supplementary groups, every capability set empty (the
  bounding set too), no_new_privs: set-uid binaries do nothing, files are checked as that uid.
- seccomp (classic BPF, x86_64 and aarch64 tables; an unknown architecture is refused, never run
  unfiltered): no namespaces (unshare, setns, clone with CLONE_NEW*; clone3 gets ENOSYS so libc
  falls back to clone), no mounts, no ptrace or process_vm_*, no keyrings, no bpf or
  perf_event_open, no module loading or kexec, no userfaultfd, no file handles, no io_uring.
- rlimits (address space, data, processes, file size, open files, CPU seconds; core files off).
- environment: PATH, HOME=/tmp, LANG and the spec's variables; nothing from the launcher.

No user namespace is made when the launcher is root: the command gets a real unprivileged uid of
the host and holds no capability in any namespace, whereas a user namespace would give the
stage (and, if the drop failed, the command) full capabilities inside it, and user namespaces
are where most recent kernel privilege escalations start. Without root a user namespace is the
only way to get the others: then the command keeps the launcher's uid (recorded as such).

Bubblewrap or nsjail would do this with less code of ours, but neither is installed on the
machines we run on (no package network there); util-linux's `unshare` can make namespaces but
has no seccomp, pivot_root or capability-bounding step, so the stage does it all with libc.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from cuda_agent.jail import _stage
from cuda_agent.jail._stage import ARCHES, PLAN_ENV, REFUSED_SYSCALLS, SETUP_FAILED, seccomp_program

STAGE_PATH = str(Path(_stage.__file__).resolve())
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# /etc entries the dynamic loader, compilers and Python need; passwd, group, hosts, hostname and
# nsswitch.conf are written fresh (only root, the jail's uid and nobody).
DEFAULT_ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "python3*")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BASE_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
NOBODY = 65534
MiB = 1024 * 1024

__all__ = [
    "Bind", "SYSTEM_DIRS", "Limits", "JailSpec", "JailCommand", "JailError", "JailUnavailable", "jail_command", "protections",
    "probe", "python_binds", "gpu_devices", "nvidia_library_binds", "seccomp_program", "REFUSED_SYSCALLS", "SETUP_FAILED",
]


class JailError(ValueError):
    """The spec cannot be honoured (a missing bind source, a target inside /proc, uid 0...)."""


class JailUnavailable(RuntimeError):
    """`require=True` and this machine cannot build the whole jail."""


@dataclass(frozen=True)
class Bind:
    """A host path shown in the jail at `target` (default: the same path)."""

    source: str
    target: str | None = None
    writable: bool = False


@dataclass(frozen=True)
class Limits:
    """rlimits of the command (soft = hard); None leaves the launcher's. Core files are always off."""

    address_space_bytes: int | None = None
    data_bytes: int | None = None
    processes: int | None = None  # RLIMIT_NPROC: counts every process of the uid on the host
    file_size_bytes: int | None = None
    open_files: int | None = None
    cpu_seconds: int | None = None


@dataclass(frozen=True)
class JailSpec:
    # Resolved when the command is built, mounted a few ms later: never bind a path whose folders
    # the jailed code (or another job) can change.
    binds: tuple[Bind, ...] = ()
    uid: int = NOBODY  # prefer a uid per slot: RLIMIT_NPROC and file ownership are per uid
    gid: int | None = None  # default: uid
    groups: tuple[int, ...] = ()  # supplementary groups (e.g. a GPU device group)
    cwd: str | None = None  # default: the first writable bind, else /tmp
    env: Mapping[str, str] = field(default_factory=dict)  # added to PATH, HOME=/tmp, LANG
    path: str = DEFAULT_PATH
    limits: Limits = Limits()
    devices: tuple[str, ...] = ()  # extra /dev nodes or folders (gpu_devices())
    system_dirs: tuple[str, ...] = SYSTEM_DIRS
    etc: tuple[str, ...] = DEFAULT_ETC
    tmp_bytes: int = 256 * MiB
    shm_bytes: int = 64 * MiB
    share_network: bool = False
    hostname: str = "jail"
    pass_fds: tuple[int, ...] = ()  # inherited fds the command keeps (also pass them to Popen)
    # SIGKILL the jail when the launching *thread* exits (Linux parent-death signals follow the
    # thread that forked): start jails from a thread that outlives them, or set False. The
    # process that calls jail_command must be the one that starts it.
    die_with_parent: bool = True
    seccomp: bool = True
    require: bool = False  # raise JailUnavailable instead of running with layers missing
    # cgroup.procs files the stage moves itself into before anything else (cgroup.create_cgroup), so
    # everything in the jail is counted against that group's limits
    cgroup_procs: tuple[str, ...] = ()


@dataclass(frozen=True)
class JailCommand:
    """What to start: `subprocess.Popen(argv, env=env, pass_fds=pass_fds)` (env is the stage's
    own; the command gets the spec's fixed environment). `plan` is what the stage follows (in env as
    JSON), for a process that runs the stage itself after a fork (_stage.run)."""

    argv: list[str]
    env: dict[str, str]
    pass_fds: tuple[int, ...]
    protections: dict
    plan: dict = field(default_factory=dict)


# --- the machine ----------------------------------------------------------------------------------


def this_python() -> str:
    """The running interpreter's path without `..` parts: a jail shows only the folders it binds, so a
    path through another one (`scripts/../.venv/bin/python`) would not resolve inside it."""
    return os.path.normpath(sys.executable)


def _stage_env(plan: dict) -> dict[str, str]:
    return {PLAN_ENV: json.dumps(plan), "PATH": "/usr/bin:/bin"}


def _stage_argv(python: str) -> list[str]:
    return [python, "-I", "-S", "-B", STAGE_PATH]


@functools.lru_cache(maxsize=None)
def probe(python: str | None = None) -> dict:
    """What this machine can do, found once per process by building a jail that runs `true`.

    {"root", "namespaces", "user_namespace", "seccomp", "reason"}: namespaces False with the
    reason when the full jail could not be built.
    """
    python = python or this_python()
    root = os.geteuid() == 0
    machine = os.uname().machine
    result = {"root": root, "namespaces": False, "user_namespace": not root, "seccomp": machine in ARCHES, "machine": machine, "reason": None}
    if not result["seccomp"]:
        result["reason"] = f"no seccomp syscall table for {machine}"
        return result
    plan = _plan(JailSpec(die_with_parent=False), ["true"], namespaces=True, user_namespace=not root, drop=True)
    try:
        done = subprocess.run(_stage_argv(python), env=_stage_env(plan), capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        result["reason"] = f"the jail's stage did not run: {error}"
        return result
    if done.returncode == 0:
        result["namespaces"] = True
    else:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        result["reason"] = lines[-1] if lines else f"the jail's stage exited with status {done.returncode}"
    return result


# --- the plan the stage follows -------------------------------------------------------------------


def _norm(path: str) -> str:
    return os.path.normpath(os.path.join("/", path))


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _mounts(spec: JailSpec, uid: int, gid: int) -> tuple[list[dict], dict]:
    """The mount entries of the plan, and a summary of the view for the protections record."""
    mounts: list[dict] = []
    read_only: list[str] = []
    writable: list[str] = []
    real_system: list[str] = []
    shown: list[str] = []  # system folders and links shown at their own path
    for directory in spec.system_dirs:
        if os.path.islink(directory):
            mounts.append({"kind": "symlink", "source": os.readlink(directory), "target": directory})
            shown.append(directory)
        elif os.path.isdir(directory):
            shown.append(directory)
            mounts.append({"kind": "bind", "source": os.path.realpath(directory), "target": directory})
            real_system.append(directory)
            read_only.append(directory)
    for pattern in spec.etc:
        for path in sorted(glob.glob(os.path.join("/etc", pattern))):
            if os.path.islink(path):
                mounts.append({"kind": "symlink", "source": os.readlink(path), "target": path})
            else:
                mounts.append({"kind": "bind", "source": os.path.realpath(path), "target": path})
            read_only.append(path)
    users = {0: ("root", 0)}
    users.setdefault(uid, ("sandbox", gid))
    users.setdefault(NOBODY, ("nobody", NOBODY))
    groups = {0: "root"}
    groups.setdefault(gid, "sandbox")
    groups.setdefault(NOBODY, "nogroup")
    etc_files = {
        "/etc/passwd": "".join(f"{name}:x:{u}:{g}:{name}:/tmp:/bin/sh\n" for u, (name, g) in users.items()),
        "/etc/group": "".join(f"{name}:x:{g}:\n" for g, name in groups.items()),
        "/etc/hostname": spec.hostname + "\n",
        "/etc/hosts": f"127.0.0.1 localhost {spec.hostname}\n::1 localhost\n",
        "/etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
    }
    mounts += [{"kind": "file", "target": path, "text": text} for path, text in etc_files.items()]
    mounts.append({"kind": "tmpfs", "target": "/tmp", "size": spec.tmp_bytes, "mode": "1777"})
    devices = [d for d in BASE_DEVICES if os.path.exists(d)]
    for device in spec.devices:
        device = _norm(device)
        if not device.startswith("/dev/") or not os.path.exists(device):
            raise JailError(f"device {device} does not exist or is not under /dev")
        devices.append(device)
    mounts.append({"kind": "dev", "target": "/dev", "nodes": devices, "shm_size": spec.shm_bytes})
    for bind in spec.binds:
        source = _norm(os.path.abspath(bind.source))
        target = _norm(bind.target or source)
        if not os.path.exists(source):
            raise JailError(f"bind source {source} does not exist")
        if any(_under(target, reserved) for reserved in ("/proc", "/dev")) or target == "/":
            raise JailError(f"bind target {target} is reserved")
        real = os.path.realpath(source)
        if not bind.writable and target == source and any(_under(source, d) for d in shown) and any(_under(real, d) for d in real_system):
            continue  # already visible, read-only, through a system folder (and its links) at the same path
        mounts.append({"kind": "bind", "source": real, "target": target, "writable": bind.writable})
        (writable if bind.writable else read_only).append(target)
    view = {
        "root": "tmpfs, read-only",
        "read_only": read_only,
        "writable": writable,
        "tmp": f"private tmpfs of {spec.tmp_bytes // MiB} MiB",
        "dev": devices + [f"shm (tmpfs of {spec.shm_bytes // MiB} MiB)"],
        "proc": "its own pid namespace's (/proc/sys read-only)",
    }
    return mounts, view


_LIMIT_NAMES = {
    "address_space_bytes": "RLIMIT_AS",
    "data_bytes": "RLIMIT_DATA",
    "processes": "RLIMIT_NPROC",
    "file_size_bytes": "RLIMIT_FSIZE",
    "open_files": "RLIMIT_NOFILE",
    "cpu_seconds": "RLIMIT_CPU",
}


def _environment(spec: JailSpec) -> dict[str, str]:
    env = {"PATH": spec.path, "HOME": "/tmp", "LANG": "C.UTF-8"}
    env.update({str(k): str(v) for k, v in spec.env.items()})
    return env


def _plan(spec: JailSpec, argv: Sequence[str], *, namespaces: bool, user_namespace: bool, drop: bool) -> dict:
    if not argv:
        raise JailError("empty command")
    if spec.uid == 0 or spec.gid == 0 or 0 in spec.groups:
        raise JailError("the jail's uid, gid and groups must not be 0")
    uid, gid = (os.getuid(), os.getgid()) if user_namespace else (spec.uid, spec.gid if spec.gid is not None else spec.uid)
    mounts, _ = _mounts(spec, uid, gid) if namespaces else ([], None)
    limits = {_LIMIT_NAMES[name]: value for name, value in vars(spec.limits).items() if value is not None}
    limits["RLIMIT_CORE"] = 0
    writable = [b.target or b.source for b in spec.binds if b.writable]
    cwd = _norm(os.path.abspath(spec.cwd or (writable[0] if writable else "/tmp")))
    return {
        "argv": list(argv),
        "env": _environment(spec),
        "cwd": cwd,
        "uid": uid,
        "gid": gid,
        "groups": list(spec.groups),
        "limits": limits,
        "mounts": mounts,
        "namespaces": namespaces,
        "user_namespace": user_namespace and namespaces,
        "drop": drop,
        "share_network": spec.share_network,
        "hostname": spec.hostname,
        "pass_fds": list(spec.pass_fds),
        "die_with_parent": spec.die_with_parent,
        "parent_pid": os.getpid(),
        "seccomp": spec.seccomp,
        "cgroup_procs": list(spec.cgroup_procs),
    }


def _layers(spec: JailSpec, python: str | None) -> tuple[dict, list[str]]:
    machine = probe(python)
    missing = []
    if not machine["namespaces"]:
        missing.append(f"namespaces and file-system view ({machine['reason']})")
    if not machine["root"]:
        missing.append("own uid (the launcher is not root: the command keeps the launcher's uid)")
    if spec.seccomp and not machine["seccomp"]:
        raise JailUnavailable(f"seccomp: {machine['reason']}; refusing to run unfiltered (seccomp=False to opt out)")
    if not spec.seccomp:
        missing.append("seccomp (disabled by the spec)")
    return machine, missing


def protections(spec: JailSpec, python: str | None = None) -> dict:
    """What a command started with `spec` gets on this machine, and what is missing."""
    machine, missing = _layers(spec, python)
    full = machine["namespaces"]
    uid, gid = (spec.uid, spec.gid if spec.gid is not None else spec.uid) if machine["root"] else (os.getuid(), os.getgid())
    _, view = _mounts(spec, uid, gid) if full else ([], None)
    namespaces = ["mount", "pid", "ipc", "uts"] + ([] if spec.share_network else ["network"])
    if full and not machine["root"]:
        namespaces.append("user")
    arch = machine["machine"]
    record = {
        "jail": "complete" if not missing else "degraded",
        "missing": missing,
        "namespaces": namespaces if full else [],
        "uid": uid,
        "gid": gid,
        "groups": list(spec.groups) if machine["root"] else None,
        "capabilities": "none (every set empty, bounding set dropped)" if (machine["root"] or full) else "the launcher's",
        "no_new_privs": True,
        "seccomp": (f"{arch}: {len(REFUSED_SYSCALLS)} syscalls refused (EPERM), clone with CLONE_NEW* refused, clone3 ENOSYS, other architectures killed") if spec.seccomp else None,
        "filesystem": view if full else "the host's (no mount namespace)",
        "network": ("shared with the host" if spec.share_network else "none: own namespace, lo only") if full else "the host's (no network namespace)",
        "processes": "own pid namespace; all killed when the command exits" if full else "the host's (no pid namespace)",
        "die_with_parent": spec.die_with_parent,
        "rlimits": {k: v for k, v in vars(spec.limits).items() if v is not None} | {"core_bytes": 0},
        "env": sorted(_environment(spec)),
    }
    return record


def jail_command(spec: JailSpec, argv: Sequence[str], *, python: str | None = None) -> JailCommand:
    """The process to start for `argv` in a jail made from `spec` (see the module docstring).

    Raises JailUnavailable when spec.require and a layer is missing, JailError for a bad spec.
    """
    python = python or this_python()
    for path in spec.cgroup_procs:
        if not (_under(_norm(path), "/sys/fs/cgroup") and os.path.basename(path) == "cgroup.procs"):
            raise JailError(f"not a cgroup.procs file under /sys/fs/cgroup: {path}")
    machine, missing = _layers(spec, python)
    if spec.require and missing:
        raise JailUnavailable("the jail cannot be built here: " + "; ".join(missing))
    record = protections(spec, python)
    plan = _plan(spec, argv, namespaces=machine["namespaces"], user_namespace=not machine["root"], drop=machine["root"] or machine["namespaces"])
    return JailCommand(argv=_stage_argv(python), env=_stage_env(plan), pass_fds=tuple(spec.pass_fds), protections=record,
                       plan=plan)


# --- helpers for specs ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def python_binds(executable: str | None = None) -> tuple[Bind, ...]:
    """Read-only binds that make the Python installation of `executable` (default: this one)
    usable in a jail: its prefixes (a virtual environment and the base installation) and its
    site-packages. Folders other .pth files point at (an editable checkout) are not included."""
    if executable is None or os.path.realpath(executable) == os.path.realpath(sys.executable):
        import site

        paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *site.getsitepackages()]
    else:
        code = "import json, site, sys; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *site.getsitepackages()]))"
        done = subprocess.run([executable, "-I", "-c", code], capture_output=True, text=True, timeout=60, check=True)
        paths = json.loads(done.stdout)
    paths.append(os.path.dirname(os.path.dirname(os.path.realpath(executable or sys.executable))))
    chosen: list[str] = []
    for path in sorted({os.path.abspath(p) for p in paths if os.path.isdir(p)}, key=len):
        if not any(_under(path, kept) for kept in chosen):
            chosen.append(path)
    return tuple(Bind(path) for path in chosen)


def gpu_devices() -> tuple[str, ...]:
    """The NVIDIA device nodes of this machine (/dev/nvidia*, /dev/nvidiactl, /dev/nvidia-uvm*,
    /dev/nvidia-caps), empty without a GPU."""
    return tuple(sorted(glob.glob("/dev/nvidia*")))


@functools.lru_cache(maxsize=None)
def nvidia_library_binds() -> tuple[Bind, ...]:
    """Read-only binds of the folders holding the NVIDIA driver libraries (found with
    `ldconfig -p`), for those outside the system directories."""
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ()
    folders = set()
    for line in listing.splitlines():
        name, _, path = line.partition("=>")
        if name.strip().startswith(("libcuda.so", "libnvidia-")) and path.strip():
            folders.add(os.path.dirname(os.path.realpath(path.strip())))
            folders.add(os.path.dirname(path.strip()))
    return tuple(Bind(folder) for folder in sorted(folders) if os.path.isdir(folder))
