"""Planted candidates against the evaluator's jail: each one is what an adversarial policy tried on
the unjailed evaluator, and fails on that code (docs/cheats.md, sandbox escapes).

Host backend: they run where CI runs (root, no GPU). Static source checks are off in these
tests: what is under test is what holds when a form slips past them.
"""

import ctypes
import errno
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cuda_agent.jail import python_binds
from cuda_agent.jail.uids import UID_CLAIMS_DIR, UID_SPAN
from cuda_agent.contracts import JobError, check_job_settings
from evaluator_cuda.evaluation import evaluate
from evaluator_cuda.isolation import sandbox
from evaluator_cuda.solutions import Solution
from evaluator_helpers import (AXPY_TASK, BINDING, KERNEL, build_cache, host, kernel_with,  # noqa: F401
                               model_new_showing, model_new_with, workspace)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                reason="the jail's own uid needs root (CI and the GPU machines run as root)")

REPO = Path(__file__).resolve().parents[1]
SECRET = "tok-" + "9f3a1c77e2b4d605"


def _settings(cache, **overrides):
    overrides.setdefault("static_checks", False)
    return host(cache, **overrides)


def _jail_uid_processes(uid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_the_candidate_runs_jailed_and_the_record_says_so(build_cache):
    record = evaluate(AXPY_TASK, workspace(), _settings(build_cache))
    assert record["status"] == "correct", record["message"]
    jail = record["sandbox"]["jail"]
    base = _settings(build_cache).jail_uid_base
    assert jail["jail"] == "complete" and base <= jail["uid"] < base + UID_SPAN
    assert "pid" in jail["namespaces"] and "network" in jail["namespaces"]
    assert not jail["filesystem"]["writable"]


def test_inherited_environment_does_not_reach_the_candidate(build_cache, monkeypatch):
    monkeypatch.setenv("CUDA_AGENT_TEST_TOKEN", SECRET)
    record = evaluate(AXPY_TASK, workspace(model_new=model_new_showing("dict(os.environ)")), _settings(build_cache))
    text = json.dumps(record)
    assert "SHOWN" in text and "'HOME': '/tmp'" in text  # the candidate did show its environment
    assert SECRET not in text and "CUDA_AGENT_TEST_TOKEN" not in text
    assert record["status"] == "runtime_error" and record["reward"] == -1


@pytest.mark.parametrize("what", ["secret_file", "root", "cache", "harness_listing"])
def test_files_outside_the_view_are_not_readable(build_cache, tmp_path, what):
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    secret.chmod(0o644)
    expression = {
        "secret_file": f"open({str(secret)!r}).read()",
        "root": "os.listdir('/root')",
        "cache": f"os.listdir({build_cache!r})",
        "harness_listing": "os.listdir('/tmp')",
    }[what]
    record = evaluate(AXPY_TASK, workspace(model_new=model_new_showing(expression)), _settings(build_cache))
    text = json.dumps(record)
    assert "SHOWN" in text
    assert SECRET not in text
    if what in ("secret_file", "cache"):
        assert "refused: FileNotFoundError" in text or "refused: PermissionError" in text, text[:2000]
    if what == "root":  # at most the folders leading to a Python installed under /root, never the rest
        shown = {b.source.split("/")[2] for b in python_binds() if b.source.startswith("/root/")}
        assert not any(f"'{name}'" in text for name in set(os.listdir("/root")) - shown)
    assert record["status"] == "runtime_error" and record["reward"] == -1


def test_harness_source_and_solution_are_read_only(build_cache):
    verify = Path(sandbox.__file__).resolve().parents[1] / "verdict" / "verify.py"
    before = verify.read_bytes()
    expression = f"open({str(verify)!r}, 'a').write('\\nRIGGED = True\\n')"
    record = evaluate(AXPY_TASK, workspace(model_new=model_new_showing(expression)), _settings(build_cache))
    assert verify.read_bytes() == before
    assert "Read-only file system" in json.dumps(record) or "Permission denied" in json.dumps(record)
    record = evaluate(AXPY_TASK, workspace(model_new=model_new_showing("open('model_new.py', 'a').write('#')")),
                      _settings(build_cache))
    assert "Read-only file system" in json.dumps(record) or "Permission denied" in json.dumps(record)


@pytest.mark.parametrize("how", [
    "from os import kill; kill(os.getppid(), 9)",
    "os.kill(1, 9)",
    "import signal; os.killpg(0, signal.SIGKILL)",
])
def test_killing_what_the_candidate_can_reach_is_its_own_runtime_error(build_cache, how):
    """A wrong kernel that kills what it can reach: once this made `incorrect` an `infra_error`
    (reward None). In its pid namespace its parent is the namespace's init, which ignores
    signals from inside; its own group dies alone. Either way the verdict stands: −1."""
    forward = f"import os\n{how}\nreturn cuda_extension.axpy_forward(x, y, float(self.alpha) + 1.0)"
    settings = _settings(build_cache, call_timeout_extra_s=2.0, first_call_extra_s=2.0)  # the loop waits for the limit
    record = evaluate(AXPY_TASK, workspace(model_new=model_new_with(forward)), settings)
    assert record["status"] in ("runtime_error", "incorrect"), record["message"]
    assert record["reward"] == -1


def test_a_setsid_child_does_not_outlive_the_evaluation(build_cache):
    settings = _settings(build_cache)
    prelude = """
import subprocess
subprocess.Popen(["sleep", "600"], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
subprocess.Popen(["setsid", "sleep", "601"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
"""
    forward = "return cuda_extension.axpy_forward(x, y, float(self.alpha) + 1.0)"  # wrong: incorrect
    record = evaluate(AXPY_TASK, workspace(model_new=model_new_with(forward, prelude=prelude)), settings)
    assert record["status"] == "incorrect" and record["reward"] == -1
    uid = record["sandbox"]["jail"]["uid"]
    deadline = time.monotonic() + 5
    while _jail_uid_processes(uid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _jail_uid_processes(uid) == []
    assert not (UID_CLAIMS_DIR / str(uid)).exists()  # the uid was given back


# A static initialiser that runs when the candidate's library loads: it tries to enter another
# network namespace (setns by name and by syscall number), to make new ones, to reach a listener
# outside and to write a file outside, and records each call's errno for escape_report().
ESCAPE_INITIALISER = r"""#include <cerrno>
#include <cstdint>
#include <fcntl.h>
#include <linux/capability.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <unistd.h>
namespace {
int64_t report[7];
int64_t attempt(long result) { return result < 0 ? errno : 0; }
int64_t reach_listener() {
  int fd = syscall(SYS_socket, AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return errno;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(PORT);
  addr.sin_addr.s_addr = htonl(0x7f000001);
  int64_t got = attempt(syscall(SYS_connect, fd, &addr, sizeof addr));
  close(fd);
  return got;
}
int64_t effective_caps() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &header, data) < 0) return -errno;
  return data[0].effective | (int64_t(data[1].effective) << 32);
}
struct Escape {
  Escape() {
    report[0] = attempt(setns(open("/proc/self/ns/net", O_RDONLY), CLONE_NEWNET));
    report[1] = attempt(syscall(SYS_setns, -1, 0));
    report[2] = attempt(unshare(CLONE_NEWUSER | CLONE_NEWNET));
    report[3] = attempt(syscall(SYS_unshare, 0));
    report[4] = reach_listener();
    report[5] = attempt(open("MARKER", O_WRONLY | O_CREAT, 0644));
    report[6] = effective_caps();
  }
} escape;
}
extern "C" void escape_report(int64_t* out) { for (int k = 0; k < 7; ++k) out[k] = report[k]; }
"""
ESCAPE_BINDING = """
extern "C" void escape_report(int64_t* out);
std::vector<int64_t> report() { std::vector<int64_t> out(7); escape_report(out.data()); return out; }
REGISTER_BINDING(escape_report, report);
"""


def _escape_workspace(port: int, marker: Path, model_new: str) -> Solution:
    kernel = ESCAPE_INITIALISER.replace("PORT", str(port)).replace("MARKER", str(marker)) + KERNEL.replace("OP", "+")
    files = {"model_new.py": model_new.encode(), "kernels/axpy.cpp": kernel.encode(),
             "kernels/axpy_binding.cpp": (BINDING.replace("BODY", "") + ESCAPE_BINDING).encode()}
    return Solution("workspace", files, "model_new.py", "axpy")


def _unfiltered_errnos() -> tuple[str, int]:
    """Control, in this process (root, no filter): setns on a bad fd is EBADF, unshare(0) succeeds."""
    libc = ctypes.CDLL(None, use_errno=True)
    x86 = os.uname().machine == "x86_64"
    setns = libc.syscall(ctypes.c_long(308 if x86 else 268), ctypes.c_long(-1), ctypes.c_long(0))
    bad_fd = errno.errorcode[ctypes.get_errno()] if setns < 0 else "0"
    return bad_fd, libc.syscall(ctypes.c_long(272 if x86 else 97), ctypes.c_long(0))


def test_a_static_initialiser_cannot_enter_other_namespaces(build_cache, tmp_path):
    """Once a C++ static initialiser entered the parent's network namespace with setns() (root, every
    capability), from where the candidate sent the broker a forged verdict. In the jail the seccomp filter answers every
    namespace call with EPERM: setns on a bad fd and unshare(0), which the kernel alone answers with
    EBADF and success, show it is the filter that refuses; no capability is held either. The wrong
    kernel keeps its honest verdict, and the listener and folder outside the jail see nothing."""
    outside = tmp_path / "outside"
    outside.mkdir()
    outside.chmod(0o777)
    marker = outside / "escaped"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    wrong = model_new_with("return cuda_extension.axpy_forward(x, y, float(self.alpha) + 1.0)")
    shown = model_new_with("return x", prelude='raise RuntimeError("SHOWN " + repr(cuda_extension.escape_report()))')
    try:
        record = evaluate(AXPY_TASK, _escape_workspace(port, marker, wrong), _settings(build_cache))
        assert (record["status"], record["reward"]) == ("incorrect", -1), record["message"]
        record = evaluate(AXPY_TASK, _escape_workspace(port, marker, shown), _settings(build_cache))
        assert record["status"] == "runtime_error" and "SHOWN" in record["message"], record["message"]
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
    assert not marker.exists() and list(outside.iterdir()) == []
    report = json.loads(record["message"].split("SHOWN ", 1)[1].split("]", 1)[0] + "]")
    setns_named, setns_bad_fd, unshare_new, unshare_zero, connect, outside_file, caps = report
    assert _unfiltered_errnos() == ("EBADF", 0)
    assert [errno.errorcode[e] for e in (setns_named, setns_bad_fd, unshare_new, unshare_zero)] == ["EPERM"] * 4
    assert errno.errorcode[connect] == "ECONNREFUSED"  # its own network namespace: nothing listens there
    assert errno.errorcode[outside_file] == "ENOENT"  # not EACCES: the folder is not in its view at all
    assert caps == 0


def test_a_loop_in_forward_is_stopped_by_the_call_limit(build_cache):
    forward = "while True:\n    pass"
    begin = time.monotonic()
    # the first call's limit: 100x the reference's call plus 2 s (default 15 s: a loop burns a CPU that long)
    settings = _settings(build_cache, call_timeout_extra_s=1.0, first_call_extra_s=1.0)
    record = evaluate(AXPY_TASK, workspace(model_new=model_new_with(forward)), settings)
    took = time.monotonic() - begin
    assert record["status"] == "runtime_error" and "no answer" in record["message"]
    assert record["call_timeout_s"] < 60
    assert took < 300 / 5  # the old limit was the 300 s child timeout


def test_a_loop_at_import_is_stopped_by_the_import_limit(build_cache):
    settings = _settings(build_cache, import_timeout_s=5.0)
    model = model_new_with("return x", prelude="while True:\n    pass")
    begin = time.monotonic()
    record = evaluate(AXPY_TASK, workspace(model_new=model), settings)
    assert record["status"] == "runtime_error" and time.monotonic() - begin < 120


def test_include_of_an_outside_file_shows_nothing_of_it(build_cache, tmp_path):
    secret = tmp_path / "secret.h"
    secret.write_text(f"{SECRET} {SECRET}\n")
    secret.chmod(0o644)
    for target in (str(secret), "/etc/passwd"):
        kernel = f'#include "{target}"\n' + kernel_with("for (int64_t i = 0; i < n; ++i) out[i] = a * x[i] + y[i];")
        record = evaluate(AXPY_TASK, workspace(kernel=kernel), _settings(build_cache))
        text = json.dumps(record)
        assert record["status"] == "compile_error", record["message"]
        assert SECRET not in text and "root:x:0" not in text
        assert len(json.dumps(record["diagnostics"])) < 20000
        assert all(not str(d.get("file") or "").startswith("/") for d in record["diagnostics"])


def test_machine_memory_bounds_the_child_limit(build_cache):
    settings = _settings(build_cache, child_memory_bytes=1 << 50)
    available = sandbox.available_memory_bytes()
    assert sandbox.child_memory_limit(settings) <= max(available, 1 << 30)


def test_file_size_and_open_files_settings_reach_the_jailed_candidate(build_cache):
    settings = _settings(build_cache, child_file_size_bytes=3 * 1024**2, child_open_files=77)
    expression = "[__import__('resource').getrlimit(getattr(__import__('resource'), n)) for n in ('RLIMIT_FSIZE', " \
                 "'RLIMIT_NOFILE')]"
    record = evaluate(AXPY_TASK, workspace(model_new=model_new_showing(expression)), settings)
    assert f"SHOWN [({3 * 1024**2}, {3 * 1024**2}), (77, 77)]" in record["message"], record["message"]
    rlimits = record["sandbox"]["jail"]["rlimits"]
    assert rlimits["file_size_bytes"] == 3 * 1024**2 and rlimits["open_files"] == 77
    with pytest.raises(JobError, match="child_file_size_bytes, child_open_files"):
        check_job_settings({"child_file_size_bytes": 1 << 40, "child_open_files": 1 << 20})


def test_require_jail_refuses_instead_of_downgrading(build_cache, monkeypatch):
    import cuda_agent.jail as jail

    def unavailable(python=None):
        return {"root": True, "namespaces": False, "user_namespace": False, "seccomp": True,
                "machine": "x86_64", "reason": "no namespaces here"}

    monkeypatch.setattr(jail, "probe", unavailable)
    record = evaluate(AXPY_TASK, workspace(), _settings(build_cache, require_jail=True))
    assert record["status"] == "infra_error" and "jail" in record["message"]
    record = evaluate(AXPY_TASK, workspace(), _settings(build_cache, require_jail=False))
    # opted out: it runs with what is left, and the record names what is missing
    assert record["sandbox"]["jail"]["jail"] == "degraded"
    assert any("namespaces" in m for m in record["sandbox"]["jail"]["missing"])


# --- harness state (issue 11, item 3) ------------------------------------------------------------


def test_build_key_fields_are_unambiguous():
    from evaluator_cuda.extension.torch_build import build_key

    settings = host("/nonexistent")
    joined = {"a": b"AAA\0kernels/b.cpp\0BBB"}
    split = {"a": b"AAA", "kernels/b.cpp": b"BBB"}
    assert build_key(joined, settings) != build_key(split, settings)
    assert build_key({"a": b"AAA", "b": b"BBB"}, settings) != build_key({"a": b"AAA\0b\0BBB"}, settings)


def test_a_tampered_baseline_is_measured_again(tmp_path):
    from evaluator_cuda.timing.baselines import BaselineCache

    cache = BaselineCache(tmp_path)
    cache.put("k", {"eager": {"median_us": 10.0}})
    assert cache.get("k") == {"eager": {"median_us": 10.0}}
    cache.path("k").write_text(json.dumps({"eager": {"median_us": 1e9}}))
    assert cache.get("k") is None and not cache.path("k").exists()
    (tmp_path / "u.json").write_text(json.dumps({"eager": {"median_us": 1e9}}))  # no digest: never trusted
    assert cache.get("u") is None


def test_a_tampered_cached_library_is_rebuilt(build_cache, tmp_path):
    """In the shared cache (its binding runtime is built once for the run), under a key of its own."""
    import uuid

    from evaluator_cuda.extension.build import build_workspace

    settings = _settings(build_cache)
    solution = workspace(binding_body=f"// {uuid.uuid4().hex}")
    first = build_workspace(solution.files, settings)
    assert first.status == "built" and not first.cache_hit
    Path(first.so_path).write_bytes(b"\x7fELF not the library the harness built")
    record = evaluate(AXPY_TASK, solution, settings)
    assert record["status"] == "correct", record["message"]
    assert record["build"]["cache_hit"] is False


def test_each_jailed_child_has_a_uid_of_its_own_and_gives_it_back(build_cache, tmp_path):
    """Jails that shared a uid shared RLIMIT_NPROC: on the GPU machine, concurrent evaluations ran out
    of processes in their builds. Two children alive at once hold two uids; closing frees both."""
    guard = sandbox.child_guard(_settings(build_cache))
    children = []
    try:
        for name in ("a", "b"):
            folder = tmp_path / name
            folder.mkdir()
            children.append(sandbox.Child("candidate", folder, guard=guard))
        uids = [child.protections["uid"] for child in children]
        assert uids[0] != uids[1] and all((UID_CLAIMS_DIR / str(uid)).exists() for uid in uids)
    finally:
        for child in children:
            child.close()
    assert not any((UID_CLAIMS_DIR / str(uid)).exists() for uid in uids)


def test_the_jail_is_on_by_default_for_both_backends_and_can_be_turned_off():
    from evaluator_cuda.settings import EvalSettings

    assert sandbox.jails_children(EvalSettings.for_backend("host"))
    assert sandbox.jails_children(EvalSettings.for_backend("cuda"))
    assert sandbox.child_guard(EvalSettings.for_backend("cuda", jail_children=False))["jail"]["enabled"] is False
    assert not sandbox.jails_children(EvalSettings.for_backend("host", jail_children=False))


def test_a_jailed_compiler_sees_the_cuda_toolkit_wherever_it_is(build_cache, tmp_path):
    """On the GPU machine the toolkit lies outside the jail's system folders: a jailed fast build
    could not run nvcc there and every build fell back to the torch build. A toolkit-like folder
    outside the view: its tool runs with toolchain_binds, and cannot be found without."""
    from evaluator_cuda.extension.fast.stage import run_compiler, toolchain_binds

    toolkit = tmp_path / "toolkit"
    (toolkit / "bin").mkdir(parents=True)
    tool = toolkit / "bin" / "nvcc"
    tool.write_text("#!/bin/sh\necho toolkit tool ran\n")
    tool.chmod(0o755)
    os.chmod(tmp_path, 0o755)
    link = tmp_path / "cuda"
    link.symlink_to(toolkit)  # like /usr/local/cuda pointing elsewhere
    stage = tmp_path / "stage"
    stage.mkdir()
    with sandbox.own_uid(sandbox.child_guard(_settings(build_cache))["jail"]) as jail:
        sandbox.hand_over(stage, jail["uid"])
        code, text = run_compiler([str(tool)], stage, 30, jail, toolchain_binds(str(link)))
        assert code == 0 and "toolkit tool ran" in text, text
        code, text = run_compiler([str(tool)], stage, 30, jail)
        assert code != 0 and "toolkit tool ran" not in text


def test_a_jailed_fast_build_uses_a_compiler_installed_outside_the_system_folders(build_cache, tmp_path,
                                                                                  monkeypatch):
    """The GPU machine sets CXX=/opt/gcc/bin/g++: the jailed compiler was not found there and every
    fast build handed over to the torch build. A CXX installed outside the jail's view builds."""
    import shutil

    from evaluator_cuda.extension.fast import toolchain
    from evaluator_cuda.extension.fast.builder import build_fast
    from evaluator_cuda.extension.fast.stage import toolchain_binds

    install = tmp_path / "opt" / "gcc"
    (install / "bin").mkdir(parents=True)
    compiler = install / "bin" / "g++"
    compiler.write_text(f"#!/bin/sh\nexec {shutil.which('g++')} \"$@\"\n")
    compiler.chmod(0o755)
    for folder in (tmp_path, tmp_path / "opt", install, install / "bin"):
        os.chmod(folder, 0o755)
    assert toolchain_binds(None, str(compiler))[0].source == str(install)
    assert toolchain_binds(None, shutil.which("g++")) == ()  # a system compiler needs nothing more
    monkeypatch.setenv("CXX", str(compiler))
    toolchain.find_toolchain.cache_clear()
    try:
        jail = sandbox.child_guard(_settings(build_cache))["jail"]
        result = build_fast(workspace().files, backend="host", cache_dir=tmp_path / "cache", jail=jail)
    finally:
        toolchain.find_toolchain.cache_clear()
    assert result.ok, (result.fallback_reason, result.log)


# Whether a fresh 24 MiB malloc in the candidate's process was mmap-ed: the IS_MMAPPED bit (2) of the
# size field glibc keeps just before the block.
_MMAPPED_24MIB = ("(lambda c: (lambda f: (setattr(f, 'restype', c.c_void_p), "
                  "c.c_size_t.from_address(f(24 << 20) - 8).value & 2)[1])(c.CDLL(None).malloc))(__import__('ctypes'))")


@pytest.mark.parametrize("jailed", [True, False], ids=["jailed", "unjailed"])
def test_every_child_allocates_blocks_of_a_few_mib_from_its_heap(build_cache, jailed):
    """glibc's thresholds are fixed in every child, jailed or not, whatever the parent's environment: a
    block below 32 MiB comes from the heap, where by default (an mmap threshold of 128 KiB, raised only
    by frees) it would be fresh mmap-ed pages."""
    settings = _settings(build_cache, jail_children=jailed)
    record = evaluate(AXPY_TASK, workspace(model_new=model_new_showing(_MMAPPED_24MIB)), settings)
    assert "SHOWN 0" in record["message"], record["message"]


# The kB of transparent huge pages in the mapping that holds a fresh, filled 16 MiB torch tensor.
_HUGE_KB_OF_16MIB = (
    "(lambda t, blocks: [int(b.split('AnonHugePages:')[1].split()[0]) for b in blocks"
    " if int(b.split('-')[0], 16) <= t.data_ptr() < int(b.split('-')[1].split()[0], 16)][0])"
    "(__import__('torch').ones(4 << 20),"
    " __import__('re').split(r'(?m)^(?=[0-9a-f]+-[0-9a-f]+ )', open('/proc/self/smaps').read())[1:])")


def _huge_pages_available() -> bool:
    try:
        return "[never]" not in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not _huge_pages_available(), reason="transparent huge pages are off on this machine")
@pytest.mark.parametrize("jailed", [True, False], ids=["jailed", "unjailed"])
def test_every_child_puts_torch_blocks_of_a_few_mib_on_huge_pages(build_cache, jailed):
    """torch's CPU allocator is told to use transparent huge pages in every child: most of a fresh 16 MiB
    tensor lies on them (without the setting, none of it does where huge pages are only given on request)."""
    settings = _settings(build_cache, jail_children=jailed)
    record = evaluate(AXPY_TASK, workspace(model_new=model_new_showing(_HUGE_KB_OF_16MIB)), settings)
    shown = record["message"].split("SHOWN ", 1)[-1]
    assert shown.isdigit() and int(shown) >= 8 * 1024, record["message"]


def test_the_jailed_candidate_runs_in_a_memory_cgroup_removed_after_it(build_cache):
    """Its group is named in the record with the limit of the settings, the candidate sees itself in it,
    and the group is gone once the evaluation has ended."""
    settings = _settings(build_cache, child_memory_bytes=6 * 1024**3)
    record = evaluate(AXPY_TASK, workspace(model_new=model_new_showing("open('/proc/self/cgroup').read()")), settings)
    group = record["sandbox"]["jail"]["memory_cgroup"]
    if "missing" in group:
        pytest.skip(f"no memory cgroup on this machine: {group['missing']}")
    assert group["memory_bytes"] == sandbox.cgroup_memory_limit(settings) and group["processes"] >= 256
    assert os.path.basename(group["path"]) in record["message"], record["message"]
    assert not os.path.exists(group["path"])


def test_a_child_whose_jail_cannot_be_made_gives_back_its_uid_and_cgroup(build_cache, tmp_path, monkeypatch):
    """The uid is claimed and the cgroup made before the jail's command line: when that step fails, the
    child never starts, and neither the claim nor the group may outlive the error."""
    from cuda_agent.jail import cgroup as jail_cgroup

    made, claimed = [], []
    create, claim = jail_cgroup.create_cgroup, sandbox.jail_uids.claim_uid
    monkeypatch.setattr(jail_cgroup, "create_cgroup", lambda *a: made.append(create(*a)) or made[-1])
    monkeypatch.setattr(sandbox.jail_uids, "claim_uid", lambda *a: claimed.append(claim(*a)) or claimed[-1])

    def broken(spec, argv):
        raise RuntimeError("the jail's command could not be made")

    monkeypatch.setattr(sandbox.jail_mod, "jail_command", broken)
    guard = sandbox.child_guard(_settings(build_cache, child_memory_bytes=2 * 1024**3))
    with pytest.raises(RuntimeError, match="could not be made"):
        sandbox.Child("candidate", tmp_path, guard=guard)
    assert len(claimed) == 1 and not (UID_CLAIMS_DIR / str(claimed[0])).exists()
    assert all(not os.path.exists(folder) for group in made for folder in group.folders)


def test_an_evaluator_started_through_a_path_with_dots_still_starts_its_jailed_children(build_cache, tmp_path):
    """`scripts/../.venv/bin/python`: the interpreter's path runs through a folder the jail does not show; the
    children are started by its normalised path (found when a benchmark run from scripts/ failed every first
    evaluation with exit status 127)."""
    detour = os.path.relpath(sys.executable, tmp_path)  # run from tmp_path: sys.executable keeps the dots
    assert detour.startswith("../")
    code = ("import json, sys\n"
            "from cuda_agent.jail import this_python\n"
            "from evaluator_cuda.evaluation import evaluate\n"
            "from evaluator_helpers import AXPY_TASK, host, workspace\n"
            f"record = evaluate(AXPY_TASK, workspace(), host({build_cache!r}))\n"
            "print(json.dumps([record['status'], record['message'], sys.executable, this_python()]))\n")
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}", "CUDA_AGENT_FORK_REFERENCE": "0"}
    done = subprocess.run([detour, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    status, message, executable, normalised = json.loads(done.stdout.strip().splitlines()[-1])
    assert status == "correct", message
    assert "/../" in executable and normalised == os.path.normpath(sys.executable)
