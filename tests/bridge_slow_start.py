"""A handler module whose child takes a while to become ready (like importing torch on a busy host)."""

from __future__ import annotations

import os
import time


def capabilities() -> dict:
    time.sleep(1.0)
    return {"gpu": "none (slow start)"}


def pid(job: dict) -> dict:
    return {"status": "correct", "pid": os.getpid()}
