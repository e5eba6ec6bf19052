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
        "refused" if record.get("status") == "task_error" else record.get("status") or "?",
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
        ("tasks scored", str(metrics["tasks"]), ""),
        ("tasks refused", str(metrics.get("refused", 0)), ""),
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
    for record in records:
        if record.get("status") == "task_error":
            console.print(f"refused (not scored): {record.get('task')}: {record.get('message')}", highlight=False,
                          markup=False)


def header_line(meta: dict) -> str:
    """Backend, device and versions: what a reader needs to compare two reports."""
    versions = meta.get("versions") or {}
    named = ", ".join(f"{k} {v}" for k, v in versions.items() if v and k != "torch")
    return (f"Backend `{meta.get('backend')}` on {meta.get('device') or 'an unknown device'}; "
            f"torch {meta.get('torch') or versions.get('torch') or 'unknown'}" + (f", {named}" if named else "") + "; "
            f"solutions: {meta.get('solutions') or 'none (harness self-check: the reference is the candidate)'}.")


def _first_line(record: dict) -> str:
    message = record.get("message") or ""
    return message.splitlines()[0] if message else ""


def _failure_sections(records: list[dict]) -> list[str]:
    lines = []
    failures = [r for r in records if r.get("status") not in ("correct", "task_error")]
    if failures:
        lines += ["", "## Failures", ""]
        lines += [f"- **{r.get('candidate')}** ({r.get('status')}): {_first_line(r)}" for r in failures]
    refused = [r for r in records if r.get("status") == "task_error"]
    if refused:
        lines += ["", "## Refused tasks (not scored)", ""]
        lines += [f"- **{r.get('task')}**: {_first_line(r)}" for r in refused]
    return lines


def markdown_report(records: list[dict], metrics: dict, meta: dict, plot_name: str | None) -> str:
    lines = [f"# Kernel benchmark: {meta.get('tasks_path', '')}", "", header_line(meta), ""]
    lines.append("| metric | vs eager | vs compile |")
    lines.append("|---|---:|---:|")
    for name, eager, comp in summary_rows(metrics):
        lines.append(f"| {name} | {eager} | {comp} |")
    if records:
        lines += ["", "| " + " | ".join(ROW_HEADERS) + " |", "|" + "---|" * len(ROW_HEADERS)]
        for record in records:
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row_cells(record)) + " |")
    else:
        lines += ["", "No task was evaluated."]
    lines += _failure_sections(records)
    if plot_name:
        lines += ["", f"![per-task speed-ups]({plot_name})"]
    lines.append("")
    return "\n".join(lines)


def header_title(meta: dict) -> str:
    """The plot's title: the task set, the backend and the device."""
    return f"{Path(meta.get('tasks_path') or '').name}: backend {meta.get('backend')} on {meta.get('device') or '?'}"


def write_reports(out_dir: Path, records: list[dict], main_records: list[dict], metrics: dict, meta: dict,
                  problems: list[str]) -> dict:
    """Write report.json, report.md and speedups.png under out_dir; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "report.json"
    json_path.write_text(json.dumps({"meta": meta, "metrics": metrics, "task_problems": problems, "records": records},
                                    indent=1, default=str))
    from .plot import plot_speedups

    plot = plot_speedups(records, out_dir / "speedups.png", header_title(meta))
    md_path = out_dir / "report.md"
    md_path.write_text(markdown_report(records, metrics, meta, plot.name if plot else None))
    return {"json": str(json_path), "markdown": str(md_path), "plot": str(plot) if plot else None}
