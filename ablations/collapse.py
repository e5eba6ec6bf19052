"""When a run is declared collapsed: named rules over its per-iteration records.

A record is a mapping with `reward_mean`, `mismatch.ratio.std`, `update.ratio.std` and, when the
run stopped on a NaN or infinite loss, `stopped` (a reason). Rules:

- `reward_drop`: the first iteration whose reward mean is below `reward_fraction` times the best
  reward mean of the earlier iterations (that best at least `min_best_reward`), for `patience`
  iterations in a row (the first of them is the collapse iteration);
- `reward_drop_with_ratio_std`: the same, where the ratio std (`ratio_of`: "mismatch", the
  trainer against the sampler, or "update", the PPO ratio) also exceeds `ratio_std` on those iterations.

Under every rule a run that stopped on a non-finite loss collapsed at that iteration.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

RULES = ("reward_drop", "reward_drop_with_ratio_std")
RATIO_SOURCES = ("mismatch", "update")


@dataclasses.dataclass(frozen=True)
class CollapseRule:
    rule: str = "reward_drop_with_ratio_std"
    reward_fraction: float = 0.5
    min_best_reward: float = 0.1
    ratio_std: float = 0.1
    ratio_of: str = "update"
    patience: int = 1

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"collapse.rule {self.rule!r}: expected one of {RULES}")
        if self.ratio_of not in RATIO_SOURCES:
            raise ValueError(f"collapse.ratio_of {self.ratio_of!r}: expected one of {RATIO_SOURCES}")
        if self.patience < 1 or not 0.0 < self.reward_fraction < 1.0:
            raise ValueError("collapse: patience must be >= 1 and reward_fraction in (0, 1)")

    def describe(self) -> str:
        text = (f"`{self.rule}`: reward mean below {self.reward_fraction:g} x the best earlier reward mean "
                f"(best >= {self.min_best_reward:g}) for {self.patience} iteration(s) in a row")
        if self.rule == "reward_drop_with_ratio_std":
            text += f", with the {self.ratio_of} ratio std above {self.ratio_std:g}"
        return text + "; or a non-finite loss"


def ratio_std(record: Mapping[str, Any], source: str) -> float:
    value = (record.get(source) or {}).get("ratio", {}).get("std")
    return float("nan") if value is None else float(value)


def _dropped(record: Mapping[str, Any], best: float, rule: CollapseRule) -> bool:
    reward = record.get("reward_mean")
    if reward is None or best < rule.min_best_reward or not reward < rule.reward_fraction * best:
        return False
    if rule.rule == "reward_drop_with_ratio_std":
        std = ratio_std(record, rule.ratio_of)
        return math.isfinite(std) and std > rule.ratio_std
    return True


def collapse_iteration(records: Sequence[Mapping[str, Any]], rule: CollapseRule) -> int | None:
    """The iteration at which the run collapsed under `rule`, or None. Records in iteration order."""
    best, streak_start, streak = -math.inf, None, 0
    for record in records:
        if record.get("stopped"):
            return int(record["iteration"]) if streak_start is None else streak_start
        if _dropped(record, best, rule):
            streak_start = int(record["iteration"]) if streak == 0 else streak_start
            streak += 1
            if streak >= rule.patience:
                return streak_start
        else:
            streak_start, streak = None, 0
        reward = record.get("reward_mean")
        if reward is not None and math.isfinite(reward):
            best = max(best, float(reward))
    return None
