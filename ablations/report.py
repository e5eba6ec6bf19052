"""The Markdown report of an ablation folder, rendered from `ablation.json` and `iterations.jsonl` alone
(`cuda-agent ablate report <dir>`): the task and why it stands in, the collapse rule, the table of
arms, the step-0 mismatch, the findings with their seed spread, and the figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from ablations import report_data as rd
from ablations.config import AblationConfigError
from ablations.plots import all_figures
from ablations.report_data import CONFIG_FILE, DATA_FILE

REPORT_FILE = "report.md"

WHY_THIS_TASK = """\
The paper's setting is agentic PPO on CUDA kernels: long multi-turn trajectories, a sparse reward from
an evaluator, and a bf16 rollout engine whose token probabilities differ from the trainer's. What
makes it collapse is a property of the PPO update, not of CUDA: the importance ratio between the
trainer and the sampler drifts on low-probability tokens, the clip acts on the wrong tokens, and the
critic cannot follow. This task keeps every piece the update sees (the JAX sampler of the agent with its
own log-probs, the trajectory rows with their loss masks, the same PPO updater, GAE, clipping, TIS,
RFT and value pretraining) and replaces only the environment: addition with an exact-match reward,
checked by a few lines of Python instead of a GPU evaluator. A small model learns it within minutes,
so reward rising or falling is visible within a budget where the CUDA task would show only step 0.
What it does not reproduce: multi-turn tool use, trajectories thousands of tokens long (where
low-probability tokens are far more frequent), and the paper's model size."""


def _arm_row(arm, seeds, rule, low: float, high: float) -> str:
    collapsed = rd.collapses(seeds, rule)
    collapse_text = ", ".join(f"{s}: {'none' if i is None else i}" for s, i in collapsed.items()) or "no data"
    cells = [
        f"`{arm.name}`", arm.sampler_head, arm.old_logprobs, "on" if arm.tis else "off",
        "yes" if arm.rft_init else "no", "yes" if arm.value_pretraining else "no", str(len(seeds)),
        rd.mean_pm(rd.per_seed(seeds, ("mismatch", "outside", "outside"), "first")),
        rd.mean_pm(rd.per_seed(seeds, ("mismatch", "kl", "k3"), "first")),
        rd.mean_pm(rd.per_seed(seeds, ("reward_mean",), "first")),
        rd.mean_pm(rd.per_seed(seeds, ("reward_mean",), "last")),
        rd.mean_pm(rd.per_seed(seeds, ("update", "ratio", "std"), "mean")),
        rd.mean_pm(rd.per_seed(seeds, ("update", "clip", "low"), "mean")) + " / "
        + rd.mean_pm(rd.per_seed(seeds, ("update", "clip", "high"), "mean")),
        rd.mean_pm(rd.per_seed(seeds, ("explained_variance",), "last")),
        collapse_text,
    ]
    return "| " + " | ".join(cells) + " |"


def arms_table(arms, runs: rd.Runs, rule, low: float, high: float) -> list[str]:
    head = ["arm", "sampler head", "old log-probs", "TIS", "RFT init", "value pretrained", "seeds",
            f"step-0 outside [{1 - low:g}, {1 + high:g}]", "step-0 KL k3", "step-0 reward", "final reward",
            "PPO ratio std", "clipped low / high", "final explained var.", "collapse iteration (seed: it.)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + [_arm_row(a, runs[a.name], rule, low, high) for a in arms if a.name in runs]


def step0_sentence(arms, runs: rd.Runs, low: float, high: float) -> str:
    bf16 = [v for a in arms if a.sampler_head == "bf16" and a.name in runs
            for v in rd.per_seed(runs[a.name], ("mismatch", "outside", "outside"), "first")]
    fp32 = [v for a in arms if a.sampler_head == "fp32" and a.name in runs
            for v in rd.per_seed(runs[a.name], ("mismatch", "outside", "outside"), "first")]
    text = (f"At step 0, a bf16 sampler head against the FP32 trainer puts {rd.mean_pm(bf16)} of the agent tokens "
            f"outside [{1 - low:g}, {1 + high:g}] (p_train / p_rollout; {len(bf16)} runs)")
    if fp32:
        text += f"; an FP32 sampler head puts {rd.mean_pm(fp32)} there ({len(fp32)} runs)"
    return text + ". Runs of arms with the same sampler head and starting point see the same first batch."


def _settings(raw: Mapping[str, Any]) -> list[str]:
    run = raw.get("run") or {}
    model, train, ppo = run.get("model") or {}, run.get("train") or {}, run.get("ppo") or {}
    episodes, mini = train.get("global_batch_size"), ppo.get("mini_batch_size")
    return [f"- iterations per arm: {raw.get('iterations')}; seeds: {raw.get('seeds', [0])} (sampling and mini-batch "
            "order; every seed starts from the same checkpoint)",
            f"- episodes per iteration: {episodes}, mini-batch {mini}, epochs {ppo.get('epochs', 1)}; clip "
            f"[{1 - ppo.get('clip_low', 0.2):g}, {1 + ppo.get('clip_high', 0.28):g}], "
            f"TIS cap {ppo.get('tis_cap', 2.0)}",
            f"- model: {model.get('num_hidden_layers')} layers, hidden {model.get('hidden_size')}, vocabulary "
            f"{model.get('vocab_size')}, compute {model.get('compute_dtype', 'bfloat16')}; "
            f"task: {raw.get('task') or {}}; "
            f"warm start: {raw.get('warm_start') or {}}"]


def render(raw: Mapping[str, Any], records: list[dict[str, Any]], figures: Mapping[str, str | None]) -> str:
    arms, rule = rd.arms_and_rule(raw)
    runs = rd.group_runs(records)
    ppo = (raw.get("run") or {}).get("ppo") or {}
    low, high = float(ppo.get("clip_low", 0.2)), float(ppo.get("clip_high", 0.28))
    lines = [f"# Importance-ratio ablation: {raw.get('name', 'ablation')}", "",
             f"Data: `{DATA_FILE}` (one JSON line per arm, seed and iteration) and `{CONFIG_FILE}` next to this file; "
             "`cuda-agent ablate report <this folder>` renders this page again from them.", "",
             *_settings(raw), "", "## The task, and why it stands in for the paper's", "", WHY_THIS_TASK, "",
             "## Arms", "", f"Collapse rule {rule.describe()}.", "", *arms_table(arms, runs, rule, low, high), "",
             "Step-0 columns are the first iteration; \"final\" is the mean of the last three iterations; "
             "cells are the mean ± standard deviation over seeds.", "", "## Step 0", "",
             step0_sentence(arms, runs, low, high), "", "## Findings", ""]
    found = [f for a, b, setting in rd.one_setting_pairs(arms) for m in rd.FINDING_METRICS
             if (f := rd.finding(a, b, setting, runs, m))]
    lines += [f"- {f}" for f in found] or ["- No pair of arms differs in exactly one setting."]
    lines += ["", "## Figures", ""]
    captions = {"mismatch_std": "Std of p_train / p_rollout by token-probability bucket "
                                "(trainer FP32 head, before updates)",
                "update_std": "Std of PPO's ratio pi_theta / pi_old by pi_old bucket, over every mini-batch and epoch",
                "reward": "Reward, exact-match rate and response-length clip ratio",
                "clip": "Shares of tokens where PPO's clip binds",
                "critic": "Critic explained variance, entropy, gradient norm"}
    for key, caption in captions.items():
        name = figures.get(key)
        image = f"![{caption}]({name})" if name else "(no figure: matplotlib is not installed)"
        lines += [f"**{caption}.**", "", image, ""]
    return "\n".join(lines)


def write_report(out_dir: str | Path) -> Path:
    """Render `report.md` and its figures in `out_dir` from the data there."""
    out = Path(out_dir)
    if not (out / CONFIG_FILE).is_file() or not (out / DATA_FILE).is_file():
        raise AblationConfigError(f"{out} holds no ablation data ({CONFIG_FILE} and {DATA_FILE})")
    raw = json.loads((out / CONFIG_FILE).read_text())
    records = [r for r in rd.read_records(out / DATA_FILE) if "arm" in r]
    runs = rd.group_runs(r for r in records if not r.get("stopped"))
    path = out / REPORT_FILE
    path.write_text(render(raw, records, all_figures(out, runs)) + "\n")
    return path
