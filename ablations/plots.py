"""The report's figures (matplotlib, Agg backend): one line per arm, the mean over seeds, with the
seeds' range shaded. Each function writes one PNG and returns its file name, or None without matplotlib."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ablations.report_data import Runs, series
from ablations.statistics import BUCKET_NAMES


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _band(ax, runs: Runs, arm: str, path: Sequence[str]) -> None:
    curves = [series(records, path) for records in runs[arm].values()]
    length = max((len(c) for c in curves), default=0)
    if not length:
        return
    grid = np.full((len(curves), length), np.nan)
    for i, c in enumerate(curves):
        grid[i, :len(c)] = c
    x = np.arange(length)
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            mean, low, high = np.nanmean(grid, 0), np.nanmin(grid, 0), np.nanmax(grid, 0)
    (line,) = ax.plot(x, mean, marker="o", markersize=3, label=arm)
    if len(curves) > 1:
        ax.fill_between(x, low, high, color=line.get_color(), alpha=0.15)


def _any_positive(ax) -> bool:
    return any(np.any(np.asarray(line.get_ydata(), dtype=float) > 0) for line in ax.get_lines())


def figure(out: Path, name: str, runs: Runs, panels: Sequence[tuple[str, Sequence[str]]], ylabel: str,
           log_y: bool = False) -> str | None:
    """One figure of `panels` (title, key path) side by side, every arm in each."""
    plt = _pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (title, path) in zip(axes[0], panels):
        for arm in runs:
            _band(ax, runs, arm, path)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("iteration")
        ax.set_ylabel(ylabel)
        if log_y and _any_positive(ax):  # a log axis of nothing positive cannot be drawn
            ax.set_yscale("log", nonpositive="mask")
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(3, max(1, len(labels))), fontsize=7)
    fig.tight_layout(rect=(0, 0.06 + 0.035 * ((len(labels) + 2) // 3), 1, 1))
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def all_figures(out: Path, runs: Runs) -> dict[str, str | None]:
    def buckets(kind: str):
        return [(f"{kind}: p {b}", (kind, "buckets", b, "std")) for b in BUCKET_NAMES]

    return {
        "mismatch_std": figure(out, "mismatch_ratio_std_by_bucket.png", runs, buckets("mismatch"), "ratio std", True),
        "update_std": figure(out, "update_ratio_std_by_bucket.png", runs, buckets("update"), "ratio std", True),
        "reward": figure(out, "reward.png", runs, [("reward mean", ("reward_mean",)),
                                                   ("exact match", ("exact_match",)),
                                                   ("response-length clip ratio", ("length_clip_ratio",))], "share"),
        "clip": figure(out, "clip_fractions.png", runs,
                       [("clipped low (A<0, r<1-eps_low)", ("update", "clip", "low")),
                        ("clipped high (A>0, r>1+eps_high)", ("update", "clip", "high"))], "share of tokens"),
        "critic": figure(out, "explained_variance.png", runs, [("critic explained variance", ("explained_variance",)),
                                                               ("entropy", ("entropy",)),
                                                               ("actor gradient norm", ("grad_norm",))], "value"),
    }
