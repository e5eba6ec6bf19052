"""What an evaluation is doing now, for a caller that shows it (the bench's bar, `evaluate`'s stderr).

The evaluation calls `say("building the extension")` as each step that may take a while
begins; a caller listens for a block with `listening(callback)`. Nobody listening: a no-op.
"""

from __future__ import annotations

import contextlib
from typing import Callable

_listeners: list[Callable[[str], None]] = []


def say(step: str) -> None:
    """Tell every listener that `step` begins."""
    for listener in list(_listeners):
        listener(step)


@contextlib.contextmanager
def listening(callback: Callable[[str], None]):
    """Call `callback(step)` for each step said inside the block."""
    _listeners.append(callback)
    try:
        yield
    finally:
        _listeners.remove(callback)
