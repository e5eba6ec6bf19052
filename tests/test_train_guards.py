"""Training that cannot learn stops loudly: a NaN loss, over-long trajectories (masked out and counted),
and PPO's metrics averaged over every mini-batch, each against a computation of its own."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx
from typer.testing import CliRunner

from cuda_agent.cli import app
from policy_jax.checkpoint import TrainCheckpointer
from policy_jax.demo_data import demo_rows
from policy_jax.run_config import load_run_config
from policy_jax.sharding import MeshConfig, make_mesh
from policy_jax.stages import BatchIterator, PPOStates, PPOUpdater, run_rft, take_rows, to_device
from policy_jax.train_run import new_state

CFG = load_run_config("configs/tiny.yaml")


@pytest.fixture(scope="module")
def mesh():
    return make_mesh(MeshConfig(1, 1, 1), jax.devices()[:1])


def clean_rows(n, max_len, seed):
    """Demo trajectories, every one trainable (no infrastructure failure)."""
    rows = demo_rows(n, CFG.model.vocab_size, max_len, seed=seed)
    for r in rows:
        r["reward"] = 1.0 if not r["reward"] == r["reward"] else r["reward"]
    return rows


def numpy_log_softmax(logits):
    z = logits - logits.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_a_divergent_run_stops_with_one_line_and_keeps_no_nan_checkpoint(tmp_path):
    data, ck = tmp_path / "d.parquet", tmp_path / "ck"
    config = tmp_path / "diverge.yaml"
    config.write_text(open("configs/tiny.yaml").read()
                      .replace("learning_rate: 1.0e-3\n  schedule: warmup_cosine\n  warmup_steps: 1",
                               "learning_rate: 1.0e+30\n  grad_clip_norm: null")
                      .replace("save_every: 2", "save_every: 1"))
    runner = CliRunner()
    assert runner.invoke(app, ["train-demo-data", "--out", str(data), "--rows", "16", "--max-len", "48"]).exit_code == 0
    args = ["train", "--stage", "rft", "--config", str(config), "--data", str(data), "--checkpoint-dir", str(ck),
            "--steps", "4", "--devices", "1"]
    for attempt in range(2):  # the rerun resumes from the last finite checkpoint and stops the same way
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        last = result.output.strip().splitlines()[-1]
        assert last.startswith("error: rft step ") and "non-finite loss=" in last and "stopped without saving" in last
        assert "Traceback" not in result.output
        with TrainCheckpointer(ck / "rft" / "actor") as saved:
            steps = saved.all_steps()
            assert steps and max(steps) < int(last.split("rft step ")[1].split(":")[0])
            saved.restore(new_state("actor", load_run_config(config), make_mesh(CFG.mesh), None, 4))  # all finite
        if attempt == 1:
            assert '"event": "resumed"' in result.output


def test_over_long_trajectories_are_masked_out_counted_and_the_loss_is_over_the_rest(mesh):
    cfg = dataclasses.replace(CFG, train=dataclasses.replace(CFG.train, seq_len=32, micro_batch_size=None))
    rows = clean_rows(8, 30, seed=2)
    rows[1]["tokens"], rows[1]["loss_mask"], rows[1]["rollout_logprobs"] = [7] * 40, [1] * 40, [0.0] * 40
    rows[5]["tokens"], rows[5]["loss_mask"], rows[5]["rollout_logprobs"] = [9] * 33, [0, 1] * 16 + [1], [0.0] * 33
    records = []
    initial = new_state("actor", cfg, mesh, None, 1).module()
    run_rft(new_state("actor", cfg, mesh, None, 1), BatchIterator(rows, 8, 32), cfg, mesh, 1, log=records.append)
    # Before the first update, which XLA compiles first, the stage says so (a silent minute otherwise).
    notice = {"stage": "rft", "event": "compiling", "step": 0, "note": "the first update compiles first (XLA)"}
    assert records[0] == notice
    records = records[1:]
    assert records[0]["truncated_trajectories"] == 2

    # The first step's loss (before its update) is the NLL of the agent tokens of the six rows that fit.
    nll, count = 0.0, 0
    for i, r in enumerate(rows):
        if i in (1, 5):
            continue
        tokens = np.asarray(r["tokens"])[None]
        logp = numpy_log_softmax(np.asarray(nnx.jit(lambda m, t: m(t))(initial, tokens), np.float64))[0]
        for t in range(1, tokens.shape[1]):
            if r["loss_mask"][t]:
                nll -= logp[t - 1, tokens[0, t]]
                count += 1
    assert records[0]["agent_tokens"] == count
    assert records[0]["loss"] == pytest.approx(nll / count, rel=1e-5)


def test_ppo_metrics_are_the_token_weighted_mean_of_every_mini_batch_of_every_epoch(mesh):
    cfg = dataclasses.replace(CFG, ppo=dataclasses.replace(CFG.ppo, mini_batch_size=4, epochs=2),
                              train=dataclasses.replace(CFG.train, seq_len=40, micro_batch_size=None))
    rows = clean_rows(8, 40, seed=3)
    for r in rows:  # a sampler that disagrees with the trainer: ratios move away from 1
        r["rollout_logprobs"] = [lp - 0.3 * m for lp, m in zip(r["rollout_logprobs"], r["loss_mask"])]
    host_tb = next(BatchIterator(rows, 8, 40))

    def fresh():
        return PPOStates(new_state("actor", cfg, mesh, None, 4), new_state("critic", cfg, mesh, None, 4))

    updater = PPOUpdater.build(fresh(), cfg, mesh, 8)
    _, record = updater.update(fresh(), host_tb)

    # The same four updates one by one, their metrics kept, then averaged here with NumPy.
    states = fresh()
    policy, value, _ = updater.prepare(states.actor, states.critic, to_device(host_tb, mesh))
    actor_metrics, critic_metrics = [], []
    for _epoch in range(2):
        for start in (0, 4):
            states.actor, a = updater.actor_step(states.actor, take_rows(policy, start, start + 4))
            states.critic, c = updater.critic_step(states.critic, take_rows(value, start, start + 4))
            actor_metrics.append({k: float(v) for k, v in jax.device_get(a).items()})
            critic_metrics.append({k: float(v) for k, v in jax.device_get(c).items()})
    assert record["actor/updates"] == 4 and record["critic/updates"] == 4
    for prefix, updates in (("actor", actor_metrics), ("critic", critic_metrics)):
        weights = np.array([u["agent_tokens"] for u in updates])
        assert record[f"{prefix}/agent_tokens"] == pytest.approx(weights.sum())
        for key in updates[0]:
            if key == "agent_tokens":
                continue
            values = np.array([u[key] for u in updates])
            keep = ~np.isnan(values)
            expected = (weights[keep] * values[keep]).sum() / weights[keep].sum()
            assert record[f"{prefix}/{key}"] == pytest.approx(expected, rel=1e-5, abs=1e-7), key
    last = actor_metrics[-1]["loss"]
    assert record["actor/loss"] != pytest.approx(last)  # not the last mini-batch's alone
