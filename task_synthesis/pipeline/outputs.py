"""What a run leaves: the parquet file in the Ops-6K layout, the similarity plot and the Markdown report.

Parquet columns: `name` (the bench's row name), `code` (the task source), `ops` (the seed
operators in order), `data_source` (`task_synthesis/programmatic` or `task_synthesis/llm`, the
composer that wrote it), `composition` (1-5 or transformers), `num_ops`, the input
and output shapes (JSON), the eager time measured in the filter, the evaluator's eager and
torch.compile times (when profiled), the highest similarity to an evaluation program, the seed.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

STAGES = ("compose", "reply", "syntax", "screen", "decontaminate", "duplicate", "memory", "load", "inputs", "eager",
          "output", "deterministic", "input_dependent", "window", "timeout", "crash", "evaluator", "compile",
          "gpu_memory", "worker", "filter_error")


def kept_entries(entries: list[dict]) -> list[dict]:
    return [e for e in entries if e["status"] == "kept"]


def write_parquet(entries: list[dict], out: Path, backend: str) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = kept_entries(entries)
    table = pa.table({
        "name": [e["name"] for e in rows],
        "code": [e["source"] for e in rows],
        "ops": pa.array([list(e["ops"]) for e in rows], type=pa.list_(pa.string())),
        "data_source": [f"task_synthesis/{e.get('composer', 'programmatic')}" for e in rows],
        "composition": [e["category"] for e in rows],
        "num_ops": [len(e["ops"]) for e in rows],
        "input_shapes": [json.dumps([e["input_shape"]]) for e in rows],
        "output_shape": [json.dumps(e["output_shape"]) for e in rows],
        "eager_ms": pa.array([e.get("eager_ms") for e in rows], type=pa.float64()),
        "evaluator_eager_us": pa.array([e.get("evaluator_eager_us") for e in rows], type=pa.float64()),
        "evaluator_compile_us": pa.array([e.get("evaluator_compile_us") for e in rows], type=pa.float64()),
        "eval_similarity": pa.array([e.get("eval_similarity") for e in rows], type=pa.float64()),
        "backend": [backend] * len(rows),
        "seed": pa.array([e["seed"] for e in rows], type=pa.int64()),
    })
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(out)
    return len(rows)


def plot_similarity(entries: list[dict], threshold: float, path: Path) -> Path | None:
    """Histogram of each candidate's highest similarity to an evaluation program (None without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    scores = [e["eval_similarity"] for e in entries if e.get("eval_similarity") is not None]
    kept = [e["eval_similarity"] for e in kept_entries(entries) if e.get("eval_similarity") is not None]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    bins = [i / 40 for i in range(41)]
    ax.hist(scores, bins=bins, color="#9bb7d4", label=f"candidates ({len(scores)})")
    ax.hist(kept, bins=bins, color="#2b5d8a", label=f"kept ({len(kept)})")
    ax.axvline(threshold, color="#b22222", linestyle="--", label=f"threshold {threshold:g}")
    ax.set_xlabel("highest normalised-AST similarity to an evaluation program")
    ax.set_ylabel("tasks")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _reason_class(reason: str) -> str:
    """A reason with its numbers and names taken out, so that like rejections count together."""
    reason = re.sub(r"synth_\w+", "<task>", reason or "")
    return re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", reason)[:110]


def survival(entries: list[dict]) -> list[tuple[str, int, int]]:
    """(stage, candidates that reached it, rejected there) in pipeline order."""
    rejected = Counter(e["stage"] for e in entries if e["status"] != "kept")
    left, rows = len(entries), []
    for stage in STAGES:
        if rejected.get(stage):
            rows.append((stage, left, rejected[stage]))
        left -= rejected.get(stage, 0)
    return rows


def second_tries(entries: list[dict]) -> str:
    """One line: the GPU out-of-memory tries again and the batch scale-ups of the decided candidates."""
    retried = [e for e in entries if e.get("gpu_retries")]
    scaled = [e for e in entries if e.get("batch_factor")]
    at_gpu_memory = sum(e["status"] != "kept" and e["stage"] == "gpu_memory" for e in entries)
    return (f"out of GPU memory: {sum(e['gpu_retries'] for e in retried)} tries again of {len(retried)} candidates "
            f"({len(kept_entries(retried))} then kept), {at_gpu_memory} rejected at gpu_memory; batch scaled up for "
            f"{len(scaled)} candidates below the window ({len(kept_entries(scaled))} kept)")


def write_report(entries: list[dict], quotas: dict, composition: dict, session: tuple[float, int], path: Path,
                 plot: Path | None, settings: dict) -> Path:
    """`session`: (wall time in s, tasks kept) of this session alone (a resumed run's earlier ones are not timed)."""
    kept = kept_entries(entries)
    total_share = sum(composition.values())
    by_category = Counter(e["category"] for e in kept)
    llm = settings.get("composer")
    composer = f"the LLM composer ({llm['model']})" if llm else "the programmatic composer"
    lines = ["# Synthesised tasks", "",
             f"{len(kept)} tasks kept of {len(entries)} candidates, written by {composer}; backend "
             f"{settings.get('backend')}, scale {settings['config']['scale']}, seed {settings.get('seed')}.", "",
             "## Composition against the target", "", "| category | target % | quota | kept | kept % |",
             "|---|---:|---:|---:|---:|"]
    for category, share in composition.items():
        pct = 100 * by_category[category] / max(1, len(kept))
        lines.append(f"| {category} | {100 * share / total_share:.2f} | {quotas.get(category, 0)} | "
                     f"{by_category[category]} | {pct:.2f} |")
    lines += ["", "## Survival by stage", "", "| stage | reached | rejected | survived % |", "|---|---:|---:|---:|"]
    for stage, reached, rejected in survival(entries):
        lines.append(f"| {stage} | {reached} | {rejected} | {100 * (reached - rejected) / max(1, reached):.1f} |")
    lines += [f"| kept | {len(kept)} | | |", "", "## Rejection reasons", "", "| stage | reason | count |",
              "|---|---|---:|"]
    reasons = Counter((e["stage"], _reason_class(e["reason"])) for e in entries if e["status"] != "kept")
    for (stage, reason), n in sorted(reasons.items(), key=lambda kv: (STAGES.index(kv[0][0]), -kv[1])):
        lines.append(f"| {stage} | {reason.replace('|', '/')} | {n} |")
    lines += ["", "## Second tries", "", second_tries(entries)]
    lines += ["", "## Times", ""] + _times(entries, kept, session)
    if plot is not None:
        lines += ["", "## Similarity to the evaluation programs", "", f"![similarity]({plot.name})"]
    path.write_text("\n".join(lines) + "\n")
    return path


def _times(entries: list[dict], kept: list[dict], session: tuple[float, int]) -> list[str]:
    def median(values):
        values = sorted(v for v in values if isinstance(v, (int, float)))
        return values[len(values) // 2] if values else None

    filtered = [e.get("filter_s") for e in entries]
    wall_s, kept_now = session
    rows = [f"- this session: {kept_now} tasks kept in {wall_s:.1f} s, {3600 * kept_now / max(wall_s, 1e-9):.0f} "
            f"kept tasks per hour" + (f" ({len(kept) - kept_now} kept by earlier sessions)" if len(kept) > kept_now
                                      else ""),
            f"- median filter time per candidate: {median(filtered) or 0:.2f} s",
            f"- median eager forward (in-process): {median(e.get('eager_ms') for e in kept) or 0:.4f} ms"]
    eager = median(e.get("evaluator_eager_us") for e in kept)
    compiled = median(e.get("evaluator_compile_us") for e in kept)
    if eager is not None:
        rows.append(f"- median evaluator times: eager {eager:.1f} us, torch.compile {compiled or 0:.1f} us")
    split = {part: median(e.get(f"evaluator_{part}_s") for e in kept) for part in ("wall", "verify", "profile",
                                                                                  "baselines")}
    if split["wall"] is not None:
        rows.append("- median evaluator wall time of a kept task: " + ", ".join(
            f"{part} {value:.2f} s" for part, value in split.items() if value is not None))
    return rows
