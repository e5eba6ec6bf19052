"""Candidate code runs only in jailed workers. With the static screen off, planted candidates that
reach for the run's files, the repository, the user's home, the network, memory or other processes
are stopped by the jail and recorded as rejections, and only the run writes its journal; a candidate
whose own process dies or answers with something else is a `crash`; a worker that dies, hangs or
forges its reply makes its candidate a `worker` rejection and is replaced;
without the jail the LLM composer is refused and the programmatic one still runs."""

import json
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cuda_agent.cli import app
from task_synthesis.config import SynthesisConfig
from cuda_agent.jail import cgroup
from task_synthesis.filter.launch import GiB, Launcher, WorkerLimits, jail_problem
from task_synthesis.filter.pool import WorkerPool, WorkersCannotStart
from task_synthesis.filter.replies import MalformedReply, checked_verdict
from task_synthesis.pipeline.journal import journal_path
from task_synthesis.pipeline.outputs import write_parquet
from task_synthesis.pipeline.run import RunOptions, Synthesis

from synthesis_helpers import (SEED, chat_server, chat_settings, composed_source, filter_job,  # noqa: F401
                               planted)  # chat_server is a fixture

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "tasks"
needs_jail = pytest.mark.skipif(jail_problem() is not None, reason=f"no jail here: {jail_problem()}")


class Listener:
    """A TCP server on 127.0.0.1 that counts the connections it accepts."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port, self.accepted = self.sock.getsockname()[1], 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()


def _plants(out: Path, secret: Path, port: int, sentinel: int) -> dict[str, str]:
    forged = json.dumps({"kind": "candidate", "key": "2:999", "status": "kept"})
    frame = json.dumps({"key": "2:6", "nonce": "forged", "status": "kept", "stage": None, "reason": None})
    return {
        "write": f"open({str(out.parent / 'forged.txt')!r}, 'w').write('forged')\n"
                 f"open({str(journal_path(out))!r}, 'a').write({forged!r} + '\\n')",
        "code": f"open({str(ROOT / 'task_synthesis' / 'filter' / 'worker.py')!r}, 'a').write('# changed')",
        "home": f"raise RuntimeError('secret: ' + open({str(secret)!r}).read())",
        "network": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=5).sendall(b'leak')",
        "memory": "import torch\nhoard = torch.empty(2 ** 31)",  # 8 GiB
        "kill": f"import os, signal\nfor pid in ({os.getpid()}, {sentinel}, 1, os.getppid()):\n"
                "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
                "raise RuntimeError('still running')",
        "suicide": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
        "forge": f"import os, struct\nframe = {frame!r}.encode()\nfor fd in range(3, 64):\n"
                 "    try:\n        os.write(fd, struct.pack('>I', len(frame)) + frame)\n    except OSError:\n"
                 "        pass",
    }


@pytest.fixture
def secret_in_home():
    path = Path.home() / f".cuda-agent-synth-test-{uuid.uuid4().hex}"
    path.write_text(f"do-not-leak-{uuid.uuid4().hex}")
    path.chmod(0o600)
    yield path
    path.unlink(missing_ok=True)


def _expect(verdicts: dict, name: str, stages: tuple, *words: str) -> None:
    status, stage, reason = verdicts[name]
    assert status == "rejected" and stage in stages, (name, stage, reason)
    assert all(word in reason for word in words), (name, reason)


@needs_jail
def test_planted_candidates_are_stopped_by_the_jail_and_only_the_run_writes_its_files(
        tmp_path, chat_server, secret_in_home):  # noqa: F811
    out, listener = tmp_path / "out" / "tasks.parquet", Listener()
    sentinel = subprocess.Popen(["sleep", "300"])
    try:
        plants = _plants(out, secret_in_home, listener.port, sentinel.pid)
        replies = [planted(composed_source(i), name, code) for i, (name, code) in enumerate(plants.items())]
        good = composed_source(len(replies))
        server = chat_server([f"```python\n{source}```" for source in [*replies, good]])
        options = RunOptions(out=out, count=1, config=SynthesisConfig(compile=False), seed=SEED, workers=2,
                             backend="host", eval_dir=EXAMPLES, llm=chat_settings(server.url),
                             skip_screen_for_tests_only=True)
        run = Synthesis(options, progress=lambda line: None)
        assert run.jailed
        run.run()
        assert sentinel.poll() is None  # a process of the host the candidates aimed at
    finally:
        sentinel.kill()
        sentinel.wait()
    entries = run.journal.entries
    verdicts = {e["source"].split("\n")[0].removeprefix("# plant: "): (e["status"], e["stage"], e["reason"])
                for e in entries if e["source"].startswith("# plant: ")}
    assert sorted(verdicts) == sorted(plants)
    _expect(verdicts, "write", ("load",), "FileNotFoundError")
    _expect(verdicts, "code", ("load",))  # refused by permissions (another uid) or the read-only bind
    assert verdicts["code"][2].startswith(("PermissionError", "OSError: [Errno 30] Read-only file system"))
    _expect(verdicts, "home", ("load",), "FileNotFoundError")
    _expect(verdicts, "network", ("load",), "ConnectionRefusedError")
    _expect(verdicts, "memory", ("load",), "allocate")
    _expect(verdicts, "kill", ("load", "crash"))  # at most its own process and the worker's zygote
    _expect(verdicts, "suicide", ("crash",), "SIGKILL")
    _expect(verdicts, "forge", ("crash",), "something other than its checks' outcome")  # the run's pipes: not there
    kept = [e for e in entries if e["status"] == "kept"]
    assert [e["source"] for e in kept] == [good] and kept[0]["evaluator_wall_s"] > 0  # the evaluator ran inside
    assert listener.accepted == 0
    assert sorted(p.name for p in out.parent.iterdir()) == [journal_path(out).name]
    lines = journal_path(out).read_text().splitlines()
    assert len(lines) == 1 + len(plants) + 1 and "2:999" not in {json.loads(line).get("key") for line in lines}
    assert secret_in_home.read_text() not in journal_path(out).read_text()
    assert len(run.pool.start_times) >= 3  # the workers of crashed candidates were replaced
    assert write_parquet(entries, out, "host") == 1




def _parents() -> dict[int, int]:
    parents = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return parents


def _worker_processes() -> tuple[list[int], dict[int, int]]:
    """Every process below this one (not the workers of tests running beside it) that runs a worker's
    command line, not the jails' stages: workers, their zygotes and what those forked; and the parents."""
    parents, found = _parents(), []
    for pid in parents:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"task_synthesis.filter.worker_main" not in argv or any(a.endswith(b"_stage.py") for a in argv):
            continue
        up = pid
        while up in parents and up > 1:
            up = parents[up]
            if up == os.getpid():
                found.append(pid)
                break
    return found, parents


def _worker_pids() -> list[int]:
    """The filter workers started by this process (inside their jails), not their zygotes or forks."""
    found, parents = _worker_processes()
    return [pid for pid in found if parents.get(pid) not in found]


def _no_worker_left(timeout_s: float = 30.0) -> None:
    """A closed pool's workers die with their jails (the kernel ends a pid namespace's processes
    shortly after its init)."""
    deadline = time.monotonic() + timeout_s
    while (left := _worker_pids()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, left


def _one_worker(timeout_s: float = 60.0) -> int:
    """The pool's single worker, once the one it replaced has gone."""
    deadline = time.monotonic() + timeout_s
    while len(workers := _worker_pids()) != 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(workers) == 1, workers
    return workers[0]


@needs_jail
def test_a_killed_or_hung_worker_makes_its_candidate_a_worker_rejection_and_is_replaced():
    """And a worker whose candidate ran past the in-process limit is replaced too (its state may be broken)."""
    task = composed_source(0)
    # The hung worker's candidate waits out the job's limit: 8 s, far above what the other jobs take (a
    # kept one about 0.1 s, the asleep one its 1 s limit, the slow one about 1 s until its worker is killed).
    pool = WorkerPool(Launcher("host", True, WorkerLimits(job_timeout_s=8.0)), 1)
    try:
        assert pool.submit(filter_job("2:0", task)).result(timeout=300)["status"] == "kept"
        asleep = planted(task, "asleep", "import time\ntime.sleep(120)")
        verdict = pool.submit(filter_job("2:4", asleep, time_limit_s=1.0)).result(timeout=300)
        assert verdict["stage"] == "timeout" and len(pool.start_times) == 1  # its worker is replaced when next needed
        slow = pool.submit(filter_job("2:1", asleep))
        deadline = time.monotonic() + 300
        while len(pool.start_times) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # the job is sent at once; the candidate now sleeps
        os.kill(_one_worker(), signal.SIGKILL)
        verdict = slow.result(timeout=60)
        assert verdict["stage"] == "worker" and verdict["reason"].startswith("the worker was killed by SIGKILL")
        # It stops its zygote (which would stop it) and blocks its alarm, then waits without end; asleep rather
        # than spinning, so that the 8 s it holds its worker do not take a core from the tests beside it.
        hang = ("import os, signal, time\nos.kill(os.getppid(), signal.SIGSTOP)\n"
                "signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])\nwhile True:\n    time.sleep(1)")
        begin = time.monotonic()
        verdict = pool.submit(filter_job("2:2", planted(task, "hang", hang), time_limit_s=1.0)).result(timeout=300)
        assert (verdict["stage"], verdict["reason"]) == ("worker", "the worker gave no verdict within 8 s")
        assert time.monotonic() - begin < 120
        assert pool.submit(filter_job("2:3", task)).result(timeout=300)["status"] == "kept"
        assert len(pool.start_times) == 4
    finally:
        pool.close()
    _no_worker_left()


REACH = """import os
zygote = os.getppid()
worker = int(open(f'/proc/{zygote}/stat').read().rsplit(')', 1)[1].split()[1])
reached = []
for pid in (zygote, worker):
    for what in ('fd', 'mem'):
        try:
            os.listdir(f'/proc/{pid}/fd') if what == 'fd' else open(f'/proc/{pid}/mem', 'r+b').close()
            reached.append(f'{pid}/{what}')
        except PermissionError:
            pass
raise RuntimeError(f'reached {reached} from {os.getpid()}, zygote {zygote}, worker {worker}')"""


@needs_jail
def test_a_candidate_s_process_cannot_reach_its_worker_or_zygote_through_proc():
    """They share the jail's uid: the worker's pipes to the run (under /proc/PID/fd) and its memory
    (/proc/PID/mem) are closed to the candidate because the worker and the zygote are not dumpable."""
    pool = WorkerPool(Launcher("host", True, WorkerLimits()), 1)
    try:
        verdict = pool.submit(filter_job("2:0", planted(composed_source(4), "reach", REACH))).result(timeout=300)
    finally:
        pool.close()
    assert verdict["stage"] == "load" and verdict["reason"].startswith("RuntimeError: reached [] from "), verdict


DAEMON = """import os, time
if os.fork() == 0:
    os.setsid()  # out of its process group, which the zygote kills
    if os.fork() == 0:
        time.sleep(600)  # handed to the jail's init, a worker_main by its command line
    os._exit(0)"""


@needs_jail
def test_what_a_candidate_leaves_running_is_killed_before_the_next_one_starts():
    """A daemon that left its process group outlives its candidate's process; the worker kills it (and any
    process in its jail that is neither it nor the evaluator's) before the next candidate's checks."""
    def count() -> int:
        return len(_worker_processes()[0])

    def wait_for(done) -> None:
        deadline = time.monotonic() + 30
        while not done() and time.monotonic() < deadline:
            time.sleep(0.1)

    pool = WorkerPool(Launcher("host", True, WorkerLimits()), 1)
    try:
        task = composed_source(5)
        assert pool.submit(filter_job("2:0", planted(task, "daemon", DAEMON))).result(timeout=300)["status"] == "kept"
        wait_for(lambda: count() >= 3)
        assert count() == 3, _worker_processes()  # the worker, its zygote and the daemon
        assert pool.submit(filter_job("2:1", task)).result(timeout=300)["status"] == "kept"
        wait_for(lambda: count() <= 2)
        assert count() == 2 and len(pool.start_times) == 1
    finally:
        pool.close()
    _no_worker_left()


@needs_jail
def test_a_worker_s_memory_group_holds_it_where_the_address_space_is_not_limited():
    """As on cuda (no RLIMIT_AS): a task that fills 4 GiB in a worker held to 2 GiB is killed by the kernel
    inside the worker's group, a `crash` that says so, and the next candidate gets a fresh worker."""
    try:
        cgroup.create_cgroup(GiB, 16).remove()
    except cgroup.CgroupUnavailable as exc:
        pytest.skip(f"no memory cgroup here: {exc}")
    pool = WorkerPool(Launcher("host", True, WorkerLimits(memory_bytes=None, group_memory_bytes=2 * GiB)), 1)
    try:
        task = composed_source(3)
        hog = planted(task, "hog", "import torch\nhoard = torch.ones(2 ** 30)")  # 4 GiB, every page written
        verdict = pool.submit(filter_job("2:0", hog)).result(timeout=300)
        assert verdict["stage"] == "crash", verdict
        assert verdict["reason"].startswith("the candidate's process was killed by SIGKILL")
        assert verdict["reason"].endswith("(at the worker's memory limit of 2 GiB)")
        assert pool.submit(filter_job("2:1", task)).result(timeout=300)["status"] == "kept"
        assert len(pool.start_times) == 2
    finally:
        pool.close()
    _no_worker_left()


def test_workers_that_cannot_start_reject_their_candidates_then_end_the_run(monkeypatch):
    monkeypatch.setattr("task_synthesis.filter.launch.WORKER_ARGV",
                        ("-c", "import sys; sys.stderr.write('no torch here\\n'); sys.exit(3)"))
    pool = WorkerPool(Launcher("host", False, WorkerLimits()), 1)
    try:
        for key in ("2:0", "2:1"):
            verdict = pool.submit(filter_job(key, composed_source(0))).result(timeout=60)
            assert verdict == {"status": "rejected", "stage": "worker",
                               "reason": "the worker did not start: the worker exited with status 3 (no torch here)"}
        with pytest.raises(WorkersCannotStart, match="failed to start 3 times in a row; the last: the worker exited"):
            pool.submit(filter_job("2:2", composed_source(0))).result(timeout=60)
    finally:
        pool.close()


STUBBORN_WORKER = """
import signal, sys, time
from task_synthesis.filter import wire
signal.signal(signal.SIGTERM, signal.SIG_IGN)
wire.send(1, {"ready": True})
time.sleep(600)
"""


def test_stop_kills_a_worker_that_ignores_sigterm_after_the_grace(monkeypatch):
    monkeypatch.setattr("task_synthesis.filter.launch.WORKER_ARGV", ("-c", STUBBORN_WORKER))
    pool = WorkerPool(Launcher("host", False, WorkerLimits(job_timeout_s=600)), 1)
    verdict = pool.submit(filter_job("2:0", composed_source(0)))
    deadline = time.monotonic() + 60
    while not pool.start_times and time.monotonic() < deadline:  # its ready frame: SIGTERM is ignored by then
        time.sleep(0.05)
    (worker,) = pool._live
    begin = time.monotonic()
    pool.stop(grace_s=1.0)
    took = time.monotonic() - begin
    assert worker.process.poll() == -signal.SIGKILL  # SIGTERM was ignored: killed once the grace ran out
    assert 1.0 <= took < 60
    assert verdict.result(timeout=60)["stage"] == "worker"  # the job in flight ends as the worker's fault


def test_the_cuda_workers_jail_shows_the_gpu_and_sets_no_address_space_limit(monkeypatch):
    import cuda_agent.jail as jail

    from task_synthesis.filter.launch import evaluator_inside, worker_spec

    monkeypatch.setattr(jail, "gpu_devices", lambda: ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"))
    monkeypatch.setattr(jail, "nvidia_library_binds", lambda: (jail.Bind("/opt/nvidia-driver/lib"),))
    cuda, host = WorkerLimits.for_backend("cuda"), WorkerLimits.for_backend("host")
    spec = worker_spec("cuda", cuda, 400_001)
    assert spec.devices == ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm")
    assert spec.limits.address_space_bytes is None
    assert jail.Bind("/opt/nvidia-driver/lib") in spec.binds and not any(b.writable for b in spec.binds)
    plain = worker_spec("host", host, 400_001)
    assert plain.devices == () and plain.limits.address_space_bytes == 8 * 1024**3 and not plain.share_network
    inside = evaluator_inside({"backend": "cuda", "child_memory_bytes": None}, cuda)
    assert inside["jail_children"] is False and inside["child_memory_bytes"] is None
    assert evaluator_inside({"backend": "host", "child_memory_bytes": None}, host)["child_memory_bytes"] == 8 * 1024**3


@pytest.mark.parametrize("reply, problem", [
    ({"key": "2:0", "nonce": "n", "status": "kept", "stage": None, "reason": None, "shell": "rm -rf /"},
     "unknown fields shell"),
    ({"key": "2:1", "nonce": "n", "status": "kept", "stage": None, "reason": None}, "another job"),
    ({"key": "2:0", "nonce": "n", "status": "kept", "stage": "load", "reason": None}, "is not a verdict"),
    ({"key": "2:0", "nonce": "n", "status": "rejected", "stage": "duplicate", "reason": "x"}, "is not a verdict"),
    ({"key": "2:0", "nonce": "n", "status": "rejected", "stage": "load", "reason": "x" * 5000}, "a rejection"),
    ({"key": "2:0", "nonce": "n", "status": "kept", "stage": None, "reason": None, "eager_ms": "fast"}, "eager_ms"),
    ({"key": "2:0", "nonce": "n", "status": "kept", "stage": None, "reason": None, "output_shape": [2, -1]},
     "output_shape"),
])
def test_a_reply_that_is_not_a_verdict_on_its_job_is_refused(reply, problem):
    with pytest.raises(MalformedReply, match=problem):
        checked_verdict(reply, {"key": "2:0", "nonce": "n"})
    good = {"key": "2:0", "nonce": "n", "status": "rejected", "stage": "window", "reason": "slow", "eager_ms": 99.5}
    assert checked_verdict(good, {"key": "2:0", "nonce": "n"}) == {
        "status": "rejected", "stage": "window", "reason": "slow", "eager_ms": 99.5}


def test_without_the_jail_the_llm_composer_is_refused_and_the_programmatic_one_runs(tmp_path, monkeypatch,
                                                                                     chat_server):  # noqa: F811
    monkeypatch.setattr("task_synthesis.pipeline.run.jail_problem", lambda: "no namespaces here (test)")
    server = chat_server([])
    server.close()
    args = ["data", "synthesize", "--out", str(tmp_path / "llm.parquet"), "--count", "2", "--backend", "host",
            "--composer", "llm", "--base-url", server.url, "--model", "m", "--retries", "0"]
    refused = CliRunner().invoke(app, args)
    errors = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.exit_code == 2 and len(errors) == 1, refused.output
    assert errors[0].startswith("error: --composer llm runs a model's code only in jailed workers")
    assert "no namespaces here (test)" in errors[0] and "--unjailed-workers" in errors[0]
    opted_out = CliRunner().invoke(app, [*args, "--unjailed-workers"])  # past the jail: the endpoint fails
    lines = [line for line in opted_out.stderr.splitlines() if line.strip()]
    assert opted_out.exit_code == 3 and lines[0].startswith("warning: --unjailed-workers"), opted_out.output
    options = RunOptions(out=tmp_path / "p.parquet", count=2, config=SynthesisConfig(evaluator=False, compile=False),
                         seed=SEED, workers=1, backend="host")
    run = Synthesis(options, progress=lambda line: None)
    assert not run.jailed and run.jail_note.startswith("note: the filter's workers run unjailed")
    assert sum(run.run().values()) == 2


def test_the_gpus_are_found_in_the_environment_or_counted_by_the_driver():
    from task_synthesis.filter.launch import visible_gpus

    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 5"}, lambda: 8) == ("2", "5")
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, lambda: 1) == ()
    assert visible_gpus({}, lambda: 2) == ("0", "1")


@pytest.mark.parametrize("jailed", [False, pytest.param(True, marks=needs_jail)])
def test_cuda_workers_are_spread_over_the_gpus_by_slot(monkeypatch, jailed):
    monkeypatch.setattr("task_synthesis.filter.launch.WORKER_ARGV",
                        ("-c", "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'))"))
    seen = []
    for gpus, slot in [(("3", "5"), 0), (("3", "5"), 1), (("3", "5"), 2), (("3",), 1)]:
        launcher = Launcher("cuda", jailed, WorkerLimits.for_backend("cuda", group_memory_bytes=None), gpus=gpus)
        started = launcher.start(slot)
        try:
            out, _ = started.process.communicate(timeout=60)
        finally:
            launcher.release(started)
        seen.append(out.decode().strip().splitlines()[-1])
    outside = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
    assert seen == ["3", "5", "3", outside]  # one GPU: the environment's choice is kept
