#!/usr/bin/env python
"""Figures for the bridge: no-op throughput and round trips, SIGKILL-to-requeue time, and the
bridge's share of a real evaluation's wall time.

    python scripts/bench_bridge.py                       # no-op figures + requeue time (any machine)
    python scripts/bench_bridge.py --real-task examples/tasks/row_softmax.py \
        --real-solution examples/solutions/cuda/row_softmax --backend cuda     # + real evaluation share

Goals: >= 5,000 no-op jobs/s and p99 round trip <= 5 ms on a 2-core machine; the bridge
<= 1 % of a real evaluation's wall time. Every job's result is checked (the echo of its input),
so a lost, duplicated or crossed result fails the run. With OUT set, writes $OUT/bench_bridge.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bridge.client import BridgeClient  # noqa: E402
from bridge.settings import BridgeSettings, FAST_TEST_SETTINGS  # noqa: E402

SPAWN = multiprocessing.get_context("spawn")


def free_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _broker(bind, journal, settings):
    from bridge.broker import serve_broker

    serve_broker(bind, journal, settings)


def _worker(endpoint, service, handler, settings, capacity, gpu):
    from bridge.worker import serve_worker

    serve_worker(endpoint, [service], handler, settings, gpu=gpu, capacity=capacity)


class Fleet:
    """A broker and some workers in their own processes, stopped on exit."""

    def __init__(self, settings: BridgeSettings, workers: int, handler: str, service: str, capacity: int,
                 gpu: str | None = ""):
        self.tmp = tempfile.mkdtemp(prefix="bench-bridge-")
        self.endpoint = free_endpoint()
        self.settings = settings
        self.broker = SPAWN.Process(target=_broker, args=(self.endpoint, f"{self.tmp}/journal.db", settings.to_dict()))
        self.broker.start()
        self.workers = [
            SPAWN.Process(target=_worker, args=(self.endpoint, service, handler, settings.to_dict(), capacity, gpu))
            for _ in range(workers)
        ]
        for w in self.workers:
            w.start()
        self.client = BridgeClient(self.endpoint, settings=settings)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            status = self.client.status(timeout=2)
            if status and len(status["workers"]) == workers:
                return
            time.sleep(0.1)
        raise RuntimeError("workers did not register within 300 s")

    def close(self):
        self.client.close()
        for proc in self.workers + [self.broker]:
            if proc.is_alive():
                proc.terminate()
                proc.join(10)
            if proc.is_alive():
                proc.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_of(pid: int) -> list:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if _parent_of(int(entry)) == pid:
                    kids.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return kids


def role_pids(fleet) -> dict:
    """Processes by role: the broker, the worker supervisors, their evaluation children, this client."""
    supervisors = [w.pid for w in fleet.workers]
    return {"broker": [fleet.broker.pid], "worker supervisors": supervisors,
            "evaluation children": [k for s in supervisors for k in children_of(s)], "client": [os.getpid()]}


def cpu_snapshot(roles: dict) -> dict:
    return {role: sum(cpu_seconds(p) for p in pids) for role, pids in roles.items()}


def percentiles_ms(seconds: list) -> dict:
    values = sorted(seconds)

    def pick(q):
        return 1000 * values[min(len(values) - 1, int(q * len(values)))]

    return {"p50_ms": pick(0.50), "p99_ms": pick(0.99), "max_ms": 1000 * values[-1], "n": len(values)}


def check_echoes(results: list, values: list) -> None:
    bad = [i for i, (r, v) in enumerate(zip(results, values)) if r.get("status") != "correct" or r.get("echo") != v]
    if bad:
        raise SystemExit(f"FAILED: {len(bad)} of {len(values)} results missing or crossed (first: {results[bad[0]]})")


def timed_batch(client: BridgeClient, values: list, tag: str) -> tuple[float, list]:
    """Submit all at once; returns (wall seconds, per-job seconds from submission to result)."""
    done_at = [0.0] * len(values)
    start = time.perf_counter()
    futures = client.submit_many("noop", [{"value": v, "tag": tag} for v in values], timeout=600)
    for i, f in enumerate(futures):
        f.add_done_callback(lambda _f, i=i: done_at.__setitem__(i, time.perf_counter()))
    results = [f.result() for f in futures]
    wall = time.perf_counter() - start
    check_echoes(results, values)
    return wall, [t - start for t in done_at]


def paced(client: BridgeClient, rate: float, count: int, tag: str) -> list:
    """Submit ``count`` jobs one by one at ``rate`` per second; returns round trips in seconds."""
    sent_at, done_at, futures = [0.0] * count, [0.0] * count, []
    start = time.perf_counter()
    for i in range(count):
        target = start + i / rate
        while (now := time.perf_counter()) < target:
            time.sleep(min(target - now, 0.001))
        sent_at[i] = time.perf_counter()
        future = client.submit_future("noop", {"value": i, "tag": tag}, timeout=600)
        future.add_done_callback(lambda _f, i=i: done_at.__setitem__(i, time.perf_counter()))
        futures.append(future)
    results = [f.result() for f in futures]
    check_echoes(results, list(range(count)))
    return [d - s for d, s in zip(done_at, sent_at)]


def bench_noop(args) -> dict:
    settings = BridgeSettings()
    out = {}
    with Fleet(settings, args.workers, "bridge.diagnostic_handlers:noop", "noop", args.prefetch) as fleet:
        timed_batch(fleet.client, list(range(2000)), "warmup")
        roles = role_pids(fleet)
        walls, before = [], cpu_snapshot(roles)
        for rep in range(args.repeats):
            wall, per_job = timed_batch(fleet.client, list(range(args.jobs)), f"sat{rep}")
            walls.append(wall)
        after = cpu_snapshot(roles)
        done = args.jobs * args.repeats
        cpu_us = {role: 1e6 * (after[role] - before[role]) / done for role in roles}
        out["saturation"] = {"jobs": args.jobs, "workers": args.workers, "prefetch": args.prefetch,
                             "jobs_per_s": args.jobs / statistics.median(walls),
                             "best_jobs_per_s": args.jobs / min(walls), **percentiles_ms(per_job)}
        # Load-independent view: CPU microseconds per job by role, and the rate the broker (one
        # thread, the serial part) and the whole bridge (all roles on os.cpu_count() cores) allow.
        out["cpu_us_per_job"] = cpu_us
        out["bounds"] = {"broker_bound_jobs_per_s": 1e6 / max(cpu_us["broker"], 1e-9),
                         "all_roles_on_all_cores_jobs_per_s": os.cpu_count() * 1e6 / max(sum(cpu_us.values()), 1e-9),
                         "load_average_1min": os.getloadavg()[0]}
        for rate in args.rates:
            count = int(min(args.latency_jobs, rate * args.latency_seconds))
            out[f"rate_{rate:g}"] = {"rate": rate, **percentiles_ms(paced(fleet.client, rate, count, f"r{rate}"))}
    # One worker holding one job at a time: the bridge's per-job cost without prefetch.
    with Fleet(settings, 1, "bridge.diagnostic_handlers:noop", "noop", 1) as fleet:
        wall, per_job = timed_batch(fleet.client, list(range(args.jobs // 4)), "serial")
        out["one_worker_no_prefetch"] = {"jobs_per_s": (args.jobs // 4) / wall}
        rtts = paced(fleet.client, 100, 300, "serial-rtt")
        out["one_worker_no_prefetch"].update(percentiles_ms(rtts))
    return out


def bench_requeue(settings: BridgeSettings, label: str) -> dict:
    """Seconds from SIGKILL of the worker holding a job to that job starting on the other worker."""
    with Fleet(settings, 2, "bridge.diagnostic_handlers:sleep", "sleep", 1) as fleet:
        start_file = Path(fleet.tmp) / "started.txt"
        future = fleet.client.submit_future("sleep", {"seconds": 3.0, "start_file": str(start_file), "tag": label},
                                            timeout=120)
        lines = _wait_lines(start_file, 1)
        child_pid = int(lines[0].split()[1])
        victim = _parent_of(child_pid)
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        lines = _wait_lines(start_file, 2)
        restarted_at = float(lines[1].split()[2])
        result = future.result()
        if result.get("status") != "correct":
            raise SystemExit(f"FAILED: requeued job ended {result}")
        return {"settings": f"heartbeat {settings.heartbeat_s:g} s x liveness {settings.liveness}",
                "kill_to_restart_s": restarted_at - killed_at}


def _wait_lines(path: Path, n: int, timeout: float = 120.0) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            lines = path.read_text().splitlines()
            if len(lines) >= n:
                return lines
        time.sleep(0.01)
    raise SystemExit(f"FAILED: {n} start lines not seen in {path}")


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def bench_real(args) -> dict:
    """A real evaluate job through broker + worker vs evaluator_cuda.service.evaluate_job directly."""
    from evaluator_cuda.service import evaluate_job
    from evaluator_cuda.solutions import read_solution

    task = Path(args.real_task)
    job = {"task": {"name": task.stem, "source": task.read_text()},
           "solution": read_solution(args.real_solution).to_job(), "settings": {"backend": args.backend}}
    t = time.perf_counter()
    first = evaluate_job(job)  # warm the build and baseline caches
    direct_cold = time.perf_counter() - t
    direct = []
    for _ in range(args.real_repeats):
        t = time.perf_counter()
        record = evaluate_job(job)
        direct.append(time.perf_counter() - t)
    gpu = "0" if args.backend == "cuda" else ""
    bridge_rt, inner, statuses = [], [], []
    with Fleet(BridgeSettings(), 1, "evaluator_cuda.bridge_handlers:evaluate", "evaluate", 1, gpu=gpu) as fleet:
        fleet.client.run_batch("evaluate", [job], timeout=1800, salt="warmup")
        for rep in range(args.real_repeats):
            t = time.perf_counter()
            result = fleet.client.run_batch("evaluate", [job], timeout=1800, salt=f"rep{rep}")[0]
            bridge_rt.append(time.perf_counter() - t)
            inner.append(float((result.get("wall_s") or {}).get("total") or "nan"))
            statuses.append(result.get("status"))
    overhead = [rt - w for rt, w in zip(bridge_rt, inner)]
    return {
        "task": task.stem, "backend": args.backend, "status_direct": record.get("status"),
        "status_first": first.get("status"), "status_bridge": statuses,
        "direct_cold_s": direct_cold, "direct_median_s": statistics.median(direct),
        "bridge_median_s": statistics.median(bridge_rt), "evaluator_wall_in_worker_median_s": statistics.median(inner),
        "bridge_overhead_median_ms": 1000 * statistics.median(overhead),
        "bridge_share_pct": 100 * statistics.median(o / rt for o, rt in zip(overhead, bridge_rt)),
        "share_vs_direct_pct": 100 * max(0.0, statistics.median(bridge_rt) - statistics.median(direct))
        / statistics.median(bridge_rt),
    }


def table(results: dict) -> str:
    rows = []
    noop = dict(results.get("noop", {}))
    cpu, bounds = noop.pop("cpu_us_per_job", None), noop.pop("bounds", None)
    for name, r in noop.items():
        rate = f"{r['jobs_per_s']:.0f} jobs/s" if "jobs_per_s" in r else f"offered {r['rate']:g}/s"
        rows.append(f"noop {name:<24} {rate:>16}   p50 {r['p50_ms']:8.2f} ms   p99 {r['p99_ms']:8.2f} ms")
    if cpu:
        rows.append("noop CPU per job: " + ", ".join(f"{role} {us:.0f} us" for role, us in cpu.items()))
        rows.append(f"noop rate allowed by CPU: broker alone {bounds['broker_bound_jobs_per_s']:.0f} jobs/s, all roles "
                    f"on {os.cpu_count()} cores {bounds['all_roles_on_all_cores_jobs_per_s']:.0f} jobs/s "
                    f"(load average during run {bounds['load_average_1min']:.1f})")
    for r in results.get("requeue", []):
        rows.append(f"SIGKILL -> job restarted      {r['kill_to_restart_s']:8.3f} s   ({r['settings']})")
    if "real" in results:
        r = results["real"]
        rows.append(f"real {r['task']} [{r['backend']}]: direct {r['direct_median_s']:.3f} s, through bridge "
                    f"{r['bridge_median_s']:.3f} s, in-worker {r['evaluator_wall_in_worker_median_s']:.3f} s, "
                    f"bridge overhead {r['bridge_overhead_median_ms']:.2f} ms = {r['bridge_share_pct']:.3f} % "
                    f"(vs direct: {r['share_vs_direct_pct']:.2f} %); statuses {r['status_direct']}/{r['status_bridge']}")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20000, help="no-op jobs per saturation run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--prefetch", type=int, default=256, help="jobs a no-op worker holds at once")
    parser.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[200.0, 1000.0])
    parser.add_argument("--latency-jobs", type=int, default=3000)
    parser.add_argument("--latency-seconds", type=float, default=3.0)
    parser.add_argument("--skip-noop", action="store_true")
    parser.add_argument("--skip-requeue", action="store_true")
    parser.add_argument("--real-task")
    parser.add_argument("--real-solution")
    parser.add_argument("--backend", default="cuda", choices=["cuda", "host"])
    parser.add_argument("--real-repeats", type=int, default=3)
    args = parser.parse_args()

    results = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    if not args.skip_noop:
        results["noop"] = bench_noop(args)
    if not args.skip_requeue:
        results["requeue"] = [bench_requeue(FAST_TEST_SETTINGS, "fast"), bench_requeue(BridgeSettings(), "default")]
    if args.real_task:
        results["real"] = bench_real(args)
    print(table(results))
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / "bench_bridge.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2, default=str))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
