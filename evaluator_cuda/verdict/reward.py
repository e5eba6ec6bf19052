"""The milestone reward of the CUDA Agent paper (§3.4), as a pure function.

    r = -1  if the candidate is incorrect
         3  if b(t, t_eager) and b(t, t_compile)
         2  if b(t, t_eager)
         1  otherwise
    b(t, t0) = (t0 - t) / t0 > margin          (margin = 5% in the paper)

The raw speed-up is deliberately not the reward (paper ablation). Infrastructure failures are
not rewards at all: callers pass them through as `None`, never as -1.
"""

from __future__ import annotations

from ..settings import PAPER_MARGIN


def beats(t: float, t_baseline: float, margin: float = PAPER_MARGIN) -> bool:
    """b(t, t0): True when t is more than `margin` (a fraction) faster than the baseline t0."""
    if not (t_baseline > 0):
        return False
    return (t_baseline - t) / t_baseline > margin


def milestone_reward(
    correct: bool,
    t: float | None,
    t_eager: float | None,
    t_compile: float | None,
    margin: float = PAPER_MARGIN,
) -> int:
    """Reward in {-1, 1, 2, 3} for a candidate taking time t against eager and compile times.

    A correct candidate without timings (profiling off) earns the correctness milestone, 1.
    """
    if not correct:
        return -1
    if t is None or t_eager is None:
        return 1
    faster_than_eager = beats(t, t_eager, margin)
    faster_than_compile = t_compile is not None and beats(t, t_compile, margin)
    if faster_than_eager and faster_than_compile:
        return 3
    if faster_than_eager:
        return 2
    return 1
