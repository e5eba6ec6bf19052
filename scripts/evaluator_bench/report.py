"""Progress lines with elapsed seconds, a time budget, and the number formatting of the tables."""

from __future__ import annotations

import time


class Clock:
    """Seconds since the subcommand started, and what is left of its --budget-s."""

    def __init__(self, budget_s: float = float("inf")):
        self.begin = time.perf_counter()
        self.budget_s = budget_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.begin

    def remaining(self) -> float:
        return self.budget_s - self.elapsed()

    def say(self, message: str) -> None:
        print(f"[{self.elapsed():6.1f}s] {message}", flush=True)


def fmt(value, digits: int | None = 1) -> str:
    """A number with `digits` decimals ("-" for None); digits None: the value as str()."""
    if value is None:
        return "-"
    return str(value) if digits is None else f"{value:.{digits}f}"


def verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("PASS" if ok else "FAIL")
