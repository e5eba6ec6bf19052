"""Benchmark reports: the console table, a JSON report, a Markdown report with a speed-up plot."""

from __future__ import annotations

import json
from pathlib import Path

from .metrics import FAST_P_THRESHOLDS


def _us(times: dict | None) -> str:
    """A median time with its unit: 12.3 µs, 4.56 ms, 1.23 s."""
    if not times:
        return "-"
    us = times["median_us"]
    if us >= 1e6:
        return f"{us / 1e6:.2f} s"
    if us >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.1f} µs"


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value else "-"


def _pct(value: float | None) -> str:
    return f"{100 * value:.1f}%" if value is not None else "-"


def row_cells(record: dict) -> list[str]:
    times = record.get("times_us") or {}
    speedup = record.get("speedup") or {}
    reward = record.get("reward")
    return [
        record.get("candidate") or record.get("task", "?"),
        record.get("status") or "?",
        "-" if reward is None else str(reward),
        _us(times.get("candidate")),
        _us(times.get("eager")),
        _us(times.get("compile")),
        _x(speedup.get("eager")),
        _x(speedup.get("compile")),
    ]


ROW_HEADERS = ["candidate", "status", "reward", "ours", "eager", "compile", "vs eager", "vs compile"]


def summary_rows(metrics: dict) -> list[tuple[str, str, str]]:
    rows = [
        ("tasks", str(metrics["tasks"]), ""),
        ("pass rate", _pct(metrics["pass_rate"]), ""),
        ("faster rate", _pct(metrics["faster_rate_vs_eager"]), _pct(metrics["faster_rate_vs_compile"])),
        ("geomean speed-up", _x(metrics["geomean_speedup_vs_eager"]), _x(metrics["geomean_speedup_vs_compile"])),
    ]
    for p in FAST_P_THRESHOLDS:
        rows.append((f"fast_{p:g}", _pct(metrics["fast_p_vs_eager"][str(p)]),
                     _pct(metrics["fast_p_vs_compile"][str(p)])))
    return rows


def print_tables(console, records: list[dict], metrics: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="Candidates")
    for header in ROW_HEADERS:
        table.add_column(header, justify="left" if header in ("candidate", "status") else "right", no_wrap=True)
    for record in records:
        table.add_row(*(escape(c) for c in row_cells(record)))
    console.print(table)
    summary = Table(title="Summary (one candidate per task)")
    for header, justify in (("metric", "left"), ("vs eager", "right"), ("vs compile", "right")):
        summary.add_column(header, justify=justify)
    for row in summary_rows(metrics):
        summary.add_row(*row)
    console.print(summary)


def plot_speedups(records: list[dict], path: Path) -> Path | None:
    """Bar chart of per-candidate speed-ups vs eager and vs compile (log scale); None if nothing to plot."""
    rows = [r for r in records if r.get("status") == "correct" and (r.get("speedup") or {}).get("eager")]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["candidate"] for r in rows]
    eager = [r["speedup"]["eager"] or 0 for r in rows]
    compiled = [r["speedup"]["compile"] or 0 for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows) + 2), 4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], eager, width=0.4, label="vs eager")
    ax.bar([x + 0.2 for x in xs], compiled, width=0.4, label="vs torch.compile")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=30, ha="right")
    ax.set_ylabel("speed-up (x, log scale)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def markdown_report(records: list[dict], metrics: dict, meta: dict, plot_name: str | None) -> str:
    lines = [f"# Kernel benchmark: {meta.get('tasks_path', '')}", ""]
    lines.append(f"Backend `{meta.get('backend')}` on {meta.get('device') or 'unknown device'}; "
                 f"torch {meta.get('torch')}; "
                 f"solutions: {meta.get('solutions') or 'none (harness self-check: the reference is the candidate)'}.")
    lines.append("")
    lines.append("| metric | vs eager | vs compile |")
    lines.append("|---|---:|---:|")
    for name, eager, comp in summary_rows(metrics):
        lines.append(f"| {name} | {eager} | {comp} |")
    lines += ["", "| " + " | ".join(ROW_HEADERS) + " |", "|" + "---|" * len(ROW_HEADERS)]
    for record in records:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row_cells(record)) + " |")
    failures = [r for r in records if r.get("status") not in ("correct",)]
    if failures:
        lines += ["", "## Failures", ""]
        for r in failures:
            first_line = (r.get('message') or '').splitlines()[0] if r.get('message') else ''
            lines.append(f"- **{r.get('candidate')}** ({r.get('status')}): {first_line}")
    if plot_name:
        lines += ["", f"![per-task speed-ups]({plot_name})"]
    lines.append("")
    return "\n".join(lines)


def write_reports(out_dir: Path, records: list[dict], main_records: list[dict], metrics: dict, meta: dict,
                  problems: list[str]) -> dict:
    """Write report.json, report.md and speedups.png under out_dir; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "report.json"
    json_path.write_text(json.dumps({"meta": meta, "metrics": metrics, "task_problems": problems, "records": records},
                                    indent=1, default=str))
    plot = plot_speedups(main_records, out_dir / "speedups.png")
    md_path = out_dir / "report.md"
    md_path.write_text(markdown_report(records, metrics, meta, plot.name if plot else None))
    return {"json": str(json_path), "markdown": str(md_path), "plot": str(plot) if plot else None}
