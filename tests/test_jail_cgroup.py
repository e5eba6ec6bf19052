"""The jail's memory and pids cgroup: a jailed command that takes more memory than its group allows is
killed by the kernel (no address-space limit involved), nothing outlives the group's removal, and
groups of launchers that died are swept."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from cuda_agent.jail import Bind, JailError, JailSpec, jail_command, probe, python_binds
from cuda_agent.jail.cgroup import CgroupUnavailable, create_cgroup

MiB = 1024**2


def _group_or_skip(memory_bytes: int, processes: int | None = 64):
    if not sys.platform.startswith("linux") or os.geteuid() != 0 or not probe()["namespaces"]:
        pytest.skip("the jail's cgroup needs root and namespaces (CI and the GPU machines have both)")
    try:
        return create_cgroup(memory_bytes, processes)
    except CgroupUnavailable as exc:
        pytest.skip(f"no memory cgroup on this machine: {exc}")


def _run_jailed(group, code: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    spec = JailSpec(binds=python_binds(), uid=65000, cgroup_procs=group.procs_files, die_with_parent=False)
    command = jail_command(spec, [sys.executable, "-c", code])
    return subprocess.run(command.argv, env=command.env, capture_output=True, text=True, timeout=timeout)


_TOUCH = "import sys; b = bytearray({n}); b[::4096] = b'x' * len(b[::4096]); print('touched', len(b))"


def test_a_jailed_command_over_its_memory_limit_is_killed_and_one_under_it_is_not():
    group = _group_or_skip(192 * MiB)
    try:
        small = _run_jailed(group, _TOUCH.format(n=32 * MiB))
        assert small.returncode == 0 and "touched" in small.stdout, small.stderr
        assert group.oom_kills() == 0
        big = _run_jailed(group, _TOUCH.format(n=512 * MiB))
        assert big.returncode == -9, (big.returncode, big.stdout, big.stderr)
        assert group.oom_kills() >= 1
    finally:
        group.remove()


def test_the_command_is_in_the_group_and_nothing_outlives_its_removal(tmp_path):
    group = _group_or_skip(256 * MiB)
    spec = JailSpec(binds=(*python_binds(), Bind(str(tmp_path), writable=True)), uid=65000,
                    cgroup_procs=group.procs_files, die_with_parent=False)
    marker = tmp_path / "groups"
    code = f"open({str(marker)!r}, 'w').write(open('/proc/self/cgroup').read()); import time; time.sleep(600)"
    command = jail_command(spec, [sys.executable, "-c", code])
    os.chown(tmp_path, 65000, 65000)
    proc = subprocess.Popen(command.argv, env=command.env, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not marker.exists() or not marker.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, "the jailed command did not start"
            time.sleep(0.05)
        assert os.path.basename(group.folders[0]) in marker.read_text()
        with open(group.procs_files[0]) as handle:
            assert len(handle.read().split()) >= 3  # the stage, its init and the command
        group.remove()
        assert proc.wait(timeout=10) != 0
        assert not any(os.path.exists(folder) for folder in group.folders)
    finally:
        if proc.poll() is None:
            proc.kill()
        group.remove()


def test_groups_left_by_launchers_that_exited_are_swept():
    group = _group_or_skip(64 * MiB)
    parent = os.path.dirname(group.folders[0])
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = os.path.join(parent, f"{int(dead.stdout)}-0")
    os.mkdir(stale)
    group.remove()
    again = create_cgroup(64 * MiB, None)
    try:
        assert not os.path.exists(stale)
        assert os.path.exists(again.folders[0])  # the launcher's own groups stay
    finally:
        again.remove()


def test_a_cgroup_file_outside_the_cgroup_tree_is_refused():
    with pytest.raises(JailError, match="cgroup.procs"):
        jail_command(JailSpec(cgroup_procs=("/sys/fs/cgroup/../../etc/cgroup.procs",)), ["true"])
    with pytest.raises(JailError, match="cgroup.procs"):
        jail_command(JailSpec(cgroup_procs=("/sys/fs/cgroup/memory/tasks",)), ["true"])
