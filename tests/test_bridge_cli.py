"""The bridge's commands, run as real processes: broker, worker fleet, submit, status, keys."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import typer
from typer.testing import CliRunner

from bridge import cli as bridge_cli
from tests.bridge_procs import REPO_ROOT, free_tcp_endpoint, wait_for

# Only this package's commands: the test does not depend on the other packages' CLIs.
_LAUNCH = "import typer, bridge.cli as c; app = typer.Typer(); c.register(app); app()"
FAST = ["--heartbeat", "0.1"]


def _app() -> typer.Typer:
    app = typer.Typer()
    bridge_cli.register(app)
    return app


def _run(*args, timeout=30):
    return subprocess.run([sys.executable, "-c", _LAUNCH, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO_ROOT)


def _spawn(*args, session=False):
    return subprocess.Popen([sys.executable, "-c", _LAUNCH, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": REPO_ROOT},
                            start_new_session=session)


def test_broker_worker_submit_and_status_end_to_end(tmp_path):
    endpoint = free_tcp_endpoint()
    broker = _spawn("broker", "--bind", endpoint, "--journal", str(tmp_path / "j.db"), *FAST)
    fleet = _spawn("worker", "--service", "evaluate", "--count", "2", "--connect", endpoint,
                   "--handler", "tests.bridge_handlers:describe", *FAST)
    try:
        def two_workers():
            out = _run("bridge-status", "--endpoint", endpoint, "--json", "--timeout", "2")
            return out.returncode == 0 and len(json.loads(out.stdout)["workers"]) == 2 and out

        wait_for(two_workers, timeout=30, interval=0.3, what="two workers in bridge-status")
        task = Path(REPO_ROOT) / "examples/tasks/row_softmax.py"
        solution = Path(REPO_ROOT) / "examples/solutions/host/row_softmax"
        submitted = _run("submit", str(task), str(solution), "--endpoint", endpoint, "--backend", "host",
                         "--set", "repeats=3", "--timeout", "20")
        assert submitted.returncode == 0, submitted.stderr
        result = json.loads(submitted.stdout)
        expected_files = {p.relative_to(solution).as_posix(): p.stat().st_size
                          for p in solution.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
        assert result["files"] == expected_files
        assert result["task"] == "row_softmax" and result["task_bytes"] == len(task.read_text())
        assert result["settings"] == {"backend": "host", "repeats": 3}
        text = _run("bridge-status", "--endpoint", endpoint)
        assert "workers: 2" in text.stdout and "completed=1" in text.stdout
        fleet.send_signal(signal.SIGTERM)
        assert fleet.wait(20) == 0
    finally:
        for proc in (fleet, broker):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    assert broker.returncode == 0


def test_user_errors_are_one_line_and_nonzero(tmp_path):
    runner = CliRunner()
    app = _app()
    cases = [
        (["bridge-status", "--endpoint", free_tcp_endpoint(), "--timeout", "0.3"], "no broker answered"),
        (["bridge-status", "--endpoint", "localhost:5555"], "cannot connect to localhost:5555"),
        (["worker", "--gpus", "0,x"], "comma-separated list of device indices"),
        (["worker", "--gpus", "1,1"], "lists a device twice"),
        (["worker", "--service", "train"], "no default handler for service 'train'"),
        (["submit", str(tmp_path / "missing.py"), str(tmp_path)], "task file not found"),
        (["submit", str(Path(REPO_ROOT) / "examples/tasks/row_softmax.py"), str(tmp_path / "nope")], "no such file"),
        (["broker", "--curve", str(tmp_path / "nokeys")], "lacks broker.key_secret, authorized/clients"),
        (["submit", __file__, __file__, "--curve", str(tmp_path)], "CURVE key file not found"),
    ]
    for args, fragment in cases:
        out = runner.invoke(app, args)
        assert out.exit_code != 0, args
        lines = [line for line in out.output.splitlines() if line.strip()]
        assert len(lines) == 1 and fragment in lines[0], (args, out.output)


def test_broker_on_a_taken_port_fails_with_one_line(tmp_path):
    endpoint = free_tcp_endpoint()
    first = _spawn("broker", "--bind", endpoint, "--journal", str(tmp_path / "a.db"))
    try:
        wait_for(lambda: _run("bridge-status", "--endpoint", endpoint, "--timeout", "1").returncode == 0,
                 timeout=20, interval=0.2, what="the first broker")
        second = _run("broker", "--bind", endpoint, "--journal", str(tmp_path / "b.db"))
        assert second.returncode == 2
        assert second.stderr.strip().startswith("error: broker cannot start") and "Traceback" not in second.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(10)


def test_keys_generate_command(tmp_path):
    out = CliRunner().invoke(_app(), ["keys", "generate", str(tmp_path / "k")])
    assert out.exit_code == 0
    assert (tmp_path / "k" / "broker.key_secret").is_file()
    assert (tmp_path / "k" / "authorized" / "workers" / "worker.key").is_file()
    assert (tmp_path / "k" / "authorized" / "clients" / "client.key").is_file()
    both = CliRunner().invoke(_app(), ["keys", "generate", str(tmp_path / "k2"), "--client", "x", "--worker", "x"])
    assert both.exit_code != 0 and "both a client and a worker" in both.output


def test_worker_slots_and_default_handlers():
    from bridge.fleet import handlers_for, worker_slots

    assert worker_slots("0,1, 3", 1) == ["0", "1", "3"]  # one worker per GPU, each its own CUDA_VISIBLE_DEVICES
    assert worker_slots(None, 3) == ["", "", ""]  # CPU workers see no GPU
    assert handlers_for(["evaluate", "compile"], None) == {
        "evaluate": "evaluator_cuda.bridge_handlers:evaluate", "compile": "evaluator_cuda.bridge_handlers:compile"}
    assert handlers_for(["noop"], "bridge.diagnostic_handlers:noop") == {"noop": "bridge.diagnostic_handlers:noop"}


def test_ctrl_c_on_a_fleet_drains_the_running_job(tmp_path):
    """Ctrl-C reaches the fleet and all its supervisors at once; each must drain, not stop dead."""
    from bridge.client import BridgeClient
    from bridge.settings import FAST_TEST_SETTINGS
    from tests.bridge_procs import read_lines, wait_for_workers

    endpoint = free_tcp_endpoint()
    broker = _spawn("broker", "--bind", endpoint, "--journal", str(tmp_path / "j.db"), *FAST)
    fleet = _spawn("worker", "--count", "1", "--connect", endpoint, "--handler", "tests.bridge_handlers:counted",
                   *FAST, session=True)
    counter, started = tmp_path / "counter.txt", tmp_path / "started.txt"
    try:
        with BridgeClient(endpoint, settings=FAST_TEST_SETTINGS) as client:
            wait_for_workers(client, 1, timeout=30)
            future = client.submit_future("evaluate", {"counter_file": str(counter), "start_file": str(started),
                                                       "seconds": 1.0, "tag": "c"}, timeout=30)
            wait_for(lambda: read_lines(started), what="the job to start")
            os.killpg(fleet.pid, signal.SIGINT)  # what a terminal does on Ctrl-C
            result = future.result(timeout=30)
        assert result["status"] == "correct" and len(read_lines(counter)) == 1
        assert fleet.wait(20) == 0
    finally:
        for proc in (fleet, broker):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()


def test_submit_refuses_settings_a_job_may_not_carry(tmp_path):
    """Caches, sandbox limits and grading rules belong to the worker: one clear line and a
    non-zero exit, before anything is sent."""
    task = Path(REPO_ROOT) / "examples/tasks/row_softmax.py"
    solution = Path(REPO_ROOT) / "examples/solutions/host/row_softmax"
    refused = _run("submit", str(task), str(solution), "--endpoint", "tcp://127.0.0.1:9", "--backend", "host",
                   "--set", f"cache_dir={tmp_path}", "--set", "static_checks=false", "--timeout", "5")
    assert refused.returncode == 2
    assert "not settable per job: cache_dir, static_checks" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
