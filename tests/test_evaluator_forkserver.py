"""Reference children forked from the fork server (evaluator_cuda/isolation/forkserver.py): set up as a
fresh reference child would be, holding no descriptor but their own, reporting how they ended, and
falling back to a fresh process whenever the server cannot serve. Jailed children forked from their
own server: tests/test_evaluator_jailed_fork.py."""

import os
import signal
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from evaluator_cuda.evaluation import evaluate  # noqa: E402
from evaluator_cuda.isolation import forkserver, sandbox  # noqa: E402
from evaluator_helpers import AXPY_TASK, build_cache, forking, host, workspace  # noqa: E402, F401


def _forked_child(folder: Path, **kwargs) -> sandbox.Child:
    """A reference child forked by a ready server (the first children start fresh while it imports)."""
    folder.mkdir(exist_ok=True)
    deadline = time.monotonic() + 300
    while True:
        child = sandbox.Child("reference", folder, **kwargs)
        if child.forked:
            return child
        child.close()
        assert time.monotonic() < deadline, "the fork server never became ready"
        time.sleep(0.5)


def _wait_until_ready() -> None:
    deadline = time.monotonic() + 300
    while not all(server.is_ready() for server in forkserver.servers()):
        assert time.monotonic() < deadline, "the fork server never became ready"
        time.sleep(0.2)


def _stat(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()  # state, ppid, pgrp, session, ...


def _descriptors(pid: int) -> dict[int, str]:
    folder = Path(f"/proc/{pid}/fd")
    return {int(name): os.readlink(folder / name) for name in os.listdir(folder)}


def test_a_forked_reference_child_has_its_own_session_folder_log_and_only_its_channel(tmp_path, forking):
    first = _forked_child(tmp_path / "a")
    (tmp_path / "b").mkdir()
    second = sandbox.Child("reference", tmp_path / "b")
    try:
        assert second.forked
        for child in (first, second):  # each answers, then waits for its next request with nothing else open
            assert "unknown command" in child.request({"cmd": "describe_yourself"}, timeout=120)["message"]
        [server] = forkserver.servers()
        for child, folder in ((first, tmp_path / "a"), (second, tmp_path / "b")):
            pid = child.proc.pid
            state = _stat(pid)
            assert int(state[1]) == server.proc.pid  # the server's child, not a fresh process of ours
            assert int(state[2]) == pid and int(state[3]) == pid  # its own process group and session
            assert os.readlink(f"/proc/{pid}/cwd") == str(folder)
            fds = _descriptors(pid)
            assert fds[0] == "/dev/null" and fds[1] == fds[2] == str(folder / "reference.log")
            others = [target for fd, target in fds.items() if fd > 2]
            # its channel only: no other child's descriptors, none of the server's
            assert len(others) == 1 and others[0].startswith("socket:"), fds
    finally:
        first.close()
        second.close()
    assert first.proc.returncode == 0 and second.proc.returncode == 0  # asked to exit, exited


def test_a_forked_child_reports_the_signal_that_ended_it(tmp_path, forking):
    child = _forked_child(tmp_path / "a")
    try:
        os.kill(child.proc.pid, signal.SIGSEGV)
        assert child.proc.wait(timeout=30) == -signal.SIGSEGV
        assert sandbox.describe_exit(child.proc.returncode) == "killed by signal SIGSEGV"
    finally:
        child.close()


def test_an_evaluation_with_a_forked_reference_agrees_with_a_fresh_one(build_cache, tmp_path, monkeypatch):
    forkserver.close_all()
    monkeypatch.setenv(forkserver.FORK_ENV, "0")
    fresh = evaluate(AXPY_TASK, workspace("+"), host(build_cache))
    assert fresh["sandbox"]["reference_forked"] is False
    monkeypatch.setenv(forkserver.FORK_ENV, "1")
    try:
        evaluate(AXPY_TASK, workspace("+"), host(build_cache))  # starts the server for the evaluations' environment
        _wait_until_ready()
        forked = evaluate(AXPY_TASK, workspace("+"), host(build_cache))
        assert forked["sandbox"]["reference_forked"] is True
        for record in (fresh, forked):
            assert record["status"] == "correct" and record["reward"] == 1, record["message"]
        assert forked["checked_calls"] == fresh["checked_calls"]
        wrong = evaluate(AXPY_TASK, workspace("-"), host(build_cache))
        assert wrong["sandbox"]["reference_forked"] is True
        assert wrong["status"] == "incorrect" and wrong["reward"] == -1
    finally:
        forkserver.close_all()


def test_a_dead_server_is_replaced_and_its_children_start_fresh_meanwhile(build_cache, tmp_path, forking):
    evaluate(AXPY_TASK, workspace("+"), host(build_cache))  # starts the servers for the evaluations' environments
    _wait_until_ready()
    dead = forkserver.servers()
    assert len(dead) == 2  # the reference children's and the jailed children's
    for server in dead:
        server.proc.kill()
        server.proc.wait(timeout=30)
    record = evaluate(AXPY_TASK, workspace("+"), host(build_cache))
    assert record["status"] == "correct", record["message"]
    assert record["sandbox"]["reference_forked"] is False and record["sandbox"]["candidate_forked"] is False
    assert not set(dead) & set(forkserver.servers())  # dropped, and new ones started for the next children
    assert len(forkserver.servers()) == 2
