"""The bench's plot: per-task speed-ups vs eager and vs torch.compile, every task shown.

Correct candidates get two bars with their values written on them; a task whose candidate
failed, or that was refused, gets a grey marker at 1x labelled with its status, so no task
silently drops out. The y axis is logarithmic with plain tick labels (0.5x, 1x, 2x).
"""

from __future__ import annotations

from pathlib import Path

_NOT_TIMED = {"task_error": "refused"}


def _speedups(record: dict) -> tuple[float | None, float | None]:
    if record.get("status") != "correct":
        return None, None
    speedup = record.get("speedup") or {}
    return speedup.get("eager") or None, speedup.get("compile") or None


def _label_of(record: dict) -> str:
    status = record.get("status") or "?"
    return _NOT_TIMED.get(status, status if status != "correct" else "not timed")


def _plain_ticks(ax) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _bars(ax, x: float, values: tuple, colors: tuple) -> None:
    for offset, value, color in zip((-0.2, 0.2), values, colors):
        if value is None:
            continue
        ax.bar(x + offset, value, width=0.4, color=color)
        ax.annotate(f"{value:.2f}", (x + offset, value), ha="center", va="bottom", fontsize=7,
                    xytext=(0, 2), textcoords="offset points")


def _marker(ax, x: float, record: dict) -> None:
    ax.plot([x], [1.0], marker="X", color="grey", markersize=9)
    ax.annotate(_label_of(record), (x, 1.0), ha="center", va="bottom", fontsize=7, color="dimgrey",
                rotation=90, xytext=(0, 8), textcoords="offset points")


def speedup_figure(records: list[dict], title: str = ""):
    """The figure of per-task speed-ups (log scale), every record shown."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = ("tab:blue", "tab:orange")
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(records) + 2), 4.5))
    for x, record in enumerate(records):
        values = _speedups(record)
        if values[0] is None:
            _marker(ax, x, record)
        else:
            _bars(ax, x, values, colors)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    _plain_ticks(ax)
    ax.set_xticks(list(range(len(records))))
    ax.set_xticklabels([r.get("candidate") or r.get("task", "?") for r in records], rotation=30, ha="right")
    ax.set_ylabel("speed-up (log scale)")
    ax.set_title(title, fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors]
    handles.append(plt.Line2D([], [], marker="X", color="grey", linestyle=""))
    ax.legend(handles, ["vs eager", "vs torch.compile", "failed / refused / not timed"], fontsize=8)
    fig.tight_layout()
    return fig


def plot_speedups(records: list[dict], path: Path, title: str = "") -> Path | None:
    """Save the figure of `records` at `path`; None when there is no record."""
    if not records:
        return None
    import matplotlib.pyplot as plt

    fig = speedup_figure(records, title)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
