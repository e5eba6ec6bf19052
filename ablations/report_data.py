"""The report's numbers from the JSON lines alone: runs grouped by arm and seed, series over iterations,
per-seed summaries, and the comparisons of arms that differ in one setting."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ablations.collapse import CollapseRule, collapse_iteration
from ablations.config import Arm, _arms, _section
from ablations.statistics import difference_verdict, seed_spread

DATA_FILE = "iterations.jsonl"
CONFIG_FILE = "ablation.json"
Runs = dict[str, dict[int, list[dict[str, Any]]]]  # arm -> seed -> records in iteration order


def read_records(path: str | Path) -> list[dict[str, Any]]:
    lines = Path(path).read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def group_runs(records: Iterable[Mapping[str, Any]]) -> Runs:
    runs: Runs = {}
    for r in records:
        runs.setdefault(r["arm"], {}).setdefault(int(r["seed"]), []).append(dict(r))
    for seeds in runs.values():
        for rs in seeds.values():
            rs.sort(key=lambda r: r["iteration"])
    return runs


def value_at(record: Mapping[str, Any], path: Sequence[str]) -> float:
    """The number at a key path of a record; NaN when absent or null."""
    node: Any = record
    for key in path:
        if not isinstance(node, Mapping) or node.get(key) is None:
            return math.nan
        node = node[key]
    return float(node)


def series(records: Sequence[Mapping[str, Any]], path: Sequence[str]) -> list[float]:
    return [value_at(r, path) for r in records if not r.get("stopped")]


def _finite_mean(values: Sequence[float]) -> float:
    v = [x for x in values if math.isfinite(x)]
    return float(np.mean(v)) if v else math.nan


def per_seed(seeds: Mapping[int, Sequence[Mapping[str, Any]]], path: Sequence[str], how: str) -> list[float]:
    """One number per seed: "first" (iteration 0), "last" (mean of the last up to 3 iterations), "mean" (all)."""
    out = []
    for records in seeds.values():
        values = series(records, path)
        if not values:
            out.append(math.nan)
        elif how == "first":
            out.append(values[0])
        elif how == "last":
            out.append(_finite_mean(values[-3:]))
        else:
            out.append(_finite_mean(values))
    return out


def collapses(seeds: Mapping[int, Sequence[Mapping[str, Any]]], rule: CollapseRule) -> dict[int, int | None]:
    return {seed: collapse_iteration(records, rule) for seed, records in sorted(seeds.items())}


def arms_and_rule(raw: Mapping[str, Any]) -> tuple[tuple[Arm, ...], CollapseRule]:
    """The arms and collapse rule of a saved config (no run config, so no JAX, needed)."""
    return _arms(raw.get("arms"), raw.get("arm_defaults")), _section("collapse", CollapseRule, raw.get("collapse"))


#: The comparisons of the findings: (label, key path, how per seed, the settings whose pairs it compares;
#: None: every setting). Step-0 statistics differ only where the sampler or the starting actor does.
FINDING_METRICS = (
    ("final reward mean", ("reward_mean",), "last", None),
    ("PPO ratio std (mean over iterations)", ("update", "ratio", "std"), "mean", None),
    ("step-0 share of tokens outside the clip range, trainer vs sampler", ("mismatch", "outside", "outside"), "first",
     ("sampler_head", "rft_init")),
)


def one_setting_pairs(arms: Sequence[Arm]) -> list[tuple[Arm, Arm, str]]:
    """Pairs of arms whose settings differ in exactly one key, with that key."""
    pairs = []
    for i, a in enumerate(arms):
        for b in arms[i + 1:]:
            diff = [k for k, v in a.settings().items() if b.settings()[k] != v]
            if len(diff) == 1:
                pairs.append((a, b, diff[0]))
    return pairs


def finding(a: Arm, b: Arm, setting: str, runs: Runs, metric) -> str | None:
    label, path, how, settings = metric
    if settings is not None and setting not in settings:
        return None
    va, vb = per_seed(runs.get(a.name, {}), path, how), per_seed(runs.get(b.name, {}), path, how)
    sa, sb = seed_spread(va), seed_spread(vb)
    if not sa["n"] or not sb["n"]:
        return None
    verdict = difference_verdict(va, vb)
    said = {"exceeds": "the difference exceeds the spread over seeds (the seed ranges do not overlap)",
            "within": "the difference is within the spread over seeds (the seed ranges overlap)",
            "one seed": "with one seed there is no spread to compare against, so this is not a finding yet"}[verdict]
    return (f"`{a.name}` vs `{b.name}` (differ in {setting}: {a.settings()[setting]} / {b.settings()[setting]}), "
            f"{label}: {fmt(sa['mean'])} vs {fmt(sb['mean'])} over {int(sa['n'])} / {int(sb['n'])} seed(s); {said}.")


def fmt(x: float | None, digits: int = 3) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:.{digits}g}"


def mean_pm(values: Sequence[float]) -> str:
    s = seed_spread(values)
    if not s["n"]:
        return "n/a"
    return fmt(s["mean"]) if s["n"] < 2 else f"{fmt(s['mean'])} ± {fmt(s['std'])}"
