"""What a child's handler raises for an expected failure, and an exception as one line."""

from __future__ import annotations


class HandlerError(Exception):
    """An expected failure of a request, with the kind the parent classifies it by."""

    def __init__(self, kind: str, message: str, detail: str = ""):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.detail = detail


def one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return first[:500]
