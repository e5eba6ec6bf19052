"""Stopping a run on SIGTERM or Ctrl-C without tearing what it writes.

While `StopSignals` is active (main thread only), SIGTERM and SIGINT raise `Stopped`, except inside
`held()`: there the signal is kept until the block ends, so an iteration's checkpoint and its record are
written whole or not at all.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from cuda_agent.stop_signals import StopSignalScope


class Stopped(BaseException):
    """SIGTERM or Ctrl-C stopped the run; what it saved stays, and the same command resumes it.

    A BaseException, as KeyboardInterrupt is: it is raised from a signal handler at whatever line the
    main thread is on, and code that catches Exception there (a fallback around a file read, or
    threading.Condition.notify, which catches RuntimeError) must not swallow it."""


class StopSignals(StopSignalScope):
    def __init__(self) -> None:
        super().__init__()
        self._holding = 0
        self._pending: str | None = None

    def on_stop(self, name: str) -> None:
        if self._holding:
            self._pending = self._pending or name
            return
        raise Stopped(name)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """A block no stop interrupts; a signal that arrives meanwhile stops the run when it ends."""
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1
        if self._pending and not self._holding:
            raise Stopped(self._pending)
