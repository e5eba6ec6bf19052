"""Second tries of a candidate, each decided once in the journal: one that ran out of GPU memory is tried
again later (the run's workers share the GPU, so the error may be its neighbours'), and a programmatic one
whose eager forward ran below the window is drawn again with its batch multiplied.

The batch factor aims the expected time at 1.5 x the window's low end, assuming the time grows with
the batch (on a GPU it grows more slowly while the device is not full, hence the margin; a margin of
3 kept no more candidates on the H200, where many sub-millisecond forwards are launches whose time
does not grow with the batch at all: docs/task-synthesis.md). Parameters
do not grow with the batch; the inputs and every intermediate do (compose/composer.py scales each
shape of the plan by the factor), so the factor is also held to what keeps the planned bytes within
the memory bound (filter/execution.check_memory counts them, again, in the worker).
"""

from __future__ import annotations

import math

SCALE_MARGIN = 1.5
ELEMENT_BYTES = 4  # float32, as filter/execution.check_memory counts


def activation_bytes(shapes: list[list[int]]) -> int:
    """The planned bytes that grow with the batch: every tensor of the forward."""
    return ELEMENT_BYTES * sum(math.prod(s) for s in shapes)


def batch_factor(eager_ms: float, low_ms: float, cap: int, planned_bytes: int, activations: int, bound: int) -> int:
    """ceil(1.5 x low / eager_ms), at most `cap`, and at most what keeps the parameters (`planned_bytes` less
    `activations`) plus `activations` x factor within `bound`; 1 (no scale-up) for a time not below `low_ms`."""
    if not 0 < eager_ms < low_ms:
        return 1
    factor = min(cap, math.ceil(SCALE_MARGIN * low_ms / eager_ms))
    if activations > 0:
        factor = min(factor, (bound - (planned_bytes - activations)) // activations)
    return max(1, factor)


class Requeue:
    """Candidates waiting to be tried again, first in first out. Each is due once `delay` more candidates were
    decided after it was put back (by then the candidates it shared the GPU with have moved on), or at once
    when the run has nothing else to start."""

    def __init__(self, delay: int):
        self.delay = delay
        self._waiting: list[tuple[int, dict, dict]] = []  # (due when this many are decided, entry, job)

    def put(self, entry: dict, job: dict, decided: int) -> None:
        self._waiting.append((decided + self.delay, entry, job))

    def take(self, decided: int, force: bool = False) -> tuple[dict, dict] | None:
        """(entry, job) of the first candidate due (with `force`, the first waiting), else None."""
        if self._waiting and (force or self._waiting[0][0] <= decided):
            _, entry, job = self._waiting.pop(0)
            return entry, job
        return None

    def entries(self) -> list[dict]:
        return [entry for _, entry, _ in self._waiting]

    def __len__(self) -> int:
        return len(self._waiting)
