"""Ablation configs: every arm of the shipped configs expands to the PPO and sampler settings it names;
bad input is one error line and exit status 2."""

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ablations.config import AblationConfigError, ablation_config_from_dict, load_ablation_config

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("size", ["tiny", "small"])
def test_every_arm_expands_to_its_settings(size):
    cfg = load_ablation_config(REPO / "configs" / f"ablation_{size}.yaml")
    assert {a.old_logprobs for a in cfg.arms} == {"fp32", "bf16", "rollout"}
    assert {a.sampler_head for a in cfg.arms} == {"bf16", "fp32"}
    starts = {(a.rft_init, a.value_pretraining) for a in cfg.arms}
    assert starts == {(True, True), (True, False), (False, True), (False, False)}
    assert {a.tis for a in cfg.arms} == {True, False}
    assert cfg.run.ppo.epochs > 1 and cfg.run.ppo.mini_batch_size < cfg.run.train.global_batch_size
    for arm in cfg.arms:
        ppo = cfg.arm_run_config(arm).ppo
        assert ppo.old_logprobs == ("rollout" if arm.old_logprobs == "rollout" else "recompute")
        assert ppo.logprob_precision == ("bf16" if arm.old_logprobs == "bf16" else "fp32")
        assert ppo.tis_cap == (cfg.run.ppo.tis_cap if arm.tis else None)
        assert arm.sampler_logits_precision == ("fp32" if arm.sampler_head == "fp32" else "compute")
        assert (ppo.epochs, ppo.mini_batch_size, ppo.clip_low) == (cfg.run.ppo.epochs, cfg.run.ppo.mini_batch_size,
                                                                   cfg.run.ppo.clip_low)


def _raw():
    return yaml.safe_load((REPO / "configs" / "ablation_tiny.yaml").read_text())


@pytest.mark.parametrize("edit,message", [
    (lambda r: r["arms"].append({"name": r["arms"][0]["name"]}), "arm names must be unique"),
    (lambda r: r["arms"].append({"name": "x", "old_logprobs": "fp16"}), "old_logprobs 'fp16'"),
    (lambda r: r["arms"].append({"name": "x", "temperature": 2}), "unknown keys in arm x"),
    (lambda r: r.update(seeds=[]), "seeds must be a non-empty list"),
    (lambda r: r.update(iterations=0), "iterations must be a positive integer"),
    (lambda r: r.update(checkpoint_every=0), "checkpoint_every must be a positive integer"),
    (lambda r: r["run"]["model"].update(compute_dtype="float32"), "bf16 sampler head needs run.model.compute_dtype"),
    (lambda r: r["run"]["train"].update(seq_len=4), "shorter than the task's longest row"),
    (lambda r: r["run"]["ppo"].update(tis_cap=None), "needs run.ppo.tis_cap"),
    (lambda r: r["run"]["ppo"].update(old_logprobs="maybe"), "run: ppo.old_logprobs"),
    (lambda r: r.update(collapse={"rule": "vibes"}), "collapse.rule"),
    (lambda r: r.update(colapse={}), "unknown top-level keys: colapse"),
])
def test_bad_configs_say_what_is_wrong(edit, message):
    raw = _raw()
    edit(raw)
    with pytest.raises(AblationConfigError, match=message):
        ablation_config_from_dict(raw)


def test_cli_bad_input_is_one_error_line_and_exit_2(tmp_path):
    from cuda_agent.cli import app

    bad = tmp_path / "bad.yaml"
    raw = _raw()
    raw["arms"][0]["sampler_head"] = "fp8"
    bad.write_text(yaml.safe_dump(raw))
    runner = CliRunner()
    for args in (["ablate", "importance-ratio", "--config", str(bad)],
                 ["ablate", "importance-ratio", "--config", str(tmp_path / "missing.yaml")],
                 ["ablate", "importance-ratio", "--config", str(REPO / "configs" / "ablation_tiny.yaml"),
                  "--seeds", "0,x"],
                 ["ablate", "importance-ratio", "--config", str(REPO / "configs" / "ablation_tiny.yaml"),
                  "--seeds", "1,1"],
                 ["ablate", "importance-ratio", "--config", str(REPO / "configs" / "ablation_tiny.yaml"),
                  "--devices", "0", "--out", str(tmp_path / "out")],
                 ["ablate", "importance-ratio", "--config", str(REPO / "configs" / "ablation_tiny.yaml"),
                  "--devices", "99", "--out", str(tmp_path / "out")],
                 ["ablate", "report", str(tmp_path)]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), result.output
