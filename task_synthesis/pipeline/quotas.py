"""Tasks per category for a requested count, following the target composition."""

from __future__ import annotations

import math


def quotas(count: int, composition: dict) -> dict[str, int]:
    """Largest-remainder apportionment of `count` over the categories' shares (ties: listed order)."""
    total = sum(composition.values())
    exact = {k: count * v / total for k, v in composition.items()}
    out = {k: math.floor(v) for k, v in exact.items()}
    order = sorted(composition, key=lambda k: -(exact[k] - out[k]))
    for k in order[: count - sum(out.values())]:
        out[k] += 1
    return out
