"""Evaluation handlers for the bridge tests: each stands in for one way a real evaluation behaves.

They run inside the worker's evaluation child, loaded by the dotted name
``tests.bridge_handlers:<name>`` (the repository root is on the child's path).
"""

from __future__ import annotations

import os
import signal
import time


def capabilities() -> dict:
    return {"gpu": "none (test handler)", "torch": "not imported"}


def noop(job: dict) -> dict:
    """Returns at once: measures the bridge itself."""
    return {"status": "correct", "echo": job.get("value")}


def square(job: dict) -> dict:
    """A result that depends on the job, to check every result reaches the right caller."""
    return {"status": "correct", "value": job["x"] * job["x"], "pid": os.getpid()}


def pid(job: dict) -> dict:
    """Which child process ran the job (to see a worker recycled)."""
    return {"status": "correct", "pid": os.getpid()}


def counted(job: dict) -> dict:
    """Marks its start, sleeps, then appends one line per completed evaluation to a counter file.

    job: {"counter_file": path, "start_file": path (optional), "seconds": float, "tag": str}
    """
    if job.get("start_file"):
        with open(job["start_file"], "a") as f:
            f.write(f"{job.get('tag')} {os.getpid()} {time.time()}\n")
    time.sleep(job.get("seconds", 0.0))
    with open(job["counter_file"], "a") as f:
        f.write(f"{job.get('tag')} {os.getpid()}\n")
    return {"status": "correct", "tag": job.get("tag"), "pid": os.getpid()}


def gated(job: dict) -> dict:
    """Marks its start, then waits until the test creates job["release_file"]: a job held in flight
    for exactly as long as a test needs (no sleep to tune for a loaded machine).

    job: {"start_file": path, "release_file": path, "counter_file": path (optional), "tag": str}
    """
    with open(job["start_file"], "a") as f:
        f.write(f"{job.get('tag')} {os.getpid()} {time.time()}\n")
    deadline = time.monotonic() + float(job.get("max_wait_s", 300.0))
    while not os.path.exists(job["release_file"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    if job.get("counter_file"):
        with open(job["counter_file"], "a") as f:
            f.write(f"{job.get('tag')} {os.getpid()}\n")
    return {"status": "incorrect", "reward": -1, "verdict": "real", "tag": job.get("tag"), "pid": os.getpid()}


def forged(job: dict) -> dict:
    """What a rogue worker answers for every job: a perfect score it did not earn."""
    return {"status": "correct", "reward": 3, "verdict": "forged"}


def hang(job: dict) -> dict:
    """An evaluation that never returns (a kernel stuck in an infinite loop)."""
    while True:
        time.sleep(1.0)


def crash(job: dict) -> dict:
    """An evaluation that takes its process down (a segfault in a native extension)."""
    os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(5)
    return {"status": "correct"}


def cuda_error(job: dict) -> dict:
    """A result after which the CUDA context is unusable: the worker must be recycled."""
    return {"status": "runtime_error", "needs_recycle": True, "pid": os.getpid()}


def raises(job: dict) -> dict:
    raise ValueError("handler bug")


def not_a_dict(job: dict):
    return 42


def maybe_hang(job: dict) -> dict:
    """Hangs when the job says so, otherwise reports the child's pid."""
    if job.get("hang"):
        hang(job)
    return {"status": "correct", "pid": os.getpid()}


def maybe_crash(job: dict) -> dict:
    """Crashes when the job says so, otherwise reports the child's pid."""
    if job.get("crash"):
        crash(job)
    if job.get("cuda_error"):
        return cuda_error(job)
    return {"status": "correct", "pid": os.getpid()}


def describe(job: dict) -> dict:
    """What arrived: task name, solution files and settings (to check a submitted job end to end)."""
    return {
        "status": "correct",
        "task": job["task"]["name"],
        "task_bytes": len(job["task"]["source"]),
        "format": job["solution"]["format"],
        "files": {name: len(data) for name, data in job["solution"]["files"].items()},
        "settings": job["settings"],
    }
