"""Named defaults of the bridge, with where each value comes from.

Heartbeat interval, liveness and the reconnect back-off are the Paranoid Pirate values of the
ZeroMQ guide (docs/paper.md §11). Tests shrink them (0.1 s heartbeats) to stay fast.
"""

from __future__ import annotations

from dataclasses import dataclass, asdict, replace

from cuda_agent.contracts import EVALUATOR_HANDLERS, Timeouts

MIB = 1024 * 1024
GIB = 1024 * MIB


@dataclass(frozen=True)
class BridgeSettings:
    """Timing and limits shared by the broker, the workers and the clients."""

    heartbeat_s: float = 1.0  # Paranoid Pirate: 1 s heartbeat interval
    liveness: int = 3  # Paranoid Pirate: a peer silent for 3 intervals is gone
    reconnect_min_s: float = 1.0  # Paranoid Pirate: reconnect back-off starts at 1 s ...
    reconnect_max_s: float = 32.0  # ... and doubles up to 32 s
    max_attempts: int = 3  # a job is tried this many times before it becomes an infra_error
    max_queue: int = 100_000  # queued (not yet dispatched) jobs per broker; beyond: "busy"
    max_queue_bytes: int = 4 * GIB  # bytes of unfinished job bodies per broker; beyond: "busy"
    max_client_jobs: int = 50_000  # unfinished (queued or running) jobs one client may have; beyond: "busy"
    max_client_bytes: int = 1 * GIB  # bytes of one client's unfinished job bodies; beyond: "busy"
    # Services the broker accepts jobs for before any worker registered them (workers start
    # after the broker); any service a worker registers is added, and remembered in the journal.
    services: tuple = tuple(sorted(EVALUATOR_HANDLERS))
    max_message_bytes: int = 64 * MIB  # a message larger than this is refused with an error
    time_limit_s: float = Timeouts().worker_job_s  # one evaluation may run this long before its child is killed
    result_ttl_s: float = 7 * 24 * 3600.0  # finished results kept for duplicate submissions
    busy_retry_s: float = 0.5  # a client retries jobs the broker called "busy" after this ...
    busy_retry_max_s: float = 8.0  # ... doubling per refusal up to this (with jitter), until the job's timeout

    @property
    def silence_limit_s(self) -> float:
        """Seconds of silence after which a peer is considered gone."""
        return self.heartbeat_s * self.liveness

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict | None) -> "BridgeSettings":
        values = dict(values or {})
        if "services" in values:
            values["services"] = tuple(values["services"])
        return replace(cls(), **values)


FAST_TEST_SETTINGS = BridgeSettings(
    heartbeat_s=0.1, liveness=3, reconnect_min_s=0.05, reconnect_max_s=0.5, busy_retry_s=0.05, busy_retry_max_s=0.5
)
