"""SIGTERM and Ctrl-C as a request the run's loop reads, never as an exception raised from a handler.

A Python signal handler runs in the main thread between two bytecodes, wherever that thread is. An
exception raised there can land inside library code that catches it: `threading.Condition.notify`
catches RuntimeError around the release of a waiter, so a stop raised while a job was being queued
for a worker vanished, and the run went on to the end. The handler here only records the signal's
name (an assignment takes no lock, so it cannot deadlock with the code it interrupted); the loop
looks at `requested` between its steps and stops from its own code.
"""

from __future__ import annotations

from cuda_agent.stop_signals import StopSignalScope

POLL_S = 0.2  # how long the loop waits on its workers before it looks for a stop request again


class StopRequests(StopSignalScope):
    """While active in the main thread, SIGTERM and SIGINT set `requested` (the first one's name) and
    do nothing else; elsewhere nothing changes and `requested` stays None."""

    def __init__(self) -> None:
        super().__init__()
        self.requested: str | None = None

    def on_stop(self, name: str) -> None:
        self.requested = self.requested or name
