"""The JAX sampler as the agent's policy: batched episodes, and rollout log-probs that a
recompute with the same model reproduces at every agent token (they line up with the tokens)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("flax")

from agent.batching import BatchedSamplerPolicy  # noqa: E402
from agent.chat import TokenizerAdapter  # noqa: E402
from agent.config import AgentConfig  # noqa: E402
from agent.demo_tokenizer import demo_tokenizer  # noqa: E402
from agent.episode import Task, run_episode, run_episodes  # noqa: E402


@pytest.fixture
def episodes_dir():
    path = Path(tempfile.mkdtemp(prefix="agent-jax-test-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def tiny_model(vocab_size):
    from flax import nnx

    from policy_jax.model_config import ModelConfig
    from policy_jax.sharding import iter_variables
    from policy_jax.transformer import CausalLM

    cfg = ModelConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=8192, param_dtype="float32", compute_dtype="float32",
    )
    model = nnx.eval_shape(lambda: CausalLM(cfg, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(0)
    for path, var in iter_variables(model):
        shape, dtype = var.get_value().shape, var.get_value().dtype
        value = 1.0 + 0.1 * rng.standard_normal(shape) if "scale_d" in path else rng.standard_normal(shape) / np.sqrt(shape[0])
        var.set_value(np.asarray(value, np.float32).astype(dtype))
    return model


@pytest.mark.slow
def test_jax_policy_episodes_batch_and_logprobs_line_up(episodes_dir):
    import jax.numpy as jnp

    from agent.policy_jax_backend import sampler_batch_function
    from policy_jax.logprobs import recompute_logprobs

    tokenizer = TokenizerAdapter(demo_tokenizer())
    lm = tiny_model(demo_tokenizer().get_vocab_size(with_added_tokens=True))
    policy = BatchedSamplerPolicy(sampler_batch_function(lm, pad_id=0, seed=1), tokenizer, max_batch=4, window_s=0.5)
    config = AgentConfig(max_turns=2, max_new_tokens_per_turn=12, context_budget_tokens=4096)
    tasks = [Task("short", "x = 1\n"), Task("a_much_longer_task_name", "x = 2\n")]
    results = asyncio.run(run_episodes(tasks, lambda t, i: policy, tokenizer, config, None, episodes_dir, concurrency=2))
    assert policy.batch_sizes[0] == 2  # both episodes' first turns went in one batch
    for result in results:
        traj = result.trajectory
        agent_positions = [i for i, m in enumerate(traj.loss_mask) if m]
        assert 1 <= len(agent_positions) <= 2 * 12
        # Recompute log p(token_i | tokens_<i) with the same model: equal to the sampler's at agent tokens.
        logp, _ = recompute_logprobs(lm, jnp.asarray([traj.tokens], jnp.int32))
        recomputed = np.asarray(logp[0])
        for i in agent_positions:
            assert traj.rollout_logprobs[i] == pytest.approx(float(recomputed[i - 1]), abs=2e-3), i
        assert all(traj.rollout_logprobs[i] == 0.0 for i, m in enumerate(traj.loss_mask) if not m)


def test_trajectory_file_feeds_the_rft_filter(episodes_dir):
    """The parquet the agent writes is what policy_jax's RFT stage reads and filters."""
    from agent.policy import ScriptedPolicy
    from agent.tool_calls import format_tool_call
    from agent.trajectory import write_trajectories
    from policy_jax.run_config import RFTConfig
    from policy_jax.stages import read_trajectory_rows, rft_filter

    tokenizer = TokenizerAdapter(demo_tokenizer())

    class Verdicts:
        async def submit(self, service, job, timeout=None):
            if b"infra" in job["solution"]["files"]["model_new.py"]:
                return {"status": "infra_error", "diagnostics": []}
            return {"status": "correct", "speedup": {"compile": 1.5, "eager": 2.0}, "reward": 3}

    def script(content, extra=()):
        return [format_tool_call("Write", {"file_path": "model_new.py", "content": content}), *extra, format_tool_call("profile", {})]

    scripts = [
        script("# good\n"),
        script("# good but sloppy\n", ['<tool_call>{"name": "Bash"}</tool_call>' + format_tool_call("Bash", {"command": "true"})]),
        script("# infra\n"),
        [format_tool_call("Bash", {"command": "ls"})] * 3 + script("# good, looping\n"),
    ]
    config = AgentConfig(max_turns=10)
    results = [
        asyncio.run(run_episode(Task("t", "x = 1\n"), ScriptedPolicy(s, tokenizer), tokenizer, config, Verdicts(), episodes_dir / str(i)))
        for i, s in enumerate(scripts)
    ]
    path = write_trajectories(results, episodes_dir / "traj.parquet")
    kept, rejected = rft_filter(read_trajectory_rows(path), RFTConfig())
    assert len(kept) == 1 and kept[0]["tokens"] == results[0].trajectory.tokens
    assert rejected == {"infrastructure_failure": 1, "reward": 0, "schema_violation": 1, "redundant_loop": 1, "no_agent_tokens": 0}
