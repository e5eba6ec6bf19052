"""Stage plumbing: RFT's rejection filter, resumable batches, trajectory files, run configs, PPO's rollout inputs."""

import dataclasses
import math

import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flax import nnx

from policy_jax.demo_data import demo_rows, write_demo_trajectories
from policy_jax.logprobs import recompute_logprobs
from policy_jax.run_config import RFTConfig, RunConfigError, load_run_config
from policy_jax.sharding import MeshConfig, make_mesh, shard_module
from policy_jax.stages import (BatchIterator, StageError, actor_objective, micro_batches_for, ppo_rollout_inputs, read_trajectory_rows,
                               rft_filter, to_device, trainable_rows)
from policy_jax.train_state import create_train_state, make_optimizer
from policy_jax.transformer import CausalLM, Critic


def row(reward, schema=0, loop=False, mask=(0, 1, 1)):
    return {"tokens": [1, 2, 3], "loss_mask": list(mask), "rollout_logprobs": [0.0, -1.0, -2.0], "reward": reward,
            "schema_violations": schema, "redundant_loop": loop}


def test_rft_filter_keeps_only_clean_successes():
    rows = [row(3.0), row(-1.0), row(0.0), row(2.0, schema=1), row(1.0, loop=True), row(float("nan")), row(None),
            row(1.0, mask=(0, 0, 0)), row(1.0)]
    kept, rejected = rft_filter(rows, RFTConfig())
    assert kept == [rows[0], rows[8]]
    assert rejected == {"infrastructure_failure": 2, "reward": 2, "schema_violation": 1, "redundant_loop": 1,
                        "no_agent_tokens": 1}
    lenient, _ = rft_filter(rows, RFTConfig(drop_schema_violations=False, drop_redundant_loops=False))
    assert lenient == [rows[0], rows[3], rows[4], rows[8]]
    assert len(trainable_rows(rows)) == len(rows) - 2


def test_batch_iterator_covers_each_epoch_and_resumes():
    rows = [dict(row(1.0), tokens=[i, i + 1, i + 2]) for i in range(12)]
    it = BatchIterator(rows, batch_size=4, seq_len=5, seed=3)
    epoch = [next(it) for _ in range(3)]
    firsts = [int(b.tokens_bt[k, 0]) for b in epoch for k in range(4)]
    assert sorted(firsts) == list(range(12))  # one epoch = every row once
    assert it.current_position() == {"epoch": 1, "index": 0}
    next(it)
    position = it.current_position()
    expected = [next(it).tokens_bt for _ in range(3)]
    resumed = BatchIterator(rows, batch_size=4, seq_len=5, seed=3, position=position)
    for want in expected:
        np.testing.assert_array_equal(next(resumed).tokens_bt, want)
    with pytest.raises(StageError, match="no trajectories"):
        BatchIterator([], batch_size=4, seq_len=5)


def test_trajectory_file_errors(tmp_path):
    with pytest.raises(StageError, match="not found"):
        read_trajectory_rows(tmp_path / "missing.parquet")
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(StageError, match="is not a parquet file"):
        read_trajectory_rows(tmp_path / "junk.parquet")
    pq.write_table(pa.table({"tokens": [[1, 2]], "reward": [1.0]}), tmp_path / "thin.parquet")
    with pytest.raises(StageError, match="lacks column.*loss_mask, rollout_logprobs"):
        read_trajectory_rows(tmp_path / "thin.parquet")
    path = write_demo_trajectories(tmp_path / "demo.parquet", rows=5, vocab_size=50, max_len=12)
    back = read_trajectory_rows(path)
    want = demo_rows(5, 50, 12)
    assert [r["tokens"] for r in back] == [r["tokens"] for r in want]
    assert back[2]["loss_mask"] == want[2]["loss_mask"]


def test_run_config_errors(tmp_path):
    def load(text, **overrides):
        p = tmp_path / "c.yaml"
        p.write_text(text)
        return load_run_config(p, overrides)

    base = open("configs/tiny.yaml").read()
    tiny = load(base).train
    assert micro_batches_for(tiny.global_batch_size, tiny.micro_batch_size) == 2
    assert load(base, **{"train.steps": 9}).train.steps == 9
    with pytest.raises(RunConfigError, match="unknown top-level keys: trian"):
        load(base + "\ntrian: {steps: 3}\n")
    with pytest.raises(RunConfigError, match="unknown keys in ppo: clip_hi"):
        load(base.replace("ppo:\n", "ppo:\n  clip_hi: 0.3\n"))
    with pytest.raises(RunConfigError, match=r"train.steps='many': expected int"):
        load(base.replace("steps: 4", "steps: many"))
    with pytest.raises(RunConfigError, match="schedule 'linear'"):
        load(base.replace("schedule: constant", "schedule: linear"))
    with pytest.raises(RunConfigError, match="not a multiple of micro_batch_size=3"):
        load(base.replace("micro_batch_size: 4", "micro_batch_size: 3"))
    with pytest.raises(RunConfigError, match="model: unknown model config keys: hiden_size"):
        load(base.replace("  hidden_size: 64", "  hiden_size: 64\n  hidden_size: 64"))
    with pytest.raises(RunConfigError, match="missing section 'train'"):
        load("model: {}\n")
    with pytest.raises(RunConfigError, match="not valid YAML"):
        load("model: [\n")
    with pytest.raises(RunConfigError, match="no config file"):
        load_run_config(tmp_path / "nope.yaml")
    paper = load_run_config("configs/paper.yaml")
    assert (paper.actor_optimizer.learning_rate, paper.critic_optimizer.learning_rate) == (3e-6, 6e-6)
    assert (paper.train.global_batch_size, paper.ppo.mini_batch_size, paper.train.seq_len) == (1024, 1024, 131072)
    assert (paper.ppo.clip_low, paper.ppo.clip_high, paper.ppo.gamma, paper.ppo.lam) == (0.2, 0.28, 1.0, 0.95)


def test_ppo_rollout_inputs_when_the_sampler_agrees_with_the_trainer():
    cfg = load_run_config("configs/tiny.yaml")
    mesh = make_mesh(MeshConfig(1, 1, 1), jax.devices()[:1])
    actor = create_train_state(shard_module(CausalLM(cfg.model, rngs=nnx.Rngs(0)), mesh),
                               make_optimizer(cfg.actor_optimizer, 4), mesh)
    critic = create_train_state(shard_module(Critic(cfg.model, rngs=nnx.Rngs(1)), mesh),
                                make_optimizer(cfg.critic_optimizer, 4), mesh)
    rows = [r for r in demo_rows(8, cfg.model.vocab_size, 24, seed=1)]
    for r in rows:
        r["reward"] = 1.0 if math.isnan(r["reward"]) else r["reward"]
    tb = next(BatchIterator(rows, batch_size=8, seq_len=24))
    # Give the batch the trainer's own FP32 log-probs as the "sampler's" (token-aligned: shift right by one).
    logp_pred = np.asarray(jax.jit(lambda a, t, p, s: recompute_logprobs(a.module(), t, p, s)[0])(
        actor, tb.tokens_bt, tb.positions_bt, tb.segment_ids_bt))
    token_aligned = np.concatenate([np.zeros((8, 1), np.float32), logp_pred[:, :-1]], axis=1) * tb.loss_mask_bt
    tb = tb.replace(rollout_logprobs_bt=token_aligned.astype(np.float32))
    objective = actor_objective(cfg, "ppo", 8)
    policy, value, diag = jax.jit(lambda a, c, b: ppo_rollout_inputs(a, c, b, cfg, objective))(
        actor, critic, to_device(tb, mesh))
    mask = np.asarray(tb.action_mask_bt) > 0
    np.testing.assert_allclose(np.asarray(policy.token_weights_bt)[mask], 1.0, atol=1e-5)
    assert float(diag["chi2"]) == pytest.approx(0.0, abs=1e-4)
    assert float(diag["prob_pearson"]) == pytest.approx(1.0, abs=1e-4)
    assert float(diag["tis_clipped_frac"]) == 0.0
    assert float(np.asarray(diag["ratio_bucket_count"]).sum()) == mask.sum()
    adv = np.asarray(policy.advantages_bt)
    assert abs(adv[mask].mean()) < 1e-4 and adv[mask].std() == pytest.approx(1.0, abs=1e-3)
    # Ablation arm: pi_old taken from the sampler, no TIS weights; the diagnostics still compare the two.
    rollout_arm = dataclasses.replace(cfg, ppo=dataclasses.replace(cfg.ppo, old_logprobs="rollout"))
    policy_r, _, _ = jax.jit(lambda a, c, b: ppo_rollout_inputs(a, c, b, rollout_arm, objective))(
        actor, critic, to_device(tb, mesh))
    np.testing.assert_array_equal(np.asarray(policy_r.old_logp_bt), np.asarray(tb.rollout_action_logprobs_bt) * mask)
    assert policy_r.token_weights_bt is None
    # gamma = 1: the value target on each row's last agent action is exactly the outcome reward.
    returns = np.asarray(value.returns_bt)
    for i in range(8):
        last = np.nonzero(mask[i])[0][-1]
        assert returns[i, last] == pytest.approx(float(tb.reward_b[i]), abs=1e-5)


def test_ppo_metrics_average_every_update_weighted_by_agent_tokens():
    from policy_jax.stages import average_metrics

    updates = [{"loss": 1.0, "clipfrac": 0.0, "agent_tokens": 10.0, "explained_variance": float("nan")},
               {"loss": 4.0, "clipfrac": 0.5, "agent_tokens": 30.0, "explained_variance": 0.5}]
    merged = average_metrics(updates)
    assert merged["loss"] == pytest.approx((1.0 * 10 + 4.0 * 30) / 40)
    assert merged["clipfrac"] == pytest.approx(0.375)
    assert merged["agent_tokens"] == 40.0 and merged["updates"] == 2
    assert merged["explained_variance"] == 0.5  # an undefined value in one update is left out
    assert average_metrics([]) == {}


def test_a_nan_loss_or_a_batch_without_agent_tokens_stops_with_one_clear_line():
    from policy_jax.rl.batch import pad_trajectories
    from policy_jax.stages import require_agent_tokens, require_finite_loss

    require_finite_loss({"loss": 0.5, "explained_variance": float("nan")}, "value", 3)  # NaN outside a loss is fine
    with pytest.raises(StageError, match="rft step 7: non-finite loss=nan; stopped without saving"):
        require_finite_loss({"loss": float("nan")}, "rft", 7)
    long_only = pad_trajectories([[1] * 100, [2] * 90], [[0, 1] * 50, [1] * 90], None, [1.0, 1.0], seq_len=64)
    with pytest.raises(StageError, match="no agent token to train on \\(2 longer than train.seq_len=64\\)"):
        require_agent_tokens(long_only, "rft")
