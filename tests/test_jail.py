"""The jail (cuda_agent/jail): each test is an attack that must fail inside, with a control that
shows it works outside where that makes sense. Runs wherever the machine can build namespaces
(CI and the GPU machine run as root); skipped with the reason elsewhere."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from cuda_agent import jail
from cuda_agent.jail import Bind, JailError, JailSpec, JailUnavailable, Limits, jail_command, probe, python_binds, seccomp_program

MACHINE = probe()
pytestmark = pytest.mark.skipif(not MACHINE["namespaces"], reason=f"this machine cannot build the jail: {MACHINE['reason']}")
ROOT = os.geteuid() == 0
UID = 3_100_000 + os.getpid() % 10_000  # a uid of this test run (RLIMIT_NPROC is per uid)


@pytest.fixture
def workdir():
    path = Path(tempfile.mkdtemp(prefix="jail-test-"))
    if ROOT:
        os.chown(path, UID, UID)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def spec_for(workdir: Path | None = None, **changes) -> JailSpec:
    binds = ((Bind(str(workdir), writable=True),) if workdir else ()) + python_binds()
    return JailSpec(**{"binds": binds, "uid": UID, **changes})


def run(spec: JailSpec, argv: list[str], timeout: float = 30, **kwargs) -> subprocess.CompletedProcess:
    command = jail_command(spec, argv)
    return subprocess.run(command.argv, env=command.env, pass_fds=command.pass_fds, capture_output=True, text=True, timeout=timeout, **kwargs)


def py(spec: JailSpec, code: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return run(spec, ["python3", "-c", textwrap.dedent(code)], timeout=timeout)


def host_processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if marker.encode() in Path(entry.path, "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def wait_until_gone(marker: str, seconds: float = 5.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := host_processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def as_nobody(argv: list[str]) -> list[str]:
    """A control: the same command outside the jail, as an unprivileged uid but otherwise free."""
    return ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", *argv] if ROOT else argv


# --- the file-system view --------------------------------------------------------------------------


def test_files_outside_the_view_do_not_exist(workdir):
    secret_dir = Path(tempfile.mkdtemp(prefix="jail-secret-"))
    try:
        secret_dir.chmod(0o755)
        secret = secret_dir / "token.txt"
        secret.write_text("s3cr3t")
        secret.chmod(0o644)
        assert subprocess.run(as_nobody(["cat", str(secret)]), capture_output=True, text=True).stdout == "s3cr3t"  # control
        done = run(spec_for(workdir), ["cat", str(secret)])
        assert done.returncode != 0 and "No such file" in done.stderr
        # /root holds only the way to the bound Python installation (if it lives there).
        expected = {Path(b.target or b.source).relative_to("/root").parts[0] for b in python_binds() if (b.target or b.source).startswith("/root/")}
        inside = py(spec_for(workdir), "import os; print(sorted(os.listdir('/root')) if os.path.isdir('/root') else [])")
        assert set(json.loads(inside.stdout.replace("'", '"'))) == expected
        # /etc: a few loader files and a passwd of root, the jail's uid and nobody only.
        etc = run(spec_for(workdir), ["sh", "-c", "ls /etc; cat /etc/passwd; ls /etc/shadow /home /var 2>&1"])
        assert "shadow" not in etc.stdout.split("\n")[0] and len(etc.stdout.split("\n")) < 40
        users = [line.split(":")[0] for line in etc.stdout.splitlines() if line.count(":") == 6]
        assert users == ["root", "sandbox", "nobody"]
        assert "'/etc/shadow': No such file" in etc.stdout and "'/home': No such file" in etc.stdout
    finally:
        shutil.rmtree(secret_dir, ignore_errors=True)


def test_read_only_binds_and_root_cannot_be_written(workdir):
    prefix = python_binds()[-1].source
    script = f"""
        import os
        for path in ['/usr/pwned', '/pwned', '/etc/passwd', '/etc/ld.so.cache', {prefix + '/pwned'!r}, '/proc/sys/kernel/hostname', '/dev/pwned']:
            try:
                with open(path, 'w') as handle:
                    handle.write('x')
                print('WROTE', path)
            except OSError as error:
                print('refused', path, error.errno)
        with open('ok.txt', 'w') as handle:
            handle.write('written')
        with open('/tmp/scratch', 'w') as handle:
            handle.write('private')
    """
    done = py(spec_for(workdir), script)
    assert "WROTE" not in done.stdout, done.stdout + done.stderr
    assert done.stdout.count("refused") == 7
    assert (workdir / "ok.txt").read_text() == "written"
    if ROOT:
        assert (workdir / "ok.txt").stat().st_uid == UID
    assert not os.path.exists("/pwned") and not os.path.exists("/usr/pwned")


def test_read_only_bind_of_the_job_folder(workdir):
    (workdir / "solution.py").write_text("x = 1\n")
    spec = JailSpec(binds=(Bind(str(workdir), "/job"), *python_binds()), uid=UID, cwd="/job")
    done = run(spec, ["sh", "-c", "cat solution.py; echo y > solution.py; echo rc=$?"])
    assert "x = 1" in done.stdout and "rc=0" not in done.stdout and "Read-only file system" in done.stderr
    assert (workdir / "solution.py").read_text() == "x = 1\n"


# --- processes -------------------------------------------------------------------------------------


def test_only_its_own_processes_are_visible(workdir):
    marker = f"secret-argv-{os.getpid()}-{time.time_ns()}"
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    try:
        time.sleep(0.2)
        assert host_processes_with(marker) == [host.pid]  # control: visible on the host
        done = run(spec_for(workdir), ["sh", "-c", "ls /proc | grep -E '^[0-9]+$' | wc -l; cat /proc/[0-9]*/cmdline | tr '\\0' ' '"])
        assert marker not in done.stdout
        assert int(done.stdout.split()[0]) <= 6  # init, sh, ls, grep, wc
        listing = run(spec_for(workdir), ["ps", "-e", "-o", "pid=,args="])
        pids = [int(line.split()[0]) for line in listing.stdout.strip().splitlines()]
        assert marker not in listing.stdout and 1 in pids and len(pids) == 2, listing.stdout  # the jail's init and ps
        denied = py(spec_for(workdir), f"import os; print(open('/proc/{host.pid}/cmdline').read() if os.path.exists('/proc/{host.pid}') else 'absent')")
        assert marker not in denied.stdout
    finally:
        host.kill()
        host.wait()


def test_nothing_it_starts_survives_it(workdir):
    marker = f"{41 + os.getpid() % 1000}.{time.time_ns() % 10**6}"
    quiet = ">/dev/null 2>&1 </dev/null"
    escape = f"setsid sh -c 'sleep {marker}' {quiet} & (sleep {marker} {quiet} &) ; nohup sleep {marker} {quiet} & echo started"
    control = subprocess.run(["sh", "-c", escape], capture_output=True, text=True, timeout=10)
    try:
        time.sleep(0.2)
        assert control.stdout.strip() == "started" and len(host_processes_with(marker)) >= 3  # control
    finally:
        for pid in host_processes_with(marker):
            os.kill(pid, signal.SIGKILL)
    assert wait_until_gone(marker) == []
    done = run(spec_for(workdir), ["sh", "-c", escape + "; sleep 0.2"])
    assert done.stdout.strip() == "started"
    assert wait_until_gone(marker, 2.0) == []


def test_killing_the_launcher_or_its_parent_ends_the_jail(workdir):
    marker = f"{43 + os.getpid() % 1000}.{time.time_ns() % 10**6}"
    command = jail_command(spec_for(workdir), ["sleep", marker])
    launcher = subprocess.Popen(command.argv, env=command.env)
    deadline = time.monotonic() + 10
    while not host_processes_with(f"sleep\0{marker}") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert host_processes_with(f"sleep\0{marker}")
    launcher.kill()
    assert launcher.wait(timeout=10) == -signal.SIGKILL
    assert wait_until_gone(f"sleep\0{marker}") == []
    # The launcher's parent dies (SIGKILL, no cleanup): the jail goes with it.
    parent_code = textwrap.dedent(f"""
        import subprocess, sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
        from cuda_agent.jail import Bind, JailSpec, jail_command, python_binds
        command = jail_command(JailSpec(binds=python_binds(), uid={UID}), ["sleep", "{marker}"])
        subprocess.Popen(command.argv, env=command.env)
        print("started", flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 10
        while not host_processes_with(f"sleep\0{marker}") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert host_processes_with(f"sleep\0{marker}")
        parent.kill()
        parent.wait()
        assert wait_until_gone(f"sleep\0{marker}") == []
    finally:
        parent.kill()


def test_exit_status_is_mirrored(workdir):
    assert run(spec_for(workdir), ["sh", "-c", "exit 7"]).returncode == 7
    assert run(spec_for(workdir), ["sh", "-c", "kill -SEGV $$"]).returncode == -signal.SIGSEGV
    assert run(spec_for(workdir), ["sh", "-c", "kill -KILL $$"]).returncode == -signal.SIGKILL
    missing = run(spec_for(workdir), ["no-such-command-here"])
    assert missing.returncode == 127 and "command not found" in missing.stderr
    broken = run(spec_for(workdir, cwd="/no/such/folder"), ["true"])
    assert broken.returncode == jail.SETUP_FAILED and broken.stderr.startswith("jail: ")


def test_terminate_reaches_the_command(workdir):
    command = jail_command(spec_for(workdir), ["python3", "-c", "import os, signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: (os.write(1, b'got TERM'), os._exit(3)))\nprint('ready', flush=True)\ntime.sleep(30)"])
    process = subprocess.Popen(command.argv, env=command.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    process.terminate()
    code = process.wait(timeout=10)
    assert code == 3 and "got TERM" in process.stdout.read(), (code, process.stderr.read())



def test_terminate_sent_while_the_jail_is_being_built_is_not_lost(workdir):
    # A sweep of moments from the launch through the building of the view and the start of the
    # command: wherever the signal lands, the command ends by it (or the stage does, before it
    # has a command to forward to).
    lost = []
    for step in range(50):
        command = jail_command(spec_for(workdir), ["sleep", "60"])
        process = subprocess.Popen(command.argv, env=command.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(step * 0.002)
        process.terminate()
        try:
            code = process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            code = ("still running", process.wait())
        if code != -signal.SIGTERM:
            lost.append((step * 0.002, code, process.stderr.read().decode(errors="replace")))
    assert not lost, lost

# --- network, privileges, seccomp ------------------------------------------------------------------


def test_no_network(workdir):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        probe_code = f"import socket\ns = socket.socket(); s.settimeout(3)\ntry:\n    s.connect(('127.0.0.1', {port})); print('connected')\nexcept OSError as e:\n    print('failed', e.errno)\n"
        control = subprocess.run([sys.executable, "-c", probe_code], capture_output=True, text=True, timeout=10)
        assert control.stdout.strip() == "connected"
        done = py(spec_for(workdir), probe_code + "print(open('/proc/net/dev').read())")
        assert done.stdout.startswith("failed")
        interfaces = [line.split(":")[0].strip() for line in done.stdout.splitlines()[3:] if ":" in line]
        assert interfaces == ["lo"]
    finally:
        server.close()


def test_uid_and_capabilities(workdir):
    done = run(spec_for(workdir), ["sh", "-c", "id -u; id -g; id -G; grep -E '^(Cap|NoNewPrivs|Seccomp)' /proc/self/status"])
    lines = dict(line.split(":\t") for line in done.stdout.splitlines() if ":\t" in line)
    head = done.stdout.splitlines()[:3]
    if ROOT:
        assert head == [str(UID), str(UID), str(UID)]
    assert all(int(lines[name], 16) == 0 for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")), lines
    assert lines["NoNewPrivs"] == "1" and lines["Seccomp"] == "2"
    # A set-uid binary gives nothing (no_new_privs, nosuid binds).
    su = shutil.which("su") or "/bin/su"
    if os.path.exists(su):
        done = run(spec_for(workdir), ["sh", "-c", f"{su} -c id root </dev/null; id -u"])
        assert done.stdout.strip().splitlines()[-1] != "0"


SYSCALL_PROBE = """
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
x86 = os.uname().machine == "x86_64"
NR = dict(clone=56 if x86 else 220, clone3=435, unshare=272 if x86 else 97, setns=308 if x86 else 268, ptrace=101 if x86 else 117,
          bpf=321 if x86 else 280, keyctl=250 if x86 else 219, perf_event_open=298 if x86 else 241, userfaultfd=323 if x86 else 282,
          io_uring_setup=425, fsopen=430, open_tree=428, process_vm_readv=310 if x86 else 270)
def call(nr, *args):
    result = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return 0 if result >= 0 else errno.errorcode[ctypes.get_errno()]
out = {}
out["unshare_user"] = call(NR["unshare"], 0x10000000)
out["unshare_net"] = call(NR["unshare"], 0x40000000)
out["setns"] = call(NR["setns"], 0, 0)
out["mount"] = 0 if libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) == 0 else errno.errorcode[ctypes.get_errno()]
out["ptrace_traceme"] = call(NR["ptrace"], 0, 0, 0, 0)
out["bpf"] = call(NR["bpf"], 0, 0, 0)
out["keyctl"] = call(NR["keyctl"], 0, 0)
out["perf_event_open"] = call(NR["perf_event_open"], 0, 0, -1, -1, 0)
out["userfaultfd"] = call(NR["userfaultfd"], 0)
out["io_uring_setup"] = call(NR["io_uring_setup"], 0, 0)
out["fsopen"] = call(NR["fsopen"], 0, 0)
out["process_vm_readv"] = call(NR["process_vm_readv"], os.getppid(), 0, 0, 0, 0, 0)
out["clone3"] = call(NR["clone3"], 0, 0)
# clone(CLONE_NEWUSER | SIGCHLD): refused by the filter; a plain fork still works
out["clone_newuser"] = call(NR["clone"], 0x10000000 | 17, 0, 0, 0, 0)
pid = os.fork()
if pid == 0:
    os._exit(0)
out["fork"] = os.waitpid(pid, 0)[1]
import threading
t = threading.Thread(target=lambda: None); t.start(); t.join()
out["thread"] = 0
print(json.dumps(out))
"""


CONTROL_PROBE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
x86 = os.uname().machine == "x86_64"
print(libc.syscall(ctypes.c_long(272 if x86 else 97), ctypes.c_long(0x10000000)), libc.syscall(ctypes.c_long(101 if x86 else 117), *[ctypes.c_long(0)] * 4))
"""


def test_seccomp_refuses_namespaces_mounts_ptrace_and_more(workdir):
    # Control: outside, the same uid may make a user namespace and ask to be traced (a system
    # Python, which that uid can run; the probe exits at once, before any tracing matters).
    system_python = "/usr/bin/python3"
    if os.path.exists(system_python):
        outside = subprocess.run(as_nobody([system_python, "-I", "-c", CONTROL_PROBE]), capture_output=True, text=True, timeout=30)
        assert outside.stdout.split() == ["0", "0"], outside.stderr
    done = py(spec_for(workdir), SYSCALL_PROBE)
    inside = json.loads(done.stdout.strip().splitlines()[-1])
    refused = {k: v for k, v in inside.items() if k not in ("fork", "thread", "clone3")}
    assert set(refused.values()) == {"EPERM"}, inside
    assert inside["clone3"] == "ENOSYS" and inside["fork"] == 0 and inside["thread"] == 0


def test_seccomp_program_for_each_architecture():
    for machine in ("x86_64", "aarch64"):
        program = seccomp_program(machine)
        assert program[0] == (0x20, 0, 0, 4)  # load the architecture first
        assert program[-1] == (0x06, 0, 0, 0x7FFF0000)  # allow is the last word
        jumps = [(index, jt, jf) for index, (code, jt, jf, k) in enumerate(program) if code & 0x07 == 0x05]
        assert jumps and all(index + 1 + max(jt, jf) < len(program) for index, jt, jf in jumps)
    assert len(jail.REFUSED_SYSCALLS) >= 30
    with pytest.raises(KeyError):
        seccomp_program("sparc64")


def test_unknown_architecture_is_refused_not_run_unfiltered(monkeypatch):
    monkeypatch.setattr(jail, "probe", lambda python=None: {**MACHINE, "seccomp": False, "reason": "no seccomp syscall table for sparc64"})
    with pytest.raises(JailUnavailable, match="refusing to run unfiltered"):
        jail_command(spec_for(), ["true"])
    assert jail_command(spec_for(seccomp=False), ["true"]).protections["seccomp"] is None  # only by explicit opt-out


# --- environment, limits, Python -------------------------------------------------------------------


def test_environment_is_exactly_the_fixed_one(workdir, monkeypatch):
    monkeypatch.setenv("CUDA_AGENT_TEST_SECRET", "hunter2")
    done = py(spec_for(workdir, env={"EXTRA": "given"}), "import json, os; print(json.dumps(dict(os.environ)))")
    env = json.loads(done.stdout)
    assert env == {"PATH": jail.DEFAULT_PATH, "HOME": "/tmp", "LANG": "C.UTF-8", "EXTRA": "given"}
    assert "hunter2" not in done.stdout


def test_rlimits_apply(workdir):
    spec = spec_for(workdir, limits=Limits(file_size_bytes=4096, cpu_seconds=7, open_files=64, address_space_bytes=2 << 30, processes=40))
    done = run(spec, ["sh", "-c", "ulimit -f; ulimit -t; ulimit -n; ulimit -v; ulimit -c; head -c 100000 /dev/zero > big.bin; echo rc=$?"])
    lines = done.stdout.splitlines()
    assert lines[:5] == ["8", "7", "64", str(2 << 20), "0"], done.stdout  # sh counts -f in 512-byte blocks, -v in KiB
    assert "rc=0" not in done.stdout and (workdir / "big.bin").stat().st_size == 4096
    control = run(spec_for(workdir), ["sh", "-c", "head -c 100000 /dev/zero > big.bin; echo rc=$?"])  # control: no limit, same jail
    assert "rc=0" in control.stdout and (workdir / "big.bin").stat().st_size == 100000


def test_python_with_its_standard_library_runs(workdir):
    code = "import json, sqlite3, ssl, subprocess, tempfile, multiprocessing as mp\nwith tempfile.TemporaryDirectory() as d: pass\nprint(json.dumps(sqlite3.connect(':memory:').execute('select 1+1').fetchone()))"
    done = py(spec_for(workdir), code)
    assert done.returncode == 0 and done.stdout.strip() == "[2]", done.stderr


def test_passed_fds_stay_and_others_are_closed(workdir):
    keep_read, keep_write = os.pipe()
    other_read, other_write = os.pipe()
    try:
        os.set_inheritable(keep_write, True)
        os.set_inheritable(other_write, True)
        spec = spec_for(workdir, pass_fds=(keep_write,), env={"FD": str(keep_write), "OTHER": str(other_write)})
        code = "import os\nos.write(int(os.environ['FD']), b'through')\ntry:\n    os.write(int(os.environ['OTHER']), b'leak'); print('leaked')\nexcept OSError: print('closed')"
        command = jail_command(spec, ["python3", "-c", code])
        done = subprocess.run(command.argv, env=command.env, pass_fds=(keep_write, other_write), capture_output=True, text=True, timeout=30)
        os.close(keep_write)
        os.close(other_write)
        assert done.stdout.strip() == "closed", done.stderr
        assert os.read(keep_read, 100) == b"through"
        assert os.read(other_read, 100) == b""  # end of file: nothing was written
    finally:
        for fd in (keep_read, other_read):
            os.close(fd)


# --- degraded machines and bad specs ---------------------------------------------------------------


def test_missing_namespaces_are_named_and_require_raises(monkeypatch, workdir):
    monkeypatch.setattr(jail, "probe", lambda python=None: {**MACHINE, "namespaces": False, "reason": "unshare: Operation not permitted"})
    with pytest.raises(JailUnavailable, match="unshare: Operation not permitted"):
        jail_command(spec_for(workdir, require=True), ["true"])
    command = jail_command(spec_for(workdir), ["python3", "-c", "import os; print(os.getuid(), sorted(os.environ))"])
    record = command.protections
    assert record["jail"] == "degraded" and any("namespaces" in item for item in record["missing"])
    assert record["filesystem"].startswith("the host's") and record["processes"].startswith("the host's")
    done = subprocess.run(command.argv, env=command.env, capture_output=True, text=True, timeout=30)
    # Still: its own uid (as root), the fixed environment.
    assert done.stdout.split(" ", 1)[1].strip() == "['HOME', 'LANG', 'PATH']"
    if ROOT:
        assert done.stdout.split()[0] == str(UID)


def test_protections_record_what_applied(workdir):
    record = jail_command(spec_for(workdir, limits=Limits(cpu_seconds=5)), ["true"]).protections
    assert record["jail"] == ("complete" if ROOT else "degraded")
    assert set(record["namespaces"]) >= {"mount", "pid", "network", "ipc", "uts"}
    assert record["filesystem"]["writable"] == [str(workdir)]
    assert record["rlimits"] == {"cpu_seconds": 5, "core_bytes": 0}
    assert record["capabilities"].startswith("none") and record["no_new_privs"] is True


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"uid": 0}, "must not be 0"),
        ({"binds": (Bind("/no/such/source"),)}, "does not exist"),
        ({"binds": (Bind("/usr", "/proc/x"),)}, "reserved"),
        ({"devices": ("/etc/passwd",)}, "not under /dev"),
    ],
)
def test_bad_specs_are_refused(changes, message):
    with pytest.raises(JailError, match=message):
        jail_command(JailSpec(**changes), ["true"])


def test_read_only_binds_already_in_the_system_folders_are_not_doubled(workdir):
    # e.g. a Python whose site-packages list names /lib/python3/dist-packages (/lib -> usr/lib)
    links = [d for d in ("/lib", "/lib64", "/bin") if os.path.islink(d)]
    binds = tuple(Bind(d) for d in links) + (Bind("/usr/bin"),)
    command = jail_command(spec_for(workdir, binds=spec_for(workdir).binds + binds), ["sh", "-c", "ls /usr/bin/sh /bin/sh"])
    assert not any(b in command.protections["filesystem"]["read_only"] for b in [*links, "/usr/bin"])
    done = subprocess.run(command.argv, env=command.env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_uid_claims_are_exclusive_and_release_kills_what_is_left(tmp_path):
    from cuda_agent.jail.uids import NoFreeUid, claim_uid, release_uid

    claims = tmp_path / "claims"
    first, second = claim_uid(700_000, claims, span=2), claim_uid(700_000, claims, span=2)
    assert {first, second} == {700_000, 700_001}
    with pytest.raises(NoFreeUid):
        claim_uid(700_000, claims, span=2)
    if os.geteuid() == 0:  # a process of that uid (root can start one) dies with the release
        left = subprocess.Popen(["sleep", "600"], user=first, group=first)
        release_uid(first, claims)
        assert left.wait(timeout=10) == -signal.SIGKILL
    else:
        release_uid(first, claims, kill=False)
    assert claim_uid(700_000, claims, span=2) == first
    with pytest.raises(ValueError):
        claim_uid(0, claims)
