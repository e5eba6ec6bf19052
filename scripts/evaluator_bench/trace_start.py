"""Subcommand `trace_start`: where a candidate child's 4-6 s kernel-trace start goes, and what shortens it.

On the GPU an evaluation's candidate child has its CUDA context 0.3-0.4 s after its start, then starting
the kernel trace (torch.profiler with CUPTI, timing/kernel_trace.py) takes it to 3.8-6.2 s: back to back,
that start is the whole wait for the next pair of children. This times, in fresh processes (each process
as a child would: torch imported, the CUDA context made, then the trace started), the start of the trace
under a few variants:
  evaluator          CPU and CUDA activities, as kernel_trace.start_trace starts it;
  cuda only          the CUDA activity alone (no CPU operator records);
  eager modules      the evaluator's, with CUDA_MODULE_LOADING=EAGER (every module of torch loaded with
                     the context: if CUPTI's start costs per loaded module, this one is slower);
  second start       the evaluator's, stopped and started again in the same process (what is paid once).
For each: seconds to import torch, to make the context, to start the trace, and to run one kernel and
stop it; the CUPTI library the process loaded. Exit status 0 when every run ended, 1 when one failed or
timed out, 2 without a GPU. With $OUT set, writes $OUT/bench_evaluator_trace_start.json.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from evaluator_bench.common import gpu_missing, write_out
from evaluator_bench.report import Clock, fmt

VARIANTS = {  # name: (activities, extra environment, start twice)
    "evaluator": ("cpu,cuda", {}, False),
    "cuda only": ("cuda", {}, False),
    "eager modules": ("cpu,cuda", {"CUDA_MODULE_LOADING": "EAGER"}, False),
    "second start": ("cpu,cuda", {}, True),
}
STEPS = ("import", "context", "trace_start", "kernel_and_stop", "trace_start_again")

PROBE = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
from torch.profiler import ProfilerActivity, profile
activities_arg, times, device = sys.argv[1], sys.argv[2], sys.argv[3]
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
marks = {"import": time.perf_counter() - t0}
t = time.perf_counter()
torch.ones(1, device=device).add_(1)
sync()
marks["context"] = time.perf_counter() - t
kinds = {"cpu": ProfilerActivity.CPU, "cuda": ProfilerActivity.CUDA}
activities = [kinds[k] for k in activities_arg.split(",")]
for attempt in range(2 if times == "twice" else 1):
    t = time.perf_counter()
    prof = profile(activities=activities)
    prof.__enter__()
    marks["trace_start" if attempt == 0 else "trace_start_again"] = time.perf_counter() - t
    t = time.perf_counter()
    torch.ones(1024, device=device).mul_(2)
    sync()
    prof.__exit__(None, None, None)
    if attempt == 0:
        marks["kernel_and_stop"] = time.perf_counter() - t
        marks["kernels_seen"] = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
marks["cupti"] = sorted({p for p in open("/proc/self/maps").read().split() if "cupti" in p})
print(json.dumps(marks))
"""


def add_arguments(parser) -> None:
    parser.add_argument("--repeats", type=int, default=2, help="fresh processes per variant")
    parser.add_argument("--budget-s", type=float, default=150.0, help="skip the remaining runs past this")
    parser.add_argument("--run-timeout-s", type=float, default=60.0, help="one process's limit")


def main(args) -> int:
    import torch

    if gpu_missing("trace_start"):
        return 2
    clock = Clock(args.budget_s)
    results: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    failed = 0
    for repeat in range(args.repeats):
        for name, (activities, env, twice) in VARIANTS.items():
            if clock.remaining() <= 0:
                clock.say(f"budget spent: {name} run {repeat + 1} skipped")
                continue
            marks = _run(activities, env, twice, min(args.run_timeout_s, clock.remaining() + 5))
            failed += "error" in marks
            results[name].append(marks)
            steps = ", ".join(f"{k} {fmt(marks[k], 2)} s" for k in STEPS if k in marks)
            clock.say(f"{name} run {repeat + 1}: {steps}; {marks.get('error') or marks.get('cupti')}")
    _print(results)
    write_out("bench_evaluator_trace_start.json", {"device": torch.cuda.get_device_name(), "runs": results})
    return 1 if failed else 0


def _run(activities: str, env: dict, twice: bool, timeout: float, device: str = "cuda") -> dict:
    """One fresh process's marks (with "error" when it failed or ran past `timeout`); `device` "cpu": a dry run."""
    try:
        done = subprocess.run([sys.executable, "-c", PROBE, activities, "twice" if twice else "once", device],
                              env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {timeout:.0f} s"}
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {(done.stderr.strip().splitlines() or ['no output'])[-1]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _print(results: dict) -> None:
    print(f"\n{'variant':16s} " + " ".join(f"{step:>17s}" for step in STEPS) + "   (median s)")
    for name, runs in results.items():
        cells = []
        for step in STEPS:
            values = [r[step] for r in runs if step in r]
            cells.append(f"{fmt(statistics.median(values), 2) if values else '-':>17s}")
        print(f"{name:16s} " + " ".join(cells))
