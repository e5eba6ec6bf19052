"""SIGTERM and Ctrl-C handed to one method while a long run is active (standard library only).

A subclass decides what a stop does: record it for the run's loop to read, or raise it at once. The
handlers are installed only in the main thread (Python allows no other) and restored on exit.
"""

from __future__ import annotations

import signal
import threading

STOP_SIGNAL_NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}


class StopSignalScope:
    """A context manager: within it, SIGTERM and SIGINT call `on_stop(name)` in the main thread."""

    def __init__(self) -> None:
        self._previous: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNAL_NAMES:
                self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _on_signal(self, signum, frame) -> None:
        self.on_stop(STOP_SIGNAL_NAMES[signum])

    def on_stop(self, name: str) -> None:
        raise NotImplementedError
