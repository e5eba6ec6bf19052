"""Training steps on 8 fake CPU devices: sharded == unsharded, micro-batches == whole batch,
masked tokens get no gradient, the RFT loss matches log-softmax of the model's logits, AdamW wiring."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from policy_jax.distributed import global_batch_from_local, wants_distributed
from policy_jax.run_config import DistributedConfig, OptimizerConfig, load_run_config
from policy_jax.sharding import MeshConfig, batch_sharding, make_mesh, shard_module
from policy_jax.train_state import create_train_state, learning_rate_schedule, make_optimizer
from policy_jax.train_steps import (
    ActorObjective,
    CriticObjective,
    PolicyBatch,
    ValueBatch,
    actor_gradients,
    critic_gradients,
    make_actor_step,
    make_critic_step,
)
from policy_jax.transformer import CausalLM, Critic

CFG = load_run_config("configs/tiny.yaml")
B, T = 8, 16
RNG = np.random.default_rng(0)


def host(tree):
    return jax.tree.map(np.asarray, jax.device_get(tree))


@pytest.fixture(scope="module")
def meshes():
    return {"one": make_mesh(MeshConfig(1, 1, 1), jax.devices()[:1]), "eight": make_mesh(MeshConfig(2, 2, 2))}


def place(batch, mesh):
    return jax.tree.map(lambda x: jax.device_put(x, batch_sharding(mesh, x.ndim)), batch)


def sequences():
    """Rows of unequal length (right padding), agent spans separated by environment spans."""
    lengths = [16, 12, 9, 16, 5, 14, 16, 10]
    seg = np.zeros((B, T), np.int32)
    mask = np.zeros((B, T), np.float32)
    for i, n in enumerate(lengths):
        seg[i, :n] = 1
        mask[i, 1:n] = (np.arange(1, n) % 5) < 3  # 3 agent tokens, 2 tool tokens, ...
    pos = np.where(seg > 0, np.arange(T)[None, :], 0).astype(np.int32)
    tokens = RNG.integers(1, CFG.model.vocab_size, (B, T)).astype(np.int32) * seg
    action_mask = np.concatenate([mask[:, 1:], np.zeros((B, 1), np.float32)], axis=1)
    return tokens, pos, seg, action_mask


def policy_batch(kind="ppo"):
    tokens, pos, seg, action_mask = sequences()
    extra = {}
    if kind == "ppo":
        extra = dict(
            old_logp_bt=(np.log(RNG.uniform(0.001, 0.01, (B, T))) * action_mask).astype(np.float32),
            advantages_bt=RNG.normal(size=(B, T)).astype(np.float32) * action_mask,
            token_weights_bt=RNG.uniform(0.5, 2.0, (B, T)).astype(np.float32),
        )
    return PolicyBatch(tokens_bt=tokens, positions_bt=pos, segment_ids_bt=seg, action_mask_bt=action_mask, **extra)


def value_batch():
    tokens, pos, seg, action_mask = sequences()
    return ValueBatch(tokens_bt=tokens, positions_bt=pos, segment_ids_bt=seg, action_mask_bt=action_mask,
                      returns_bt=RNG.normal(size=(B, T)).astype(np.float32),
                      old_values_bt=RNG.normal(size=(B, T)).astype(np.float32))


_INITIAL_MODELS = {}


def _copy_of(model):
    """A module with copies of `model`'s arrays (steps donate their state's arrays)."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(jnp.copy, state))


def new_state(cls, mesh, opt_cfg):
    """A fresh state from the same initial weights (each model class is initialised once per module: slow on 2 cores)."""
    if cls not in _INITIAL_MODELS:
        _INITIAL_MODELS[cls] = cls(CFG.model, rngs=nnx.Rngs(0))
    model = _copy_of(_INITIAL_MODELS[cls])
    return create_train_state(shard_module(model, mesh), make_optimizer(opt_cfg, 10), mesh)


def assert_close_trees(a, b, atol):
    for x, y in zip(jax.tree.leaves(host(a)), jax.tree.leaves(host(b))):
        np.testing.assert_allclose(x, y, atol=atol, rtol=0)


def run_three_steps(kind, mesh):
    if kind == "critic":
        state = new_state(Critic, mesh, CFG.critic_optimizer)
        step = make_critic_step(state, CriticObjective(value_clip=0.5, num_micro_batches=2), mesh)
        batch = value_batch()
    else:
        state = new_state(CausalLM, mesh, CFG.actor_optimizer)
        step = make_actor_step(state, ActorObjective(kind="ppo", logprob_chunk_size=8, num_micro_batches=2), mesh)
        batch = policy_batch()
    batch = place(batch, mesh)
    losses = []
    for _ in range(3):  # the actor's warm-up schedule gives learning rate 0 at the first update
        state, metrics = step(state, batch)
        losses.append(float(metrics["value_loss" if kind == "critic" else "loss"]))
    return losses, state


@pytest.mark.slow  # ~25 s of CPU each (two compiles, one on 8 devices)
@pytest.mark.parametrize("kind", ["critic", "actor"])
def test_sharded_step_equals_single_device_step(kind, meshes):
    global RNG
    RNG = np.random.default_rng(1)
    losses_one, state_one = run_three_steps(kind, meshes["one"])
    RNG = np.random.default_rng(1)
    losses_eight, state_eight = run_three_steps(kind, meshes["eight"])
    np.testing.assert_allclose(losses_one, losses_eight, rtol=1e-5)
    assert losses_one[0] != losses_one[2]  # the updates changed the parameters
    assert int(state_one.step) == int(state_eight.step) == 3
    assert_close_trees(state_one.params, state_eight.params, atol=2e-5)
    # Parameters really are split over the 8 devices.
    assert any(len(x.sharding.device_set) == 8 and not x.sharding.is_fully_replicated
               for x in jax.tree.leaves(state_eight.params))


_actor_gradients = jax.jit(actor_gradients, static_argnums=2)
_critic_gradients = jax.jit(critic_gradients, static_argnums=2)


def grads_of(state, batch, objective):
    (loss, _), grads = _actor_gradients(state, batch, objective)
    return float(loss), host(grads)


def max_diff(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_masked_positions_get_zero_gradient(meshes):
    mesh = meshes["one"]
    state = new_state(CausalLM, mesh, CFG.actor_optimizer)
    objective = ActorObjective(kind="ppo", logprob_chunk_size=8)
    batch = policy_batch()
    loss, grads = grads_of(state, batch, objective)
    masked = batch.action_mask_bt == 0
    padding = batch.segment_ids_bt == 0
    assert masked.any() and padding.any()
    perturbed = batch.replace(
        old_logp_bt=np.where(masked, -7.0, batch.old_logp_bt).astype(np.float32),
        advantages_bt=np.where(masked, 50.0, batch.advantages_bt).astype(np.float32),
        token_weights_bt=np.where(masked, 9.0, batch.token_weights_bt).astype(np.float32),
        tokens_bt=np.where(padding, 3, batch.tokens_bt).astype(np.int32),
    )
    loss_p, grads_p = grads_of(state, perturbed, objective)
    assert loss_p == pytest.approx(loss, rel=1e-6)
    assert max_diff(grads, grads_p) < 1e-7
    # Control: the same change on one agent token does move the gradient.
    i, t = np.argwhere(~masked)[0]
    adv = batch.advantages_bt.copy()
    adv[i, t] += 50.0
    _, grads_c = grads_of(state, batch.replace(advantages_bt=adv), objective)
    assert max_diff(grads, grads_c) > 1e-4


def test_critic_masked_returns_get_zero_gradient(meshes):
    mesh = meshes["one"]
    state = new_state(Critic, mesh, CFG.critic_optimizer)
    objective = CriticObjective()
    batch = value_batch()
    (_, _), grads = _critic_gradients(state, batch, objective)
    masked = batch.action_mask_bt == 0
    perturbed = batch.replace(returns_bt=np.where(masked, 100.0, batch.returns_bt).astype(np.float32))
    (_, _), grads_p = _critic_gradients(state, perturbed, objective)
    assert max_diff(host(grads), host(grads_p)) < 1e-7


def test_micro_batches_add_up_to_the_whole_batch(meshes):
    mesh = meshes["one"]
    state = new_state(CausalLM, mesh, CFG.actor_optimizer)
    batch = policy_batch()
    for aggregation in ("token-mean",):  # the other aggregations' normalisers: tests/test_rl_math.py
        whole = ActorObjective(kind="ppo", loss_aggregation=aggregation, logprob_chunk_size=8)
        split = ActorObjective(kind="ppo", loss_aggregation=aggregation, logprob_chunk_size=8, num_micro_batches=4)
        loss_w, grads_w = grads_of(state, batch, whole)
        loss_s, grads_s = grads_of(state, batch, split)
        assert loss_s == pytest.approx(loss_w, rel=1e-5)
        assert max_diff(grads_w, grads_s) < 1e-6


def test_rft_loss_is_nll_of_agent_tokens_under_the_models_logits(meshes):
    mesh = meshes["one"]
    state = new_state(CausalLM, mesh, CFG.actor_optimizer)
    batch = policy_batch("rft")
    (loss, sums), _ = _actor_gradients(state, batch, ActorObjective(kind="rft", logprob_chunk_size=8))
    logits = np.asarray(state.module()(batch.tokens_bt, batch.positions_bt, batch.segment_ids_bt), np.float64)
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    total, count = 0.0, 0
    for i in range(B):
        for t in range(T - 1):
            if batch.action_mask_bt[i, t]:
                total -= logits[i, t, batch.tokens_bt[i, t + 1]] - logz[i, t]
                count += 1
    assert float(loss) == pytest.approx(total / count, rel=1e-4)
    assert float(sums["tokens"]) == count


def test_adamw_with_clipping_matches_a_hand_computation():
    cfg = OptimizerConfig(learning_rate=0.1, weight_decay=0.01, grad_clip_norm=1.0, b1=0.9, b2=0.999, eps=1e-8)
    tx = make_optimizer(cfg, total_steps=10).tx
    p = {"w": jnp.array([1.0, -2.0, 3.0])}
    grads = [np.array([3.0, 4.0, 0.0]), np.array([0.1, -0.2, 0.3])]
    state = tx.init(p)
    w, m, v = np.array([1.0, -2.0, 3.0]), np.zeros(3), np.zeros(3)
    for k, g in enumerate(grads, start=1):
        upd, state = tx.update({"w": jnp.asarray(g, jnp.float32)}, state, p)
        p = {"w": p["w"] + upd["w"]}
        g = g * min(1.0, 1.0 / np.linalg.norm(g))
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        mhat, vhat = m / (1 - 0.9**k), v / (1 - 0.999**k)
        w = w - 0.1 * (mhat / (np.sqrt(vhat) + 1e-8) + 0.01 * w)
    np.testing.assert_allclose(np.asarray(p["w"]), w, rtol=1e-5)


def test_learning_rate_schedules():
    cos = learning_rate_schedule(OptimizerConfig(learning_rate=1.0, schedule="warmup_cosine", warmup_steps=2), 10)
    assert [float(cos(s)) for s in (0, 1, 2)] == pytest.approx([0.0, 0.5, 1.0])
    assert float(cos(6)) == pytest.approx(0.5 * (1 + math.cos(math.pi * 4 / 8)))
    assert float(cos(10)) == pytest.approx(0.0, abs=1e-7)
    warm = learning_rate_schedule(OptimizerConfig(learning_rate=2.0, schedule="warmup_constant", warmup_steps=4), 10)
    assert [float(warm(s)) for s in (0, 2, 4, 9)] == pytest.approx([0.0, 1.0, 2.0, 2.0])
    const = learning_rate_schedule(OptimizerConfig(learning_rate=3e-6), 10)
    assert float(const(7)) == pytest.approx(3e-6)


def test_distributed_switch_and_local_batch_assembly(meshes):
    assert not wants_distributed(DistributedConfig(), environ={})
    assert wants_distributed(DistributedConfig(), environ={"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"})
    assert wants_distributed(DistributedConfig(), environ={"TPU_WORKER_HOSTNAMES": "a,b,c,d"})
    assert not wants_distributed(DistributedConfig(), environ={"TPU_WORKER_HOSTNAMES": "localhost"})
    assert not wants_distributed(DistributedConfig(initialize=False), environ={"SLURM_JOB_ID": "7"})
    assert wants_distributed(DistributedConfig(coordinator_address="h:1"), environ={})
    with pytest.raises(ValueError, match="expected true, false or auto"):
        wants_distributed(DistributedConfig(initialize="sometimes"), environ={})
    mesh = meshes["eight"]
    local = {"tokens_bt": np.arange(8 * 3).reshape(8, 3), "reward_b": np.arange(8.0)}
    glob = global_batch_from_local(local, lambda ndim: batch_sharding(mesh, ndim))
    np.testing.assert_array_equal(np.asarray(glob["tokens_bt"]), local["tokens_bt"])
    assert glob["tokens_bt"].sharding == batch_sharding(mesh, 2)
