"""Host timing that holds on a shared machine: a fixed thread count and one CPU for the timed calls.

On the host backend the reference and the candidate child of an evaluation both run torch with
`host_threads` threads (default 1) and, when `host_pin_cpu` is on, every thread of the process on
the same single CPU, chosen by the parent (evaluations started one after another rotate over the
CPUs this process may use). The candidate child reads the state back after each call through
functions bound before candidate code loads; a candidate that changed it is rejected
(`timing_setting`): more threads or more CPUs would buy speed the baseline was not given.
"""

from __future__ import annotations

import itertools
import os
import threading

_next_cpu = itertools.count()
_lock = threading.Lock()
_getters: tuple | None = None  # (torch.get_num_threads, os.sched_getaffinity), bound by pin()


def choose_cpu() -> int | None:
    """The CPU the next evaluation's children run on (None where affinity cannot be set)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    with _lock:
        return cpus[next(_next_cpu) % len(cpus)]


def pin(threads: int, cpu: int | None) -> tuple:
    """Set torch's thread count and, when `cpu` is given, every thread's affinity to it; returns the
    state to compare with later (state())."""
    global _getters
    import torch

    torch.set_num_threads(max(1, int(threads)))
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        for task in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(task), {int(cpu)})
            except OSError:
                pass  # a thread that ended meanwhile
        os.sched_setaffinity(0, {int(cpu)})
    _getters = (torch.get_num_threads, os.sched_getaffinity)
    return state()


def state() -> tuple:
    """(torch threads, CPUs of this thread), read through the getters bound by pin()."""
    if _getters is None:
        return ()
    threads, affinity = _getters
    return threads(), tuple(sorted(affinity(0)))
