"""Candidate children forked from their own server (evaluator_cuda/isolation/forkserver.py,
spawn_jailed) and jailed after the fork: the jail they end up in is the one a fresh child gets (same
uid rules, capabilities, seccomp, namespaces, root folder, descriptors), the planted escapes of
tests/test_evaluator_jail.py fail the same way, and the verdicts agree with a fresh child's."""

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from cuda_agent.jail import Bind  # noqa: E402
from evaluator_cuda.evaluation import evaluate  # noqa: E402
from evaluator_cuda.isolation import forkserver, sandbox  # noqa: E402
from evaluator_helpers import (AXPY_TASK, build_cache, forking, host, model_new_showing,  # noqa: E402, F401
                               model_new_with, workspace)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                reason="the jail's own uid needs root (CI and the GPU machines run as root)")

SECRET = "tok-" + "51d0e6a2c94b7f38"
STATUS_FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")


def _settings(cache, **overrides):
    overrides.setdefault("static_checks", False)
    return host(cache, **overrides)


def _candidate(folder: Path, settings) -> sandbox.Child:
    folder.mkdir(exist_ok=True)
    return sandbox.Child("candidate", folder, guard=sandbox.child_guard(settings), binds=(Bind(str(folder)),))


def _forked_candidate(folder: Path, settings) -> sandbox.Child:
    """A candidate child forked by a ready server (the first ones start fresh while it imports)."""
    deadline = time.monotonic() + 300
    while True:
        child = _candidate(folder, settings)
        if child.forked:
            return child
        child.close()
        assert time.monotonic() < deadline, "the jailed children's server never became ready"
        time.sleep(0.5)


def _warm(cache) -> None:
    """Evaluations from now on get a forked candidate."""
    evaluate(AXPY_TASK, workspace(), _settings(cache))
    deadline = time.monotonic() + 300
    while not all(server.is_ready() for server in forkserver.servers()):
        assert time.monotonic() < deadline, "a fork server never became ready"
        time.sleep(0.2)


def _stat(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()  # state, ppid, pgrp, session, ...


def _children(pid: int) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(_stat(int(entry))[1]) == pid:
                found.append(int(entry))
        except OSError:
            continue
    return found


def _command(child: sandbox.Child) -> int:
    """The jailed command of a child: the stage's grandchild (outer -> init -> command), once its jail is
    complete (the seccomp filter is the last layer)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for init in _children(child.proc.pid):
            for command in _children(init):
                if _status(command).get("Seccomp") == "2":
                    return command
        time.sleep(0.1)
    raise AssertionError("the child's jailed command never appeared")


def _status(pid: int) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return {k: v.strip() for k, v in (line.split(":", 1) for line in text.splitlines() if ":" in line)}


def _jail_of(child: sandbox.Child) -> dict:
    command = _command(child)
    status = _status(command)
    return {
        "uid": status["Uid"].split(), "gid": status["Gid"].split(), "groups": status["Groups"],
        **{name: status[name] for name in STATUS_FIELDS},
        "namespaces_not_ours": sorted(ns for ns in ("mnt", "pid", "net", "ipc", "uts")
                                      if os.readlink(f"/proc/{command}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}")),
        "root": sorted(os.listdir(f"/proc/{command}/root")),
        # standard ones by number, the others by kind (numbers differ: the fork server passes them on)
        "descriptors": sorted((fd if int(fd) < 3 else "other", os.readlink(f"/proc/{command}/fd/{fd}").split(":")[0]
                               .replace(str(child.log_path), "<log>"))
                              for fd in os.listdir(f"/proc/{command}/fd")),
        "cwd": os.readlink(f"/proc/{command}/cwd"),
    }


def test_a_forked_candidate_is_jailed_as_a_fresh_one_is(build_cache, tmp_path, forking, monkeypatch):
    settings = _settings(build_cache)
    forked = _forked_candidate(tmp_path / "forked", settings)
    monkeypatch.setenv(forkserver.FORK_ENV, "0")
    fresh = _candidate(tmp_path / "fresh", settings)
    try:
        assert forked.forked and not fresh.forked
        [server] = [s for s in forkserver.servers() if s.proc.pid == int(_stat(forked.proc.pid)[1])]
        jails = {}
        for name, child in (("forked", forked), ("fresh", fresh)):
            # a reply: its imports are done and it waits for requests (its descriptors stay as they are)
            assert "unknown command" in child.request({"cmd": "describe_yourself"}, timeout=120)["message"]
            jail = _jail_of(child)
            uid = str(child._claimed_uid)
            assert jail.pop("uid") == [uid] * 4 and jail.pop("gid") == [uid] * 4  # its own uid, claimed for it
            assert jail.pop("cwd") == str(tmp_path / name)
            jails[name] = jail
        assert jails["forked"] == jails["fresh"], jails
        jail = jails["forked"]
        assert all(int(jail[cap], 16) == 0 for cap in STATUS_FIELDS[:5]) and jail["groups"] == ""
        assert jail["NoNewPrivs"] == "1" and jail["Seccomp"] == "2"
        assert jail["namespaces_not_ours"] == ["ipc", "mnt", "net", "pid", "uts"]
        assert "home" not in jail["root"] and "usr" in jail["root"] and "tmp" in jail["root"]
        # stdin, the log twice, the channel: nothing of the server's
        assert [kind for _, kind in jail["descriptors"]] == ["/dev/null", "<log>", "<log>", "socket"], jail["descriptors"]
        assert server.proc.poll() is None
    finally:
        forked.close()
        fresh.close()
    assert forked.proc.returncode == 0  # asked to exit: the command's exit, mirrored by the stage


def test_a_forked_candidate_killed_from_outside_reports_its_signal(build_cache, tmp_path, forking):
    child = _forked_candidate(tmp_path / "a", _settings(build_cache))
    try:
        os.kill(child.proc.pid, signal.SIGSEGV)
        assert child.proc.wait(timeout=30) == -signal.SIGSEGV
    finally:
        child.close()


def test_an_evaluation_with_a_forked_candidate_agrees_with_a_fresh_one(build_cache, forking, monkeypatch):
    monkeypatch.setenv(forkserver.FORK_ENV, "0")
    fresh = evaluate(AXPY_TASK, workspace("+"), _settings(build_cache))
    assert fresh["sandbox"]["candidate_forked"] is False
    monkeypatch.setenv(forkserver.FORK_ENV, "1")
    _warm(build_cache)
    forked = evaluate(AXPY_TASK, workspace("+"), _settings(build_cache))
    assert forked["sandbox"]["candidate_forked"] is True
    for record in (fresh, forked):
        assert record["status"] == "correct" and record["reward"] == 1, record["message"]
    assert forked["checked_calls"] == fresh["checked_calls"]
    same = ("jail", "missing", "namespaces", "capabilities", "no_new_privs", "seccomp", "network", "processes", "rlimits")
    moving = ("address_space_bytes", "data_bytes")  # follow the memory the machine has available at the time

    def jail(record):
        kept = {k: record["sandbox"]["jail"][k] for k in same}
        return {**kept, "rlimits": {k: v for k, v in kept["rlimits"].items() if k not in moving}}

    assert jail(forked) == jail(fresh)
    wrong = evaluate(AXPY_TASK, workspace("-"), _settings(build_cache))
    assert wrong["sandbox"]["candidate_forked"] is True
    assert wrong["status"] == "incorrect" and wrong["reward"] == -1


@pytest.fixture(scope="module")
def servers_holding_a_secret(build_cache):
    """Fork servers started (and warm) while the evaluator's environment holds a secret token, shared by
    the probes below: each probe is one evaluation, not a warm-up and a server start as well."""
    with pytest.MonkeyPatch.context() as patch:
        forkserver.close_all()
        patch.setenv(forkserver.FORK_ENV, "1")
        patch.setenv("CUDA_AGENT_TEST_TOKEN", SECRET)
        _warm(build_cache)
        yield
        forkserver.close_all()


@pytest.mark.parametrize("what", ["environment", "process_environment", "secret_file", "processes", "server_memory"])
def test_a_forked_candidate_sees_nothing_of_the_evaluator_or_its_server(build_cache, tmp_path, servers_holding_a_secret,
                                                                        what):
    assert os.environ["CUDA_AGENT_TEST_TOKEN"] == SECRET and os.environ[forkserver.FORK_ENV] == "1"
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    secret.chmod(0o644)
    server_pid = next(s.proc.pid for s in forkserver.servers() if s.proc.args[-1] == forkserver.SERVER_MODULE
                      and "PYTHONNOUSERSITE" in _environ(s.proc.pid))
    expression = {
        "environment": "dict(os.environ)",
        "process_environment": "open('/proc/self/environ').read()",
        "secret_file": f"open({str(secret)!r}).read()",
        "processes": "sorted(int(p) for p in os.listdir('/proc') if p.isdigit())",
        "server_memory": f"open('/proc/{server_pid}/maps').read()",
    }[what]
    record = evaluate(AXPY_TASK, workspace(model_new=model_new_showing(expression)), _settings(build_cache))
    assert record["sandbox"]["candidate_forked"] is True
    text = json.dumps(record)
    assert "SHOWN" in text and SECRET not in text and "CUDA_AGENT_TEST_TOKEN" not in text
    if what == "environment":
        assert "'HOME': '/tmp'" in text
    if what in ("secret_file", "server_memory"):
        assert "refused: FileNotFoundError" in text or "refused: PermissionError" in text, text[:2000]
    if what == "processes":  # its own pid namespace: the jail's init and the command
        assert "SHOWN [1, 2]" in text, text[:2000]
    assert record["status"] == "runtime_error" and record["reward"] == -1


def _environ(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/environ").read_text(errors="replace")
    except OSError:
        return ""


def test_a_forked_candidate_that_kills_what_it_can_reach_harms_only_itself(build_cache, forking):
    _warm(build_cache)
    servers = [s.proc.pid for s in forkserver.servers()]
    forward = ("import os, signal\nos.kill(1, 9)\nos.killpg(0, signal.SIGKILL)\n"
               "return cuda_extension.axpy_forward(x, y, float(self.alpha) + 1.0)")
    settings = _settings(build_cache, call_timeout_extra_s=2.0, first_call_extra_s=2.0)
    record = evaluate(AXPY_TASK, workspace(model_new=model_new_with(forward)), settings)
    assert record["sandbox"]["candidate_forked"] is True
    assert record["status"] in ("runtime_error", "incorrect") and record["reward"] == -1, record["message"]
    assert all(server.proc.poll() is None for server in forkserver.servers())
    assert [s.proc.pid for s in forkserver.servers()] == servers
    after = evaluate(AXPY_TASK, workspace(), _settings(build_cache))
    assert after["status"] == "correct" and after["sandbox"]["candidate_forked"] is True
