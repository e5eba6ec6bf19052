"""A training run's metrics as a report: curves and a table, from the JSON lines alone.

`cuda-agent metrics-report M.jsonl --out DIR` writes DIR/report.md and one PNG per stage (a grid of
curves over the step or iteration). Records with an "event" key are listed, not plotted. The
report can be written again at any time from the same file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

# Curves shown first when a run has them (the rest follow in name order, up to MAX_CURVES).
PREFERRED = ("reward", "loss", "entropy", "kl", "clip", "ratio", "explained_variance", "grad_norm",
             "tokens_per_s", "rollout_s", "train_s")
MAX_CURVES = 16


class ReportError(ValueError):
    """The metrics file cannot make a report (missing, unreadable, or without any step record)."""


def read_records(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise ReportError(f"{path}: no such metrics file")
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ReportError(f"{path}:{number}: not a JSON line ({error.msg})") from None
    return records


def series(records: list[dict[str, Any]]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """{stage: {metric: [(x, value)]}}: x is the record's step, else its iteration; finite numbers only."""
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for record in records:
        if "event" in record:
            continue
        x = record.get("step", record.get("iteration"))
        if not isinstance(x, int):
            continue
        stage = record.get("stage") if isinstance(record.get("stage"), str) else "run"
        for key, value in record.items():
            if key in ("step", "iteration", "stage") or isinstance(value, bool):
                continue
            if isinstance(value, (int, float)) and math.isfinite(value):
                out.setdefault(stage, {}).setdefault(key, []).append((x, float(value)))
    if not out:
        raise ReportError("no record with a step or an iteration and a number to plot")
    return out


def chosen(metrics: dict[str, list]) -> list[str]:
    """The metrics a stage's figure shows: preferred ones first, at most MAX_CURVES."""
    first = [k for p in PREFERRED for k in sorted(metrics) if p in k]
    ordered = list(dict.fromkeys(first + sorted(metrics)))
    return ordered[:MAX_CURVES]


def plot_stage(stage: str, metrics: dict[str, list], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = chosen(metrics)
    columns = min(4, len(keys))
    rows = math.ceil(len(keys) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4 * columns, 2.8 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        xs, ys = zip(*metrics[key])
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3)
        ax.set_title(key, fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.suptitle(stage)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(metrics_file: str | Path, out_dir: str | Path) -> Path:
    records = read_records(metrics_file)
    by_stage = series(records)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# Training metrics: {Path(metrics_file).name}", "",
             f"{len(records)} records; events: " + (", ".join(sorted({str(r['event']) for r in records
                                                                       if 'event' in r})) or "none"), ""]
    for stage, metrics in sorted(by_stage.items()):
        image = out / f"{stage}.png"
        plot_stage(stage, metrics, image)
        lines += [f"## {stage}", "", f"![{stage}]({image.name})", "", "| metric | first | last | min | max | points |",
                  "|---|---|---|---|---|---|"]
        for key in sorted(metrics):
            values = [v for _, v in metrics[key]]
            lines.append(f"| {key} | {values[0]:.4g} | {values[-1]:.4g} | {min(values):.4g} | {max(values):.4g} "
                         f"| {len(values)} |")
        lines.append("")
    report = out / "report.md"
    report.write_text("\n".join(lines))
    return report
