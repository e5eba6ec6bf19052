"""Every config in configs/ loads, and each pairing of a run config with an agent config that a script
or the README uses keeps every episode inside the training window (a longer one would be cut)."""

from pathlib import Path

import pytest
import yaml

from agent.config import load_agent_config
from policy_jax.run_config import load_run_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
RUN_CONFIGS = sorted(p for p in CONFIGS.glob("*.yaml") if "model" in yaml.safe_load(p.read_text()))
AGENT_CONFIGS = sorted(p for p in CONFIGS.glob("*.yaml") if "agent" in yaml.safe_load(p.read_text()))
# (run config, agent config) used together: the CPU first run, the on-policy loop, the two-GPU demo
PAIRS = [("tiny_first_run", "agent_first_run"), ("tiny_loop", "agent_loop"),
         ("h200_loop", "agent_two_gpu"), ("tiny_two_gpu", "agent_first_run")]


@pytest.mark.parametrize("path", RUN_CONFIGS, ids=lambda p: p.stem)
def test_run_configs_load(path):
    assert load_run_config(path).model.vocab_size > 0


@pytest.mark.parametrize("path", AGENT_CONFIGS, ids=lambda p: p.stem)
def test_agent_configs_load(path):
    assert load_agent_config(path).context_budget_tokens > 0


@pytest.mark.parametrize("run,agent", PAIRS)
def test_episodes_fit_the_training_window(run, agent):
    run_cfg, agent_cfg = load_run_config(CONFIGS / f"{run}.yaml"), load_agent_config(CONFIGS / f"{agent}.yaml")
    assert agent_cfg.context_budget_tokens <= run_cfg.train.seq_len <= run_cfg.model.max_position_embeddings
