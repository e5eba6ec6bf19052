"""Subcommands of this package for the `cuda-agent` command (imports stay light here).

    cuda-agent broker [--bind tcp://127.0.0.1:5555] [--journal PATH] [--curve KEYS] [--service NAME ...]
    cuda-agent worker --service evaluate --gpus 0,1 [--connect ENDPOINT]
    cuda-agent worker --service compile --count 4
    cuda-agent submit TASK.py SOLUTION [--service evaluate] [--backend auto] [--set key=value]
    cuda-agent bridge-status [--endpoint ENDPOINT] [--json]
    cuda-agent keys generate KEYS [--client NAME ...] [--worker NAME ...]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from cuda_agent.contracts import EVALUATOR_HANDLERS, Timeouts

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"
DEFAULT_JOURNAL = Path.home() / ".cache" / "cuda-agent" / "bridge" / "journal.db"
_LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "::1")


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _settings(heartbeat: float, liveness: int, max_attempts: int, max_queue: int, max_message_mb: float,
              time_limit: float, **bounds) -> dict:
    from bridge.settings import MIB

    if heartbeat <= 0 or liveness < 1 or max_attempts < 1 or max_queue < 1 or max_message_mb <= 0 or time_limit <= 0:
        _fail("heartbeat, liveness, max-attempts, max-queue, max-message-mb and time-limit must be positive")
    settings = {"heartbeat_s": heartbeat, "liveness": liveness, "max_attempts": max_attempts, "max_queue": max_queue,
                "max_message_bytes": int(max_message_mb * MIB), "time_limit_s": time_limit}
    if bounds:
        if any(v <= 0 for v in bounds.values()):
            _fail("max-client-jobs, max-client-mb and max-queue-mb must be positive")
        settings.update({"max_client_jobs": int(bounds["max_client_jobs"]),
                         "max_client_bytes": int(bounds["max_client_mb"] * MIB),
                         "max_queue_bytes": int(bounds["max_queue_mb"] * MIB)})
    return settings


def _leaves_host(endpoint: str) -> bool:
    if not endpoint.startswith("tcp://"):
        return False
    host = endpoint[len("tcp://"):].rsplit(":", 1)[0]
    return host not in _LOOPBACK


def _printable(value):
    """A result with bytes (e.g. a built extension) shown as their size, for printing."""
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value)} bytes>"
    if isinstance(value, dict):
        return {k: _printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable(v) for v in value]
    return value


def _curve_client(curve: Optional[Path], name: str):
    if curve is None:
        return None
    from bridge.security import CurveClient

    client = CurveClient.from_dir(curve, name)
    for path in (client.server_public_file, client.secret_key_file):
        if not path.is_file():
            _fail(f"CURVE key file not found: {path} (make keys with `cuda-agent keys generate {curve}`)")
    return client


def _connect(endpoint: str, curve: Optional[Path], curve_name: str, time_limit: Optional[float] = None):
    from bridge.client import BridgeClient

    keys = _curve_client(curve, curve_name)
    try:
        return BridgeClient(endpoint, curve=keys, time_limit=time_limit)
    except RuntimeError as exc:  # the endpoint does not parse
        _fail(str(exc))


def broker(
    bind: List[str] = typer.Option([DEFAULT_ENDPOINT], help="Endpoint(s) to bind: tcp://HOST:PORT or ipc://PATH."),
    journal: Path = typer.Option(DEFAULT_JOURNAL, help="SQLite journal of accepted jobs and undelivered results."),
    curve: Optional[Path] = typer.Option(None, help="Keys folder: enable CURVE (broker.key_secret + authorized/)."),
    heartbeat: float = typer.Option(1.0, help="Heartbeat interval in seconds."),
    liveness: int = typer.Option(3, help="Heartbeats a worker may miss before its jobs are requeued."),
    max_attempts: int = typer.Option(3, help="Attempts per job before it ends as infra_error."),
    max_queue: int = typer.Option(100_000, help="Queued jobs beyond which submissions are answered 'busy'."),
    max_queue_mb: float = typer.Option(4096.0, help="MiB of unfinished jobs beyond which submissions are 'busy'."),
    max_client_jobs: int = typer.Option(50_000, help="Unfinished jobs one client may have; beyond: 'busy'."),
    max_client_mb: float = typer.Option(1024.0, help="MiB of unfinished jobs one client may have; beyond: 'busy'."),
    max_message_mb: float = typer.Option(64.0, help="Largest accepted message, MiB."),
    time_limit: float = typer.Option(Timeouts().worker_job_s, help="Default seconds one evaluation may run."),
    service: List[str] = typer.Option(sorted(EVALUATOR_HANDLERS),
                                      help="Services accepted before a worker registers them (any service a "
                                           "worker registers is added); jobs for other services are refused."),
) -> None:
    """Run the ZeroMQ broker between trainer clients and evaluator workers."""
    import logging

    from bridge.broker import serve_broker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s broker %(levelname)s %(message)s")
    settings = _settings(heartbeat, liveness, max_attempts, max_queue, max_message_mb, time_limit,
                         max_client_jobs=max_client_jobs, max_client_mb=max_client_mb, max_queue_mb=max_queue_mb)
    settings["services"] = tuple(service)
    server = None
    if curve is not None:
        from bridge.security import CurveServer

        server = CurveServer.from_dir(curve)
        missing = server.missing()
        if missing:
            _fail(f"{curve} lacks {', '.join(str(p.relative_to(curve)) for p in missing)} "
                  f"(run `cuda-agent keys generate {curve}`)")
    elif any(_leaves_host(b) for b in bind):
        typer.echo("warning: binding beyond loopback without --curve: anyone who reaches the port can submit "
                   "jobs (see bridge/security.py)", err=True)
    import sqlite3

    import zmq

    from bridge.security import KeyError_

    try:
        serve_broker(bind, journal, settings, server)
    except (zmq.ZMQError, sqlite3.Error, KeyError_, OSError) as exc:  # bind errors, bad journal: one line
        _fail(f"broker cannot start: {exc}")

def worker(
    service: List[str] = typer.Option(["evaluate"], help="Service(s) to serve: evaluate (GPU), compile (CPU)."),
    gpus: Optional[str] = typer.Option(None, help="Comma-separated GPU indices: one worker per GPU."),
    count: int = typer.Option(1, help="Number of CPU workers when --gpus is not given."),
    connect: str = typer.Option(DEFAULT_ENDPOINT, help="Broker endpoint."),
    handler: Optional[str] = typer.Option(None, help="module:function (default: evaluator_cuda.bridge_handlers)."),
    capacity: int = typer.Option(1, help="Jobs a worker holds at once (prefetch)."),
    heartbeat: float = typer.Option(1.0, help="Heartbeat interval in seconds."),
    liveness: int = typer.Option(3, help="Heartbeats the broker may miss before reconnecting."),
    time_limit: float = typer.Option(Timeouts().worker_job_s,
                                     help="Seconds one evaluation may run when the job sets none."),
    curve: Optional[Path] = typer.Option(None, help="Keys folder: connect with CURVE."),
    curve_name: str = typer.Option("worker", help="Which key pair in the keys folder is this worker's."),
) -> None:
    """Run evaluator workers: a torch-free supervisor per GPU, each with one evaluation child."""
    import logging

    from bridge.fleet import handlers_for, run_fleet, worker_slots

    logging.basicConfig(level=logging.INFO, format="%(asctime)s fleet %(levelname)s %(message)s")
    if capacity < 1:
        _fail("--capacity must be at least 1")
    try:
        slots = worker_slots(gpus, count)
        handler_spec = handlers_for(list(service), handler)
    except ValueError as exc:
        _fail(str(exc))
    if gpus and "compile" in service and "evaluate" not in service:
        typer.echo("note: compile workers do not need GPUs; consider --count instead of --gpus", err=True)
    settings = _settings(heartbeat, liveness, 3, 100_000, 64.0, time_limit)
    code = run_fleet(connect, list(service), handler_spec, settings, slots, capacity,
                     _curve_client(curve, curve_name))
    raise typer.Exit(code)

def submit(
    task: Path = typer.Argument(..., help="Task .py (class Model, get_inputs, get_init_inputs)."),
    solution: Path = typer.Argument(..., help="Workspace folder or KernelBench .py defining ModelNew."),
    endpoint: str = typer.Option(DEFAULT_ENDPOINT, help="Broker endpoint."),
    service: str = typer.Option("evaluate", help="evaluate or compile."),
    backend: str = typer.Option(
        "auto", help="auto | cuda | host (auto: the worker's own choice, cuda when it sees a GPU)."),
    set_: List[str] = typer.Option([], "--set", help="Evaluation setting KEY=VALUE (YAML value); only those a job "
                                                     "may set (cuda_agent.contracts.JOB_SETTINGS)."),
    timeout: float = typer.Option(1800.0, help="Seconds to wait for the result."),
    time_limit: Optional[float] = typer.Option(None, help="Seconds the evaluation itself may run."),
    curve: Optional[Path] = typer.Option(None, help="Keys folder: connect with CURVE."),
    curve_name: str = typer.Option("client", help="Which key pair in the keys folder is this client's."),
) -> None:
    """Send one task + solution through the bridge and print the result as JSON."""
    import yaml

    if not task.is_file():
        _fail(f"task file not found: {task}")
    from cuda_agent.contracts import JobError, check_job_settings, read_solution_job

    try:
        solution_job = read_solution_job(solution)
    except JobError as exc:
        _fail(str(exc))
    settings = {"backend": backend}
    for item in set_:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail(f"--set expects KEY=VALUE, got {item!r}")
        settings[key] = yaml.safe_load(value)
    try:
        settings = check_job_settings(settings)
    except JobError as exc:
        _fail(str(exc))
    job = {"task": {"name": task.stem, "source": task.read_text()}, "solution": solution_job, "settings": settings}
    with _connect(endpoint, curve, curve_name, time_limit) as client:
        result = client.run_batch(service, [job], timeout=timeout)[0]
    typer.echo(json.dumps(_printable(result), indent=2, sort_keys=True, default=str))
    if result.get("status") == "infra_error":
        raise typer.Exit(1)

def bridge_status(
    endpoint: str = typer.Option(DEFAULT_ENDPOINT, help="Broker endpoint."),
    as_json: bool = typer.Option(False, "--json", help="Print the raw snapshot as JSON."),
    timeout: float = typer.Option(5.0, help="Seconds to wait for the broker."),
    curve: Optional[Path] = typer.Option(None, help="Keys folder: connect with CURVE."),
    curve_name: str = typer.Option("client", help="Which key pair in the keys folder is this client's."),
) -> None:
    """Show the broker's queue depth, workers, jobs in flight and throughput."""
    from bridge.status import format_status

    with _connect(endpoint, curve, curve_name) as client:
        status = client.status(timeout)
    if status is None:
        _fail(f"no broker answered at {endpoint} within {timeout:g} s", code=1)
    typer.echo(json.dumps(status, indent=2, default=str) if as_json else format_status(status))


def generate(
    directory: Path = typer.Argument(..., help="Folder for the key files."),
    client: List[str] = typer.Option(["client"], help="Client key pairs to make (authorized as clients)."),
    worker: List[str] = typer.Option(["worker"], help="Worker key pairs to make (authorized as workers)."),
    broker: bool = typer.Option(True, help="Make the broker's key pair too (--no-broker: add keys to a folder)."),
) -> None:
    """Make CURVE key pairs and the broker's allow-lists (authorized/clients/, authorized/workers/)."""
    from bridge.security import KeyError_, generate_keys

    if not broker and not (directory / "broker.key").exists():
        typer.echo("note: no broker key in this folder yet; run without --no-broker", err=True)
    try:
        paths = generate_keys(directory, client, worker, broker=broker)
    except KeyError_ as exc:
        _fail(str(exc))
    for path in paths:
        typer.echo(str(path))


def register(app: typer.Typer) -> None:
    """Add this package's commands to the root app."""
    app.command("broker")(broker)
    app.command("worker")(worker)
    app.command("submit")(submit)
    app.command("bridge-status")(bridge_status)
    keys = typer.Typer(help="CURVE keys for the bridge.", no_args_is_help=True)
    keys.command("generate")(generate)
    app.add_typer(keys, name="keys")
