"""Bounds an honest kernel stays within, flagged in the record of a correct candidate: the
precision of its output's dtype (docs/cheats.md #15) and the speed of light of the bytes it
must move (docs/cheats.md #18)."""

from __future__ import annotations

from .verify import precision_bound


def precision(expected, worst_error: float | None) -> dict:
    """record["precision"]: the worst relative error of the checked outputs, the bound of the
    output's dtype, and whether the error looks like a lower-precision computation."""
    bound = precision_bound(expected) if expected is not None else None
    suspected = bool(bound is not None and worst_error is not None and worst_error > bound)
    return {"relative_error": worst_error, "bound": bound, "downgrade_suspected": suspected}


def speed_of_light(bytes_moved: int, median_us: float, peak_bandwidth: float) -> dict:
    """record["sol_bound_us"] and record["sol_violation"]: the time to read the inputs and write
    the outputs once at peak bandwidth, and whether the median time is below it."""
    bound_us = bytes_moved / peak_bandwidth * 1e6
    return {"sol_bound_us": bound_us, "sol_violation": bool(median_us < bound_us)}
