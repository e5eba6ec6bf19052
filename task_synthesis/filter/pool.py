"""The run's filter workers: `count` long-lived worker processes (launch.py starts each, jailed by default),
each fed one candidate at a time by a thread of the run that owns it.

A worker that dies, hangs past `job_timeout_s`, breaks the framing or sends something that is not a
verdict on the job it was given makes that candidate a `worker` rejection; it is killed (its whole
jail) and the next candidate gets a fresh one. A worker that cannot start makes its candidate a
`worker` rejection too, and three failed starts in a row end the run (WorkersCannotStart). stop()
ends every worker: SIGTERM first (each exits through Python, closing the evaluator's children),
SIGKILL to the process group after a grace period.
"""

from __future__ import annotations

import collections
import os
import queue
import secrets
import signal
import subprocess
import threading
import time
from concurrent.futures import Future

from . import wire
from .launch import Launcher, Started
from .replies import MalformedReply, checked_verdict, worker_rejection
from .zygote import describe_exit

FAILED_STARTS_ALLOWED = 3
# stages after which the worker may be broken (its zygote gone, a fault of its own): a fresh one next
RECYCLED_AFTER = ("timeout", "crash", "filter_error")
STDERR_TAIL_BYTES = 4096


class WorkersCannotStart(RuntimeError):
    """Workers failed to start several times in a row; str() is one line."""


class WorkerStartFailed(Exception):
    pass


class Worker:
    """One started worker: its pipes, and the end of what it wrote on stderr (read by a thread, bounded)."""

    def __init__(self, started: Started):
        self.started, self.process = started, started.process
        self._tail: collections.deque = collections.deque(maxlen=STDERR_TAIL_BYTES)
        self._drain = threading.Thread(target=self._read_stderr, daemon=True)
        self._drain.start()

    def _read_stderr(self) -> None:
        while chunk := os.read(self.process.stderr.fileno(), 4096):
            self._tail.extend(chunk)

    def last_line(self) -> str:
        lines = bytes(self._tail).decode(errors="replace").strip().splitlines()
        return lines[-1][:160] if lines else ""

    def why(self, error: Exception) -> str:
        """Why the worker gave no verdict: how it ended (or the wire's complaint) and its last line on stderr."""
        try:
            code = self.process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            code = None
        what = f"the worker {describe_exit(code)}" if code is not None else f"the worker's reply: {error}"
        if code is not None:  # what it wrote before it exited may still be on its way to the reading thread
            self._drain.join(timeout=1.0)
        line = self.last_line()
        return f"{what} ({line})" if line else what

    def signal(self, signum: int) -> None:
        """`signum` to the worker (a jail forwards it to the worker inside); SIGKILL to its whole process group."""
        try:
            if signum == signal.SIGKILL:
                os.killpg(self.process.pid, signum)
            else:
                self.process.send_signal(signum)
        except (ProcessLookupError, PermissionError):
            pass

    def end(self, launcher: Launcher, grace_s: float) -> None:
        """No more jobs: the worker exits on its own within `grace_s`, else it is killed; its uid is freed."""
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        self.signal(signal.SIGKILL)
        self.process.wait()
        self._drain.join(timeout=5.0)
        self.process.stderr.close()
        launcher.release(self.started)


# A stopped run's workers get this long to exit through Python (closing the evaluator's children) before
# they are killed. What they were filtering is lost either way (the journal keeps only decisions), and a
# supervisor rarely waits long after its SIGTERM (`timeout -k 10`, `docker stop`: 10 s); on an H200 with 26
# workers, 20 s of grace outlasted the 10 s that `timeout` gave the whole run.
STOP_GRACE_S = 5.0


class WorkerPool:
    def __init__(self, launcher: Launcher, count: int):
        self.launcher = launcher
        self.jobs: queue.Queue = queue.Queue()
        self.start_times: list[float] = []
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._live: set[Worker] = set()
        self._failed_starts = 0
        self._slots = [_Slot(self, index) for index in range(count)]
        for slot in self._slots:
            slot.start()

    def submit(self, job: dict) -> Future:
        """The verdict on `job` (checked: replies.checked_verdict) or a `worker` rejection, as a Future."""
        future: Future = Future()
        self.jobs.put(({**job, "nonce": secrets.token_hex(8)}, future))
        return future

    def close(self) -> None:
        """Every job done: the workers exit through Python."""
        for _ in self._slots:
            self.jobs.put(None)
        for slot in self._slots:
            slot.join()

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """End every worker now (SIGTERM, then SIGKILL after `grace_s`); jobs not started are cancelled."""
        self.stopping.set()
        while True:
            try:
                item = self.jobs.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[1].cancel()
        with self._lock:
            live = list(self._live)
        for worker in live:
            worker.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for worker in live:
            try:
                worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.signal(signal.SIGKILL)
        self.close()

    def live_workers(self) -> int:
        with self._lock:
            return len(self._live)

    def _register(self, worker: Worker, live: bool) -> None:
        with self._lock:
            (self._live.add if live else self._live.discard)(worker)

    def _start_result(self, begin: float | None, reason: str = "") -> None:
        """Count a start; WorkersCannotStart after too many failed ones in a row."""
        with self._lock:
            if begin is not None:
                self._failed_starts = 0
                self.start_times.append(round(time.monotonic() - begin, 3))
                return
            self._failed_starts += 1
            if self._failed_starts >= FAILED_STARTS_ALLOWED:
                raise WorkersCannotStart(f"the filter's workers failed to start {self._failed_starts} times "
                                         f"in a row; the last: {reason}")


class _Slot(threading.Thread):
    """Owns one worker at a time (its jail dies with this thread) and feeds it the pool's jobs."""

    def __init__(self, pool: WorkerPool, index: int):
        super().__init__(daemon=True)
        self.pool, self.index, self.worker = pool, index, None

    def run(self) -> None:
        try:
            while (item := self.pool.jobs.get()) is not None:
                job, future = item
                if future.set_running_or_notify_cancel():
                    self._answer_safely(job, future)
        finally:
            self._retire(grace_s=20.0)

    def _answer_safely(self, job: dict, future: Future) -> None:
        """Every job gets an answer: a fault of the pool itself is that candidate's `worker` rejection."""
        try:
            self._answer(job, future)
        except Exception as exc:
            if not future.done():
                future.set_result(worker_rejection(f"the filter's pool failed: {type(exc).__name__}: {exc}"))
            self._retire(grace_s=0.0)

    def _answer(self, job: dict, future: Future) -> None:
        if self.pool.stopping.is_set():
            future.set_result(worker_rejection("the run is stopping"))
            return
        try:
            if self.worker is None:
                self.worker = self._start()
        except WorkerStartFailed as exc:
            try:
                self.pool._start_result(None, str(exc))
            except WorkersCannotStart as fatal:
                future.set_exception(fatal)
                return
            future.set_result(worker_rejection(f"the worker did not start: {exc}"))
            return
        future.set_result(self._filter(job))

    def _start(self) -> Worker:
        begin = time.monotonic()
        try:
            worker = Worker(self.pool.launcher.start(self.index))
        except (OSError, RuntimeError, ValueError) as exc:  # the jail refused the spec, no free uid, ...
            raise WorkerStartFailed(f"{type(exc).__name__}: {exc}"[:200]) from None
        self.pool._register(worker, True)
        try:
            if self.pool.stopping.is_set():  # started while stop() was signalling the others
                raise wire.WireError("the run is stopping")
            deadline = begin + self.pool.launcher.limits.start_timeout_s
            if wire.receive(worker.process.stdout.fileno(), deadline) != {"ready": True}:
                raise wire.WireError("a first frame that is not `ready`")
        except (wire.WireError, OSError) as exc:
            self.worker = worker
            reason = worker.why(exc)
            self._retire(grace_s=0.0)
            raise WorkerStartFailed(reason) from None
        self.pool._start_result(begin)
        return worker

    def _filter(self, job: dict) -> dict:
        worker, timeout = self.worker, self.pool.launcher.limits.job_timeout_s
        kills = worker.started.oom_kills()
        try:
            wire.send(worker.process.stdin.fileno(), job)
            verdict = checked_verdict(wire.receive(worker.process.stdout.fileno(), time.monotonic() + timeout), job)
            if verdict["stage"] in RECYCLED_AFTER:
                verdict["reason"] += worker.started.memory_note(kills)
                self._retire(grace_s=5.0)
            return verdict
        except wire.WireTimeout:
            reason = f"the worker gave no verdict within {timeout:g} s"
            self._retire(grace_s=0.0)
            return worker_rejection(reason)
        except (wire.WireError, MalformedReply, OSError, ValueError) as exc:
            reason = worker.why(exc) + worker.started.memory_note(kills)
            self._retire(grace_s=0.0)
            return worker_rejection(reason)

    def _retire(self, grace_s: float) -> None:
        worker, self.worker = self.worker, None
        if worker is not None:
            worker.end(self.pool.launcher, grace_s)
            self.pool._register(worker, False)
