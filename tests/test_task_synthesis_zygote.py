"""A candidate's in-process checks run in a process of its own, forked from its worker's zygote: what its
code changes there does not reach the next candidate of the same worker; it sees none of the worker's
pipes; one that dies is a `crash`, one that spins past its limit with the alarm blocked is stopped as a
`timeout`, and the candidates after them are judged as before. Plain (unjailed) workers: the jail's own
tests are in test_task_synthesis_jail.py."""

import json
import time

import pytest

from task_synthesis.filter.launch import Launcher, WorkerLimits
from task_synthesis.filter.pool import RECYCLED_AFTER, WorkerPool

from synthesis_helpers import composed_source, filter_job, planted

TAINT = """import torch
import torch.nn.functional as F
torch.set_default_dtype(torch.float64)
torch.set_grad_enabled(False)
F.relu = lambda x: x * 0
torch.manual_seed = lambda seed: None"""
UNTAINTED = """import torch
import torch.nn.functional as F
assert torch.get_default_dtype() == torch.float32, 'default dtype changed'
assert torch.is_grad_enabled(), 'grad mode changed'
assert float(F.relu(torch.ones(1))) == 1.0, 'relu replaced'
assert torch.manual_seed(0) is not None, 'manual_seed replaced'"""


@pytest.fixture
def pool():
    pool = WorkerPool(Launcher("host", False, WorkerLimits(job_timeout_s=120.0)), 1)
    yield pool
    pool.close()


def _verdict(pool, key: str, source: str, **extra) -> dict:
    return pool.submit(filter_job(key, source, **extra)).result(timeout=300)


def test_what_a_candidate_changes_in_its_process_does_not_reach_the_next(pool):
    task = composed_source(0)
    assert _verdict(pool, "2:0", planted(task, "untainted", UNTAINTED))["status"] == "kept"  # the check passes
    tainting = _verdict(pool, "2:1", planted(task, "taint", TAINT))
    assert tainting["stage"] not in RECYCLED_AFTER, tainting  # nothing that would replace the worker
    after = _verdict(pool, "2:2", planted(task, "untainted", UNTAINTED))
    assert after["status"] == "kept", after
    assert len(pool.start_times) == 1  # one worker judged all three


def test_the_candidate_s_process_sees_none_of_the_worker_s_pipes(pool):
    task = composed_source(1)
    look = ("import os\nfds = sorted(int(fd) for fd in os.listdir('/proc/self/fd'))\n"
            "raise RuntimeError('fds ' + repr([(fd, os.readlink(f'/proc/self/fd/{fd}')) for fd in fds\n"
            "                                  if os.path.exists(f'/proc/self/fd/{fd}')]))")
    verdict = _verdict(pool, "2:0", planted(task, "look", look))
    assert verdict["stage"] == "load", verdict
    fds = dict(eval(verdict["reason"].split("fds ", 1)[1]))  # noqa: S307 (a list of pairs written above)
    assert fds[0] == "/dev/null" and fds[1] == fds[2]
    assert [fd for fd, target in fds.items() if fd > 2 and target.startswith("pipe:")] != []  # its own pipe
    assert len([fd for fd in fds if fd > 2]) <= 2, fds  # that pipe, and the folder being listed
    frame = json.dumps({"key": "2:1", "nonce": "forged", "status": "kept", "stage": None, "reason": None})
    forge = (f"import os, struct\nframe = {frame!r}.encode()\nfor fd in range(3, 64):\n"
             "    try:\n        os.write(fd, struct.pack('>I', len(frame)) + frame)\n    except OSError:\n"
             "        pass")
    verdict = _verdict(pool, "2:1", planted(task, "forge", forge))
    assert (verdict["status"], verdict["stage"]) == ("rejected", "crash"), verdict
    assert "something other than its checks' outcome" in verdict["reason"]
    assert _verdict(pool, "2:2", task)["status"] == "kept"


def test_a_candidate_that_dies_is_a_crash_and_one_that_blocks_its_alarm_is_stopped(pool):
    task = composed_source(2)
    suicide = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"
    verdict = _verdict(pool, "2:0", planted(task, "suicide", suicide))
    assert (verdict["stage"], verdict["reason"].split(" before")[0]) == (
        "crash", "the candidate's process was killed by SIGKILL"), verdict
    spin = "import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])\nwhile True:\n    pass"
    begin = time.monotonic()
    verdict = _verdict(pool, "2:1", planted(task, "spin", spin), time_limit_s=1.0)
    assert (verdict["stage"], verdict["reason"]) == ("timeout", "the in-process checks ran past 1 s and were stopped")
    assert time.monotonic() - begin < 60  # the zygote's limit (1 s + its grace), not the pool's 120 s
    assert _verdict(pool, "2:2", task)["status"] == "kept"
