"""Handlers that do no evaluation, to check and measure a bridge deployment.

    cuda-agent worker --service noop --handler bridge.diagnostic_handlers:noop

``noop`` answers at once (the bridge's own cost); ``sleep`` waits ``job["seconds"]`` and, when
``job["start_file"]`` is given, first appends "<tag> <pid> <time>" to it (to time a requeue);
``sized`` answers at once with ``job["result_bytes"]`` bytes of padding (a result the size of a real
record) and, when ``job["log_file"]`` is given, first appends "<value>" to it (to count executions).
"""

from __future__ import annotations

import os
import time


def capabilities() -> dict:
    return {"gpu": None, "handler_kind": "diagnostic"}


def noop(job: dict) -> dict:
    return {"status": "correct", "echo": job.get("value")}


def sleep(job: dict) -> dict:
    if job.get("start_file"):
        with open(job["start_file"], "a") as f:
            f.write(f"{job.get('tag')} {os.getpid()} {time.time()}\n")
    time.sleep(float(job.get("seconds", 0.0)))
    return {"status": "correct", "pid": os.getpid()}


def sized(job: dict) -> dict:
    if job.get("log_file"):
        with open(job["log_file"], "a") as f:
            f.write(f"{job.get('value')}\n")
    return {"status": "correct", "echo": job.get("value"), "pad": bytes(int(job.get("result_bytes", 0)))}
