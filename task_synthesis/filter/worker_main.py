"""A filter worker: `python -m task_synthesis.filter.worker_main`, started by the run's pool (in the jail, or
plainly where the jail is off). It reads jobs as frames (wire.py) on stdin and answers each with its verdict
on stdout, one candidate at a time; the first frame it sends says it is ready. What the candidate's code
prints goes to stderr, which the run only keeps the end of."""

from __future__ import annotations

import os
import sys


def _protocol_fds() -> tuple[int, int]:
    """Private copies of stdin and stdout for the frames; fd 0 then reads nothing, fd 1 goes to stderr."""
    jobs, verdicts = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    return jobs, verdicts


def main() -> None:
    from . import wire
    from .worker import filter_candidate, start_worker

    jobs, verdicts = _protocol_fds()
    start_worker()
    wire.send(verdicts, {"ready": True})
    while True:
        try:
            job = wire.receive(jobs)
        except wire.WireError:  # the run closed the pipe: no more jobs
            break
        verdict = filter_candidate(job)
        verdict["nonce"] = job.get("nonce")
        wire.send(verdicts, verdict)
        sys.stdout.flush()
        sys.stderr.flush()


if __name__ == "__main__":
    main()
