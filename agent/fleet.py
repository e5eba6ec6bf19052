"""A local evaluator fleet for `solve`/`rollout`/tests: one broker and its workers as child processes.

    with local_fleet(backend="host") as endpoint:
        client = BridgeClient(endpoint) ...

The broker and the workers are the bridge's own (`bridge.broker.serve_broker`,
`bridge.worker.serve_worker`) in separate processes; the agent process itself imports
neither torch nor the evaluator.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from cuda_agent.contracts import EVALUATOR_HANDLERS

EVALUATE_HANDLER = EVALUATOR_HANDLERS["evaluate"]
COMPILE_HANDLER = EVALUATOR_HANDLERS["compile"]


class FleetError(Exception):
    """The local broker or its workers did not come up."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _spawn(code: str, log_path: Path) -> subprocess.Popen:
    log = open(log_path, "ab")
    return subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(process: subprocess.Popen, grace: float = 5.0) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace)
    except (subprocess.TimeoutExpired, ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def wait_for_services(endpoint: str, services: tuple[str, ...], timeout: float, processes: list[subprocess.Popen], log_dir: Path) -> None:
    """Block until the broker lists a worker for every service (or fail with one clear line)."""
    from bridge.client import BridgeClient

    deadline = time.monotonic() + timeout
    with BridgeClient(endpoint) as client:
        while time.monotonic() < deadline:
            for process in processes:
                if process.poll() is not None:
                    raise FleetError(f"a fleet process exited with code {process.returncode} (logs in {log_dir})")
            status = client.status(timeout=2.0) or {}
            offered = {s for worker in status.get("workers", []) for s in worker.get("services", [])}
            if set(services) <= offered:
                return
            time.sleep(0.2)
    raise FleetError(f"evaluator workers for {', '.join(services)} not ready after {timeout:.0f} s (logs in {log_dir})")


@contextlib.contextmanager
def local_fleet(
    backend: str = "host",
    evaluate_workers: int = 1,
    compile_workers: int = 1,
    ready_timeout: float = 180.0,
    log_dir: str | Path | None = None,
    fast_heartbeats: bool = False,
    evaluate_handler: str = EVALUATE_HANDLER,
    compile_handler: str = COMPILE_HANDLER,
) -> Iterator[str]:
    """Start a broker on a free localhost port and workers for `evaluate` and `compile`; yield its endpoint."""
    workdir = Path(tempfile.mkdtemp(prefix="cuda-agent-fleet-"))
    logs = Path(log_dir) if log_dir else workdir
    logs.mkdir(parents=True, exist_ok=True)
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    settings = "FAST_TEST_SETTINGS.to_dict()" if fast_heartbeats else "None"
    # Host-backend workers get no GPU; CUDA workers inherit CUDA_VISIBLE_DEVICES.
    gpu = '""' if backend == "host" else "None"
    processes: list[subprocess.Popen] = []
    failed = True
    try:
        processes.append(
            _spawn(
                "from bridge.broker import serve_broker\nfrom bridge.settings import FAST_TEST_SETTINGS\n"
                f"serve_broker({endpoint!r}, {str(workdir / 'journal.sqlite')!r}, settings={settings})\n",
                logs / "broker.log",
            )
        )
        for service, handler, count, worker_gpu in (
            ("evaluate", evaluate_handler, evaluate_workers, gpu),
            ("compile", compile_handler, compile_workers, '""'),
        ):
            for index in range(count):
                processes.append(
                    _spawn(
                        "from bridge.worker import serve_worker\nfrom bridge.settings import FAST_TEST_SETTINGS\n"
                        f"serve_worker({endpoint!r}, [{service!r}], {handler!r}, settings={settings}, gpu={worker_gpu}, "
                        f"name={f'{service}-{index}'!r})\n",
                        logs / f"worker-{service}-{index}.log",
                    )
                )
        services = tuple(s for s, n in (("evaluate", evaluate_workers), ("compile", compile_workers)) if n > 0)
        wait_for_services(endpoint, services, ready_timeout, processes, logs)
        failed = False
        yield endpoint
    finally:
        for process in reversed(processes):
            _stop(process)
        # Keep the logs of a fleet that failed to start; otherwise only the journal dir goes.
        if log_dir is not None or not failed:
            shutil.rmtree(workdir, ignore_errors=True)
