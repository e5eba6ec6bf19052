"""The jail's stage: the small program that builds a jail and starts the command in it.

Standard library only. The launcher (`cuda_agent.jail.jail_command`) runs this file as a script,
`python -I -S -B _stage.py`, with the plan in the environment variable PLAN_ENV (JSON; the
command line stays free of the command and its settings). Three processes:

  outer  the launcher's child, in the host pid namespace. Bound to its parent with
         PR_SET_PDEATHSIG(SIGKILL); unshares the mount, pid, network, IPC and UTS namespaces
         (and a user namespace when not root), forks `init`, forwards termination signals to
         it and exits the way the command exited (same code, or killed by the same signal).
  init   pid 1 of the new pid namespace. Builds the file-system view (a read-only tmpfs root
         holding read-only binds of the system, the binds of the plan, a private /tmp, a fresh
         /proc, a minimal /dev), pivots into it, brings up `lo`, forks `command`, then drops
         every privilege itself and reaps processes until `command` exits. When it exits, the
         kernel kills everything left in the namespace. It dies with `outer` (PDEATHSIG, armed
         again after its uid change, with a pipe to close the race).
  command  a new session; groups, gid and uid of the plan; no capability in any set (bounding
         set emptied, checked in /proc/self/status before exec); no_new_privs; rlimits; only
         the inherited fds the plan names; the seccomp filter below; then exec with the plan's
         environment and nothing else (or, where the stage runs in a process forked from one that
         has imported the command's program already, that program's entry function: run()).

Exit codes of the stage itself: SETUP_FAILED (125) when the jail could not be built (the reason
is on stderr, prefixed "jail: "), 126/127 when the command cannot be executed / is not found.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import struct

PLAN_ENV = "CUDA_AGENT_JAIL_PLAN"
SETUP_FAILED = 125

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
# Flags refused in clone(): every CLONE_NEW* that fits clone's flag word (CLONE_NEWTIME, 0x80,
# shares its bits with the exit signal there and exists only for clone3/unshare).
CLONE_NEW_MASK = CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
# statvfs f_flag bits -> mount flags a bind remount must keep (the kernel refuses to clear
# them on a mount that a user namespace inherited).
_KEPT_FLAGS = {1: MS_RDONLY, 2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: 1024, 2048: 2048}

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_CAPBSET_DROP = 1, 4, 22, 24
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
SECCOMP_MODE_FILTER = 2
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 1, 2, 4

# --- seccomp ------------------------------------------------------------------------------------
# Syscalls refused with EPERM, by name: (x86_64 number, aarch64 number). clone is refused only
# with a CLONE_NEW* flag; clone3 gets ENOSYS so libc falls back to clone, whose flags a classic
# BPF filter can read (clone3 passes them in memory it cannot).
REFUSED_SYSCALLS = {
    # namespaces
    "unshare": (272, 97),
    "setns": (308, 268),
    # the mount family, and chroot
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "open_tree_attr": (467, 467),
    # reading or writing other processes
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "kcmp": (312, 272),
    "pidfd_getfd": (438, 438),
    # kernel keyrings
    "add_key": (248, 217),
    "request_key": (249, 218),
    "keyctl": (250, 219),
    # BPF, perf, modules, kexec
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    # userfaultfd (a tool for winning kernel races), file handles, io_uring (its requests are not
    # seen by seccomp)
    "userfaultfd": (323, 282),
    "name_to_handle_at": (303, 264),
    "open_by_handle_at": (304, 265),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
}
# machine -> (AUDIT_ARCH_*, index in REFUSED_SYSCALLS tuples, clone, clone3, other numbers used here)
ARCHES = {
    "x86_64": {"audit": 0xC000003E, "column": 0, "clone": 56, "clone3": 435, "pivot_root": 155, "capset": 126, "mount_setattr": 442, "x32": True},
    "aarch64": {"audit": 0xC00000B7, "column": 1, "clone": 220, "clone3": 435, "pivot_root": 41, "capset": 91, "mount_setattr": 442, "x32": False},
}
ARCHES["arm64"] = ARCHES["aarch64"]

_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JGE_K, _BPF_JSET_K, _BPF_RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
SECCOMP_RET_KILL_PROCESS, SECCOMP_RET_ERRNO, SECCOMP_RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
EPERM, ENOSYS = 1, 38
_OFFSET_NR, _OFFSET_ARCH, _OFFSET_ARG0_LOW = 0, 4, 16  # struct seccomp_data, little endian


def seccomp_program(machine: str) -> list[tuple[int, int, int, int]]:
    """The classic BPF program (code, jt, jf, k) of the filter for `machine`; KeyError if unknown.

    A syscall of another architecture (for example 32-bit calls on x86_64, whose numbers differ)
    kills the process; x32 calls (numbers with bit 30) are refused.
    """
    arch = ARCHES[machine]
    deny = (_BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM)
    program = [
        (_BPF_LD_W_ABS, 0, 0, _OFFSET_ARCH),
        (_BPF_JEQ_K, 1, 0, arch["audit"]),
        (_BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
        (_BPF_LD_W_ABS, 0, 0, _OFFSET_NR),
    ]
    if arch["x32"]:
        program += [(_BPF_JGE_K, 0, 1, 0x40000000), deny]
    for numbers in REFUSED_SYSCALLS.values():
        program += [(_BPF_JEQ_K, 0, 1, numbers[arch["column"]]), deny]
    program += [
        (_BPF_JEQ_K, 0, 1, arch["clone3"]),
        (_BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | ENOSYS),
        (_BPF_JEQ_K, 0, 3, arch["clone"]),
        (_BPF_LD_W_ABS, 0, 0, _OFFSET_ARG0_LOW),
        (_BPF_JSET_K, 0, 1, CLONE_NEW_MASK),
        deny,
        (_BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ]
    return program


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


# --- small wrappers around libc -----------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    """The jail could not be built; the message goes to stderr after 'jail: '."""


def _check(result: int, what: str) -> int:
    if result == -1:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)}")
    return result


def _prctl(option: int, arg2: int = 0, arg3: int = 0, what: str = "prctl") -> int:
    return _check(_libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(arg3), ctypes.c_ulong(0), ctypes.c_ulong(0)), what)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
    result = _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
    _check(result, f"mount {source or fstype} on {target}")


def _syscall(number: int, *args, what: str) -> int:
    return _check(_libc.syscall(ctypes.c_long(number), *args), what)


def install_seccomp(machine: str) -> None:
    """no_new_privs, then the filter (the kernel requires one or CAP_SYS_ADMIN for the other)."""
    program = seccomp_program(machine)
    buffer = b"".join(struct.pack("=HBBI", *insn) for insn in program)
    array = ctypes.create_string_buffer(buffer, len(buffer))
    fprog = _SockFprog(len(program), ctypes.cast(array, ctypes.c_void_p))
    _prctl(PR_SET_NO_NEW_PRIVS, 1, what="no_new_privs")
    _check(_libc.prctl(ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog), ctypes.c_ulong(0), ctypes.c_ulong(0)), "seccomp filter")


# --- the file-system view -----------------------------------------------------------------------


def _kept_flags(path: str) -> int:
    present = os.statvfs(path).f_flag
    return sum(ms for bit, ms in _KEPT_FLAGS.items() if present & bit)


def _make_point(path: str, directory: bool) -> None:
    """Create `path` (and its parents) as a mount point inside the new root, never through a link."""
    parts = [p for p in path.split("/") if p]
    current = ""
    for index, part in enumerate(parts):
        current += "/" + part
        last = index == len(parts) - 1
        if os.path.islink(current):
            raise SetupError(f"mount target {path} crosses the symbolic link {current}")
        if os.path.lexists(current):
            continue
        if last and not directory:
            os.close(os.open(current, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        else:
            os.mkdir(current, 0o755)


def _read_only_recursive(target: str, keep: int, device: bool) -> None:
    """Make the bind at `target` and every mount under it read-only (mount_setattr when the kernel
    has it, else a remount of the top mount only)."""
    base = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | (0 if device else MS_NODEV)
    _mount(None, target, None, base | keep)
    arch = ARCHES.get(os.uname().machine)
    if arch is None:
        return
    attr = struct.pack("=QQQQ", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | (0 if device else MOUNT_ATTR_NODEV), 0, 0, 0)
    buf = ctypes.create_string_buffer(attr, len(attr))
    result = _libc.syscall(ctypes.c_long(arch["mount_setattr"]), ctypes.c_int(AT_FDCWD), os.fsencode(target), ctypes.c_uint(AT_RECURSIVE), buf, ctypes.c_size_t(len(attr)))
    if result == -1 and ctypes.get_errno() not in (38,):  # ENOSYS: an old kernel, top mount done above
        raise SetupError(f"read-only {target}: {os.strerror(ctypes.get_errno())}")


def _bind(source: str, target: str, writable: bool, device: bool = False) -> None:
    if not os.path.lexists(source):
        raise SetupError(f"bind source {source[len('/oldroot'):]} does not exist")
    _make_point(target, os.path.isdir(source))
    _mount(source, target, None, MS_BIND | MS_REC)
    keep = _kept_flags(source)
    if writable:
        _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_NOSUID | (0 if device else MS_NODEV) | keep)
    else:
        _read_only_recursive(target, keep, device)


def _write_file(path: str, text: str) -> None:
    _make_point(os.path.dirname(path), True)
    with open(path, "w") as handle:
        handle.write(text)
    os.chmod(path, 0o644)


def build_root(plan: dict) -> None:
    """The new root (runs in `init`, root in the new mount and pid namespaces)."""
    arch = ARCHES[os.uname().machine]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # A scratch root holding the old root at /oldroot: binds are taken from there, so their
    # sources are never hidden by the mounts made here (bubblewrap's method).
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0700")
    os.mkdir("/tmp/oldroot")
    os.mkdir("/tmp/newroot")
    os.chdir("/tmp")
    _syscall(arch["pivot_root"], b".", b"oldroot", what="pivot_root into the scratch root")
    os.chdir("/")
    _mount("tmpfs", "/newroot", "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0755")
    new = "/newroot"
    for entry in sorted(plan["mounts"], key=lambda e: (e["target"].count("/"), e["target"])):
        kind, target = entry["kind"], new + entry["target"]
        if kind == "bind":
            _bind("/oldroot" + entry["source"], target, entry.get("writable", False))
        elif kind == "symlink":
            _make_point(os.path.dirname(target), True)
            os.symlink(entry["source"], target)
        elif kind == "file":
            _write_file(target, entry["text"])
        elif kind == "tmpfs":
            _make_point(target, True)
            _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={entry['size']},mode={entry.get('mode', '1777')}")
        elif kind == "dev":
            _build_dev(target, entry)
        else:
            raise SetupError(f"unknown mount kind {kind!r}")
    _make_point(new + "/proc", True)
    _mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount(new + "/proc/sys", new + "/proc/sys", None, MS_BIND | MS_REC)
    _mount(None, new + "/proc/sys", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount(None, new, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(new)
    _syscall(arch["pivot_root"], b".", b".", what="pivot_root into the jail's root")
    _check(_libc.umount2(b".", ctypes.c_int(MNT_DETACH)), "detach the old root")
    os.chdir("/")


def _build_dev(target: str, entry: dict) -> None:
    _make_point(target, True)
    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
    for node in entry["nodes"]:  # each node's own mount stays writable (/dev/null is written to)
        _bind("/oldroot" + node, "/newroot" + node, writable=True, device=True)
    for name, link in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(link, f"{target}/{name}")
    _make_point(target + "/shm", True)
    _mount("tmpfs", target + "/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={entry['shm_size']},mode=1777")
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC)


def _ifup_loopback() -> None:
    """Bring `lo` up in the new network namespace (SIOCGIFFLAGS / SIOCSIFFLAGS)."""
    fd = _check(_libc.socket(2, 2, 0), "socket for lo")  # AF_INET, SOCK_DGRAM
    try:
        ifreq = ctypes.create_string_buffer(b"lo".ljust(16, b"\0") + b"\0" * 24, 40)
        _check(_libc.ioctl(fd, ctypes.c_ulong(0x8913), ifreq), "read the flags of lo")
        flags = struct.unpack_from("=H", ifreq, 16)[0] | 0x1  # IFF_UP
        struct.pack_into("=H", ifreq, 16, flags)
        _check(_libc.ioctl(fd, ctypes.c_ulong(0x8914), ifreq), "bring lo up")
    finally:
        os.close(fd)


# --- privileges ---------------------------------------------------------------------------------


def drop_privileges(plan: dict) -> None:
    """Groups, gid, uid of the plan; every capability set emptied; checked before returning."""
    arch = ARCHES.get(os.uname().machine)
    with open("/proc/sys/kernel/cap_last_cap") as handle:
        last = int(handle.read())
    for cap in range(last + 1):
        _prctl(PR_CAPBSET_DROP, cap, what=f"drop capability {cap} from the bounding set")
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, what="clear the ambient capabilities")
    uid, gid = plan["uid"], plan["gid"]
    if not plan["user_namespace"]:
        os.setgroups(list(plan["groups"]))
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    if arch is None:
        raise SetupError(f"unknown architecture {os.uname().machine}")
    header = struct.pack("=Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = ctypes.create_string_buffer(24)  # two {effective, permitted, inheritable}, all zero
    _syscall(arch["capset"], ctypes.create_string_buffer(header, 8), data, what="clear the capability sets")
    _prctl(PR_SET_DUMPABLE, 0, what="non-dumpable")
    with open("/proc/self/status") as handle:
        status = dict(line.split(":", 1) for line in handle.read().splitlines() if ":" in line)
    for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        if int(status.get(name, "1").strip(), 16) != 0:
            raise SetupError(f"{name} is not empty after dropping privileges")
    if not plan["user_namespace"] and (os.getresuid() != (uid,) * 3 or os.getresgid() != (gid,) * 3):
        raise SetupError("uid/gid change did not take")


def _apply_limits(limits: dict) -> None:
    for name, value in limits.items():
        if value is not None:
            resource.setrlimit(getattr(resource, name), (value, value))


def _arm_parent_death(alive_fd: int | None) -> None:
    """SIGKILL when the parent dies; `alive_fd` is a pipe the parent holds open: if it already
    reads end-of-file, the parent died before the signal was armed."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, what="parent-death signal")
    if alive_fd is not None:
        os.set_blocking(alive_fd, False)
        try:
            if os.read(alive_fd, 1) == b"":
                os._exit(SETUP_FAILED)
        except BlockingIOError:
            pass


def _run_command(plan: dict, exec_fd: int, then=None) -> None:
    """In `command`: never returns. `exec_fd` is a close-on-exec pipe whose closing tells init
    that this process has dropped its privileges (or ended). `then(plan)`, where given, runs in
    place of the exec once every layer is in place (see run())."""
    try:
        _release_signals()
        os.setsid()
        if plan["drop"]:
            drop_privileges(plan)
        os.chdir(plan["cwd"])
        _apply_limits(plan["limits"])
        keep = sorted({0, 1, 2, exec_fd, *plan["pass_fds"]})
        previous = -1
        for fd in keep + [2**31 - 1]:
            if fd > previous + 1:
                os.closerange(previous + 1, fd)
            previous = fd
        for fd in plan["pass_fds"]:
            os.set_inheritable(fd, True)
        if plan["seccomp"]:
            install_seccomp(os.uname().machine)
        else:
            _prctl(PR_SET_NO_NEW_PRIVS, 1, what="no_new_privs")
    except (SetupError, OSError) as error:
        _fail(f"jail: {error}", SETUP_FAILED)
    if then is None:
        _exec(plan["argv"], plan["env"])
    os.close(exec_fd)  # what the exec would have closed: init learns that the drop is done
    try:
        then(plan)
    finally:
        os._exit(1)  # `then` ends the process itself; this is for one that returns or raises


def _exec(argv: list[str], env: dict) -> None:
    """execvpe without the lazy imports of os.execvpe (the stage's own Python library is not in
    the jail's view by now): try each PATH entry, report the most telling error."""
    name = argv[0]
    candidates = [name] if "/" in name else [os.path.join(d or ".", name) for d in env.get("PATH", "").split(":")]
    found_error = None
    for candidate in candidates:
        try:
            os.execve(candidate, argv, env)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as error:
            found_error = found_error or error
        except BaseException as error:  # never a traceback from the stage
            _fail(f"jail: {name}: {error}", 126)
    if found_error is None:
        _fail(f"jail: {name}: command not found", 127)
    _fail(f"jail: {name}: {found_error.strerror}", 126)


def _fail(message: str, code: int) -> None:
    try:
        os.write(2, (message + "\n").encode(errors="replace"))
    finally:
        os._exit(code)


_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_WAITED = (*_FORWARDED, signal.SIGCHLD)
_launch_mask: set = set()  # the signal mask the stage was started with; the command gets it back


def _hold_signals() -> None:
    """Block the forwarded signals and SIGCHLD for good: the stage and init take them with
    `_supervise`, synchronously. (A Python-level handler is not enough: a signal caught just
    before a blocking waitpid leaves its handler pending until the child exits, and pid 1 of a
    pid namespace drops a signal it has no handler for.)"""
    global _launch_mask
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # an inherited SIG_IGN would reap the children
    _launch_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _WAITED)


def _release_signals() -> None:
    """In the command, before exec: the launch mask back (a held signal arrives now)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, _launch_mask - set(_WAITED))


def _supervise(pid: int) -> int:
    """Forward the termination signals to `pid` and reap every child until `pid` ends; its
    wait status. Raises ChildProcessError if there is no child left to wait for."""
    while True:
        signum = signal.sigwaitinfo(_WAITED).si_signo
        if signum != signal.SIGCHLD:
            try:
                os.kill(pid, signum)
            except (ProcessLookupError, PermissionError):
                pass
            continue
        while True:  # one SIGCHLD may stand for several children
            done, status = os.waitpid(-1, os.WNOHANG)
            if done == pid:
                return status
            if done == 0:
                break


def _init(plan: dict, alive_fd: int, report_fd: int, then=None) -> None:
    """pid 1 of the jail (or the supervisor without namespaces): never returns."""

    def report(message: dict, code: int) -> None:
        os.write(report_fd, json.dumps(message).encode())
        os._exit(code)

    try:
        if plan["die_with_parent"] or plan["namespaces"]:
            _arm_parent_death(alive_fd)
        if plan["namespaces"]:
            build_root(plan)
            _check(_libc.sethostname(plan["hostname"].encode(), ctypes.c_size_t(len(plan["hostname"]))), "set the host name")
            if not plan["share_network"]:
                _ifup_loopback()
    except (SetupError, OSError) as error:
        report({"error": str(error)}, SETUP_FAILED)
    exec_read, exec_write = os.pipe()  # close-on-exec: it closes when the command execs
    pid = os.fork()
    if pid == 0:
        os.close(report_fd)
        os.close(exec_read)
        _run_command(plan, exec_write, then)
    os.close(exec_write)
    # The init keeps no privilege either, but drops it only once the command has (a signal it
    # forwards from a lower uid to a command still at a higher one would be refused); its
    # parent-death signal is cleared by the uid change, so it is armed again (and the pipe
    # closes the race). A signal that arrives meanwhile is held and forwarded after.
    try:
        _wait_until_closed(exec_read)
        if plan["drop"]:
            drop_privileges(plan)
            _arm_parent_death(alive_fd)
        if plan["seccomp"]:
            install_seccomp(os.uname().machine)
    except (SetupError, OSError) as error:
        os.kill(pid, signal.SIGKILL)
        report({"error": f"init: {error}"}, SETUP_FAILED)
    try:
        status = _supervise(pid)
    except ChildProcessError:
        report({"error": "init: the command vanished"}, SETUP_FAILED)
    if os.WIFSIGNALED(status):
        report({"signal": os.WTERMSIG(status)}, 128 + os.WTERMSIG(status))
    report({"exit": os.WEXITSTATUS(status)}, os.WEXITSTATUS(status))


def _wait_until_closed(fd: int) -> None:
    while os.read(fd, 1):
        pass
    os.close(fd)


def _user_namespace_maps(uid: int, gid: int) -> None:
    with open("/proc/self/setgroups", "w") as handle:
        handle.write("deny")
    with open("/proc/self/uid_map", "w") as handle:
        handle.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as handle:
        handle.write(f"{gid} {gid} 1")


def main() -> None:
    run(json.loads(os.environ.pop(PLAN_ENV)))


def run(plan: dict, then=None) -> None:
    """Be `outer` for `plan`: never returns. Without `then`, the command execs plan["argv"]; with it,
    the command calls `then(plan)` instead, in this program's memory (a process forked from one that
    imported what the command needs: evaluator_cuda/roles/forkserver.py). The caller must be a fresh
    fork that holds no descriptor the command may not see beyond plan["pass_fds"] and 0-2 (the
    command closes the rest too), and `then` must end the process (os._exit)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the stage mirrors a crash; no core file of it
    try:
        if plan["die_with_parent"]:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, what="parent-death signal")
            if os.getppid() != plan["parent_pid"]:
                _fail("jail: the launcher exited before the jail started", SETUP_FAILED)
        for procs in plan.get("cgroup_procs", ()):  # before any fork: all of the jail is counted there
            with open(procs, "w") as handle:
                handle.write(str(os.getpid()))
        if plan["seccomp"] and os.uname().machine not in ARCHES:
            raise SetupError(f"no seccomp syscall table for {os.uname().machine}: refusing to run unfiltered")
        if plan["namespaces"]:
            flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
            flags |= 0 if plan["share_network"] else CLONE_NEWNET
            flags |= CLONE_NEWUSER if plan["user_namespace"] else 0
            _check(_libc.unshare(ctypes.c_int(flags)), "unshare")
            if plan["user_namespace"]:
                _user_namespace_maps(plan["uid"], plan["gid"])
    except (SetupError, OSError) as error:
        _fail(f"jail: {error}", SETUP_FAILED)
    alive_read, alive_write = os.pipe()
    report_read, report_write = os.pipe()
    _hold_signals()  # inherited by init, which keeps them held until it forwards them
    pid = os.fork()
    if pid == 0:
        os.close(alive_write)
        os.close(report_read)
        _init(plan, alive_read, report_write, then)
    os.close(alive_read)
    os.close(report_write)
    try:
        status = _supervise(pid)
    except ChildProcessError:
        _fail("jail: init vanished", SETUP_FAILED)
    message = b""
    while chunk := os.read(report_read, 65536):
        message += chunk
    try:
        outcome = json.loads(message or b"{}")
    except ValueError:
        outcome = {}
    if "error" in outcome:
        _fail(f"jail: {outcome['error']}", SETUP_FAILED)
    if "signal" in outcome:
        _die_by(outcome["signal"])
    if "exit" in outcome:
        os._exit(outcome["exit"])
    # init itself was killed (SIGKILL from outside): report it the same way.
    if os.WIFSIGNALED(status):
        _die_by(os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else SETUP_FAILED)


def _die_by(signum: int) -> None:
    """End this process by `signum` (SIGKILL and SIGSTOP take no handler, so theirs is not reset)."""
    if signum not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)


if __name__ == "__main__":
    main()
