"""The on-policy loop end to end on the CPU: the JAX sampler plays episodes through the agent loop
and the bridge to host-backend evaluator workers, PPO updates the actor, and the next iteration's
rollouts come from the updated actor (its log-probs reproduce theirs, the old actor's do not)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("zmq")

REPO = Path(__file__).resolve().parents[1]


def _snapshot(actor_state):
    """A copy of the actor as it is now (the training step donates its arrays)."""
    import jax
    from flax import nnx

    graphdef, state = nnx.split(actor_state.module())
    return nnx.merge(graphdef, jax.tree.map(np.array, state))


@pytest.mark.slow
def test_two_iterations_sampler_agent_bridge_evaluator_ppo(tmp_path):
    import jax
    import jax.numpy as jnp

    from agent.chat import TokenizerAdapter
    from agent.config import load_agent_config
    from agent.demo_tokenizer import demo_tokenizer
    from agent.episode import load_task
    from agent.fleet import local_fleet
    from agent.on_policy import run_on_policy
    from bridge.client import BridgeClient
    from policy_jax.logprobs import recompute_logprobs
    from policy_jax.run_config import load_run_config

    tokenizer = TokenizerAdapter(demo_tokenizer())
    cfg = load_run_config(REPO / "configs" / "tiny_loop.yaml")
    assert cfg.model.vocab_size == demo_tokenizer().get_vocab_size(with_added_tokens=True)
    agent_cfg = load_agent_config("agent_loop")
    tasks = [load_task(REPO / "examples" / "tasks" / "elementwise_chain.py")]
    episodes_dir = Path(tempfile.mkdtemp(prefix="on-policy-", dir="/tmp"))
    episodes_dir.chmod(0o755)
    actors, log = {}, []
    try:
        with local_fleet(backend="host", log_dir=tmp_path / "fleet", fast_heartbeats=True) as endpoint, BridgeClient(endpoint) as client:
            states, iterations = run_on_policy(cfg, agent_cfg, tasks, tokenizer, client, 2, episodes_dir, concurrency=2,
                                               log=log.append, before_rollout=lambda i, actor: actors.__setitem__(i, _snapshot(actor)),
                                               devices=jax.devices()[:1])
    finally:
        shutil.rmtree(episodes_dir, ignore_errors=True)
    assert [it.record["actor_version"] for it in iterations] == [0, 1]
    assert all(row["actor_version"] == it.index for it in iterations for row in it.rows)
    assert int(states.actor.step) == 2 and all(np.isfinite(it.record["actor/loss"]) for it in iterations)
    assert all(row["final_status"] for it in iterations for row in it.rows)  # every episode reached the evaluator's verdict
    for it in iterations:  # the rollout metrics describe the iteration's own episodes
        shares = [v for k, v in it.record.items() if k.startswith("rollout/reward_share/")]
        assert sum(shares) == pytest.approx(1.0) and it.record["episodes_per_hour"] > 0
        passed = sum(1 for row in it.rows if row["reward"] >= 1) / len(it.rows)
        assert it.record["rollout/pass_rate"] == pytest.approx(passed)
        assert it.record["sampler/tokens_per_s"] > 0 and it.record["trainer/tokens_per_s"] > 0

    # The second iteration's rollouts came from the updated actor.
    def mismatch(actor, row):
        tokens = jnp.asarray([row["tokens"]], jnp.int32)
        logp = np.asarray(recompute_logprobs(actor, tokens, temperature=cfg.sampling.temperature)[0][0])
        agent = [i for i, m in enumerate(row["loss_mask"]) if m and i > 0]
        return max(abs(row["rollout_logprobs"][i] - float(logp[i - 1])) for i in agent)

    second = iterations[1].rows[0]
    assert mismatch(actors[1], second) < 2e-3
    assert mismatch(actors[0], second) > 5 * mismatch(actors[1], second)
