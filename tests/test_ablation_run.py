"""The tiny importance-ratio ablation end to end on the CPU: a subset of the arms of configs/ablation_tiny.yaml
that takes every code path (bf16 and FP32 sampler heads; old log-probs recomputed FP32, recomputed bf16 and the
sampler's own; TIS on and off; with and without RFT initialisation and value pretraining) for two iterations
from one starting point, its JSON lines, and the report rendered again from the data alone. Every arm of the
shipped configs is expanded and checked in test_ablation_config.py; all of them together take about twice
as long here."""

import dataclasses
import json
from pathlib import Path

import pytest

pytest.importorskip("jax")

REPO = Path(__file__).resolve().parents[1]


SUBSET = ("bf16-sampler.fp32-old.tis", "bf16-sampler.bf16-old.tis", "bf16-sampler.rollout-old",
          "fp32-sampler.rollout-old", "no-rft.no-value-pretraining")


@pytest.fixture(scope="module")
def ablation(tmp_path_factory):
    import jax

    from ablations.config import load_ablation_config
    from ablations.runner import run_ablation

    cfg = load_ablation_config(REPO / "configs" / "ablation_tiny.yaml")
    cfg = dataclasses.replace(cfg, arms=tuple(a for a in cfg.arms if a.name in SUBSET))
    lines = []
    out = run_ablation(cfg, tmp_path_factory.mktemp("ablation"), say=lines.append, devices=jax.devices()[:1])
    return cfg, out, lines


@pytest.mark.slow
def test_every_arm_runs_two_iterations_and_writes_its_statistics(ablation):
    cfg, out, lines = ablation
    records = [json.loads(line) for line in (out / "iterations.jsonl").read_text().splitlines()]
    assert [(r["arm"], r["iteration"]) for r in records] == [(a.name, i) for a in cfg.arms for i in range(2)]
    updates = cfg.run.ppo.epochs * cfg.run.train.global_batch_size // cfg.run.ppo.mini_batch_size
    by_arm = {}
    for r in records:
        by_arm.setdefault(r["arm"], []).append(r)
        assert r["updates"] == updates and r["actor_version"] == r["iteration"] * updates
        assert set(r["mismatch"]["buckets"]) == {"<1e-4", "1e-4..1e-2", "1e-2..0.5", ">0.5"}
        # every agent token in every epoch
        assert r["update"]["ratio"]["count"] == cfg.run.ppo.epochs * r["mismatch"]["ratio"]["count"]
        assert r["update"]["ratio"]["std"] > 0  # several mini-batches and epochs: the ratio leaves 1
        for key in ("reward_mean", "length_clip_ratio", "entropy", "grad_norm", "explained_variance"):
            assert r[key] is not None, key
        assert 0 <= r["update"]["clip"]["low"] <= 1 and 0 <= r["update"]["clip"]["high"] <= 1
        assert r["mismatch"]["kl"]["k3"] >= 0 and r["mismatch"]["prob_correlation"] > 0.9
    # one starting point: arms with the same sampler and start see the same first batch
    first = {a.name: by_arm[a.name][0] for a in cfg.arms}
    assert first["bf16-sampler.fp32-old.tis"]["mismatch"] == first["bf16-sampler.rollout-old"]["mismatch"]
    # an FP32 sampler head is far closer to the FP32 trainer than a bf16 one
    fp32, bf16 = first["fp32-sampler.rollout-old"]["mismatch"], first["bf16-sampler.fp32-old.tis"]["mismatch"]
    assert fp32["kl"]["k3"] * 10 < bf16["kl"]["k3"]
    assert any("iteration 2/2" in line for line in lines) and any(line.startswith("report:") for line in lines)


@pytest.mark.slow
def test_report_renders_again_from_the_data_alone(ablation, tmp_path):
    import shutil

    from typer.testing import CliRunner

    from cuda_agent.cli import app

    cfg, out, _ = ablation
    report = (out / "report.md").read_text()
    for arm in cfg.arms:
        assert f"| `{arm.name}` |" in report
    for figure in ("mismatch_ratio_std_by_bucket.png", "update_ratio_std_by_bucket.png", "reward.png",
                   "clip_fractions.png", "explained_variance.png"):
        assert f"]({figure})" in report and (out / figure).stat().st_size > 0
    assert "At step 0, a bf16 sampler head against the FP32 trainer puts" in report
    assert "why it stands in" in report and "no spread to compare against" in report
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("ablation.json", "iterations.jsonl"):
        shutil.copy(out / name, copy / name)
    result = CliRunner().invoke(app, ["ablate", "report", str(copy)])
    assert result.exit_code == 0, result.output
    assert (copy / "report.md").read_text() == report and (copy / "reward.png").is_file()
