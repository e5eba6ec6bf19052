"""Load test of the bridge at the evaluator fleet's rate, on loopback, with jobs and results of real size.

    python scripts/bench_bridge_load.py                      # the paper's ceiling rate x 1.25, 20 s, then a burst
    python scripts/bench_bridge_load.py --rate 50 --seconds 5 --burst 64

The rate defaults to 1.25 x the ceiling that scripts/size_fleet.py computes for configs/paper.yaml
(every episode evaluating at once, fastest measured evaluation). Two of every three jobs are shaped
like evaluate jobs (sources and a built extension in, a result record out), one like a compile
job (sources in, the extension out); sizes as size_fleet.py measures them. Workers run
`bridge.diagnostic_handlers:sized`, which answers at once and logs each execution, so the run
checks that every job got exactly one result, its own, and ran exactly once. Then `--burst` jobs
are submitted at once (every episode at the same moment). Exit 0 when nothing was lost, crossed
or run twice, 1 otherwise, 2 past --time-limit. With OUT set, writes $OUT/bench_bridge_load.json.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import multiprocessing
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bridge.broker import serve_broker  # noqa: E402
from bridge.client import BridgeClient  # noqa: E402
from bridge.settings import BridgeSettings  # noqa: E402
from bridge.worker import serve_worker  # noqa: E402

SPAWN = multiprocessing.get_context("spawn")
HANDLER = "bridge.diagnostic_handlers:sized"
SERVICE = "sized"


class TimeLimit(Exception):
    pass


def size_fleet_script():
    spec = importlib.util.spec_from_file_location("size_fleet", REPO_ROOT / "scripts" / "size_fleet.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def paper_shapes() -> dict:
    """The ceiling rate for configs/paper.yaml and the job/result sizes of both job kinds."""
    sf = size_fleet_script()
    from cuda_agent.fleet_sizing import size_fleet

    args = sf.parse_args([str(REPO_ROOT / "configs/paper.yaml")])
    sizes = sf.example_job_bytes(args.artifact_bytes)
    work = sf.workload(args, sf.episodes_of(args.config), 0.0, sizes)
    top = size_fleet(sf.Workload(**{**work.__dict__, "evaluation_s": sf.FASTEST_EVALUATION_S}))
    return {"ceiling_jobs_per_s": top.ceiling_jobs_per_s, "episodes": work.episodes,
            "evaluate": (work.evaluate_job_bytes, work.evaluate_result_bytes),
            "compile": (work.compile_job_bytes, work.compile_result_bytes)}


def free_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def start_fleet(workers: int, capacity: int, settings: BridgeSettings, folder: str) -> tuple:
    endpoint = free_endpoint()
    procs = [SPAWN.Process(target=serve_broker, args=(endpoint, f"{folder}/journal.db", settings.to_dict()))]
    procs += [SPAWN.Process(target=serve_worker, args=(endpoint, [SERVICE], HANDLER, settings.to_dict()),
                            kwargs={"gpu": "", "capacity": capacity}) for _ in range(workers)]
    for proc in procs:
        proc.start()
    return endpoint, procs


def stop_fleet(procs: list) -> None:
    for proc in reversed(procs):
        if proc.is_alive():
            proc.terminate()
            proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


def wait_for_workers(client: BridgeClient, count: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        status = client.status(timeout=2)
        if status and len(status["workers"]) >= count:
            return
        time.sleep(0.1)
    raise TimeLimit(f"{count} workers did not register")


def make_job(value: int, shape: tuple, log_file: str) -> dict:
    job_bytes, result_bytes = shape
    return {"value": value, "pad": bytes(max(0, job_bytes - 120)), "result_bytes": result_bytes, "log_file": log_file}


class Run:
    """Jobs sent so far: their values, send and finish times, futures and byte counts."""

    def __init__(self, client: BridgeClient, shapes: dict, log_file: str, deadline: float):
        self.client, self.log_file, self.deadline = client, log_file, deadline
        self.cycle = [shapes["evaluate"], shapes["evaluate"], shapes["compile"]]
        self.sent_at, self.done_at, self.futures, self.shapes = {}, {}, {}, {}
        self.started = time.monotonic()
        self.next_progress = self.started + 2.0

    def submit(self, values: list) -> None:
        jobs = [make_job(v, self.cycle[v % 3], self.log_file) for v in values]
        now = time.perf_counter()
        for v, f in zip(values, self.client.submit_many(SERVICE, jobs, timeout=max(1.0, self.remaining()))):
            self.sent_at[v], self.futures[v], self.shapes[v] = now, f, self.cycle[v % 3]
            f.add_done_callback(lambda _f, v=v: self.done_at.__setitem__(v, time.perf_counter()))

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def progress(self, phase: str, force: bool = False) -> None:
        now = time.monotonic()
        if force or now >= self.next_progress:
            self.next_progress = now + 2.0
            done = len(self.done_at)
            print(f"[{now - self.started:6.1f} s] {phase}: sent {len(self.futures)}, done {done}, "
                  f"in flight {len(self.futures) - done}", flush=True)
        if self.remaining() <= 0:
            raise TimeLimit(f"{phase}: {len(self.futures) - len(self.done_at)} jobs unfinished")

    def wait(self, values, phase: str) -> None:
        while any(v not in self.done_at for v in values):
            self.progress(phase)
            time.sleep(0.05)


def paced(run: Run, rate: float, count: int, first: int = 0) -> list:
    """Submit `count` jobs one by one at `rate` per second and wait for their results."""
    values, start = list(range(first, first + count)), time.perf_counter()
    for i, v in enumerate(values):
        while (delay := start + i / rate - time.perf_counter()) > 0:
            time.sleep(min(delay, 0.002))
        run.submit([v])
        run.progress("paced")
    run.wait(values, "paced")
    return values


def burst(run: Run, count: int, first: int) -> list:
    values = list(range(first, first + count))
    run.submit(values)
    run.wait(values, "burst")
    return values


def executions(log_file: str) -> collections.Counter:
    with open(log_file) as f:
        return collections.Counter(int(line) for line in f if line.strip())


def check(run: Run, values: list) -> dict:
    """Lost (no result), crossed (someone else's result or a failure), run twice or never run."""
    lost = [v for v in values if not run.futures[v].done()]
    crossed = [v for v in values if v not in lost and not _own_result(run.futures[v].result(), run.shapes[v], v)]
    ran = executions(run.log_file)
    return {"jobs": len(values), "lost": len(lost), "crossed": len(crossed),
            "duplicated": sum(1 for v in values if ran[v] > 1), "never_ran": sum(1 for v in values if ran[v] == 0),
            "unknown_runs": sum(1 for v in ran if v not in run.futures)}


def _own_result(result: dict, shape: tuple, value: int) -> bool:
    return result.get("status") == "correct" and result.get("echo") == value and len(result.get("pad", b"")) == shape[1]


def packed_bytes(shape: tuple) -> tuple:
    from bridge.protocol import pack_body

    job = make_job(0, shape, "/tmp/x")
    return len(pack_body(job)), len(pack_body({"status": "correct", "echo": 0, "pad": bytes(shape[1])}))


def percentile_ms(values: list, q: float) -> float:
    values = sorted(values)
    return 1000 * values[min(len(values) - 1, int(q * len(values)))]


def phase_figures(run: Run, values: list, offered: float | None) -> dict:
    latency = [run.done_at[v] - run.sent_at[v] for v in values]
    span = max(run.done_at[v] for v in values) - min(run.sent_at[v] for v in values)
    sizes = {shape: packed_bytes(shape) for shape in set(run.shapes[v] for v in values)}
    sent = sum(sizes[run.shapes[v]][0] for v in values)
    received = sum(sizes[run.shapes[v]][1] for v in values)
    return {"jobs": len(values), "offered_jobs_per_s": offered, "achieved_jobs_per_s": len(values) / span,
            "seconds": span, "job_mb_per_s": sent / span / 1e6, "result_mb_per_s": received / span / 1e6,
            **{f"p{int(q * 100)}_ms": percentile_ms(latency, q) for q in (0.5, 0.9, 0.99)},
            "max_ms": 1000 * max(latency)}


def report(name: str, f: dict) -> str:
    offered = f"offered {f['offered_jobs_per_s']:.1f}/s, " if f["offered_jobs_per_s"] else ""
    return (f"{name}: {f['jobs']} jobs, {offered}achieved {f['achieved_jobs_per_s']:.1f} jobs/s over "
            f"{f['seconds']:.1f} s, jobs {f['job_mb_per_s']:.2f} MB/s in, results {f['result_mb_per_s']:.2f} MB/s out; "
            f"round trip p50 {f['p50_ms']:.1f} ms, p90 {f['p90_ms']:.1f} ms, p99 {f['p99_ms']:.1f} ms, "
            f"max {f['max_ms']:.1f} ms")


def run_load(rate: float, seconds: float, burst_jobs: int, workers: int, capacity: int, time_limit: float,
             shapes: dict, settings: BridgeSettings | None = None) -> dict:
    """Start a broker and workers, drive the paced phase and the burst, check every job; figures."""
    deadline = time.monotonic() + time_limit
    folder = tempfile.mkdtemp(prefix="bench-bridge-load-")
    endpoint, procs = start_fleet(workers, capacity, settings or BridgeSettings(), folder)
    client = BridgeClient(endpoint, settings=settings or BridgeSettings())
    try:
        wait_for_workers(client, workers, deadline)
        run = Run(client, shapes, f"{folder}/executions.log", deadline)
        paced_values = paced(run, rate, max(1, int(rate * seconds)))
        out = {"paced": phase_figures(run, paced_values, rate)}
        if burst_jobs:
            burst_values = burst(run, burst_jobs, first=len(paced_values))
            out["burst"] = phase_figures(run, burst_values, None)
        run.progress("done", force=True)
        out["check"] = check(run, list(run.futures))
        return out
    finally:
        client.close()
        stop_fleet(procs)
        shutil.rmtree(folder, ignore_errors=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, help="jobs per second (default: 1.25 x the paper's ceiling)")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the paced phase")
    parser.add_argument("--burst", type=int, help="jobs submitted at once after it (default: the paper's episodes)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--capacity", type=int, default=32, help="jobs a worker holds at once")
    parser.add_argument("--time-limit", type=float, default=55.0, help="seconds for the whole run")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    shapes = paper_shapes()
    rate = args.rate or 1.25 * shapes["ceiling_jobs_per_s"]
    burst_jobs = shapes["episodes"] if args.burst is None else args.burst
    print(f"model ceiling for configs/paper.yaml: {shapes['ceiling_jobs_per_s']:.1f} jobs/s; offering {rate:.1f} "
          f"jobs/s for {args.seconds:g} s, then a burst of {burst_jobs}; evaluate job/result "
          f"{shapes['evaluate'][0]:,}/{shapes['evaluate'][1]:,} B, compile {shapes['compile'][0]:,}/"
          f"{shapes['compile'][1]:,} B; {args.workers} workers x {args.capacity}", flush=True)
    try:
        out = run_load(rate, args.seconds, burst_jobs, args.workers, args.capacity, args.time_limit, shapes)
    except TimeLimit as exc:
        print(f"FAILED: past the time limit of {args.time_limit:g} s ({exc})")
        return 2
    for phase in ("paced", "burst"):
        if phase in out:
            print(report(phase, out[phase]))
    c = out["check"]
    print(f"check: {c['jobs']} jobs, lost {c['lost']}, crossed {c['crossed']}, run twice {c['duplicated']}, "
          f"never run {c['never_ran']}, unknown runs {c['unknown_runs']}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench_bridge_load.json").write_text(json.dumps(out, indent=1))
    return 0 if not any(c[k] for k in ("lost", "crossed", "duplicated", "never_ran", "unknown_runs")) else 1


if __name__ == "__main__":
    sys.exit(main())
