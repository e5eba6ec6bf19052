"""Orbax checkpoints of a sharded TrainState: round trip, identical resumed training, clear errors."""

import gc
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import orbax.checkpoint as ocp
from flax import nnx

from policy_jax.checkpoint import CheckpointError, TrainCheckpointer, _arrays_of
from policy_jax.run_config import load_run_config
from policy_jax.sharding import MeshConfig, batch_sharding, make_mesh, shard_module
from policy_jax.train_state import create_train_state, make_optimizer
from policy_jax.train_steps import CriticObjective, ValueBatch, make_critic_step
from policy_jax.transformer import Critic

CFG = load_run_config("configs/tiny.yaml")
B, T = 8, 16


@pytest.fixture(scope="module")
def mesh():
    return make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))


_INITIAL_MODELS = {}


def _copy_of(model):
    """A module with copies of `model`'s arrays (steps donate their state's arrays)."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(jnp.copy, state))


def fresh_state(mesh, seed=0, model_cfg=CFG.model):
    """A new state; each (seed, config) is initialised once per module (model init is slow on 2 cores)."""
    key = (seed, model_cfg)
    if key not in _INITIAL_MODELS:
        _INITIAL_MODELS[key] = Critic(model_cfg, rngs=nnx.Rngs(seed))
    model = shard_module(_copy_of(_INITIAL_MODELS[key]), mesh)
    return create_train_state(model, make_optimizer(CFG.critic_optimizer, total_steps=10), mesh)


def value_batch(mesh, seed):
    rng = np.random.default_rng(seed)
    batch = ValueBatch(
        tokens_bt=rng.integers(0, CFG.model.vocab_size, (B, T)).astype(np.int32),
        positions_bt=np.tile(np.arange(T, dtype=np.int32), (B, 1)),
        segment_ids_bt=np.ones((B, T), np.int32),
        action_mask_bt=(rng.random((B, T)) < 0.6).astype(np.float32),
        returns_bt=rng.normal(size=(B, T)).astype(np.float32),
    )
    return jax.tree.map(lambda x: jax.device_put(x, batch_sharding(mesh, x.ndim)), batch)


def host(tree):
    return jax.tree.map(np.asarray, jax.device_get(tree))


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(host(a)), jax.tree.leaves(host(b))):
        np.testing.assert_array_equal(x, y)


def test_round_trip_and_identical_resumed_training(mesh, tmp_path):
    step = make_critic_step(fresh_state(mesh), CriticObjective(), mesh)
    batches = [value_batch(mesh, s) for s in range(4)]

    state = fresh_state(mesh)
    for b in batches[:2]:
        state, _ = step(state, b)
    with TrainCheckpointer(tmp_path / "ck", max_to_keep=2) as ck:
        saved_step = ck.save(state, {"epoch": 0, "index": 2})
        snapshot = host({"params": state.params, "opt": state.opt_state, "step": state.step})
        for b in batches[2:]:
            state, _ = step(state, b)
        uninterrupted = host(state.params)

        restored, position = ck.restore(fresh_state(mesh, seed=1))
    assert saved_step == 2 and position == {"epoch": 0, "index": 2}
    assert int(restored.step) == 2
    assert_trees_equal(restored.params, snapshot["params"])
    assert_trees_equal(restored.opt_state, snapshot["opt"])
    # Restored arrays land on the template's shardings.
    for got, want in zip(jax.tree.leaves(restored.params), jax.tree.leaves(state.params)):
        assert got.sharding == want.sharding
    for b in batches[2:]:
        restored, _ = step(restored, b)
    assert_trees_equal(restored.params, uninterrupted)


def test_restore_without_checkpoint_is_a_clear_error(mesh, tmp_path):
    with TrainCheckpointer(tmp_path / "empty") as ck:
        with pytest.raises(CheckpointError, match="no checkpoint in"):
            ck.restore(fresh_state(mesh))
        ck.save(fresh_state(mesh))
        with pytest.raises(CheckpointError, match="no checkpoint for step 7"):
            ck.restore(fresh_state(mesh), step=7)


def test_restore_into_a_different_model_is_a_clear_error(mesh, tmp_path):
    with TrainCheckpointer(tmp_path / "ck") as ck:
        ck.save(fresh_state(mesh))
        wider = CFG.model.replace(intermediate_size=CFG.model.intermediate_size * 2)
        unraisable = []
        previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
        try:
            with pytest.raises(CheckpointError, match=r"does not fit.*mlp.*saved \(64, 128\) float32, wanted \(64, 256\)"):
                ck.restore(fresh_state(mesh, model_cfg=wider))
            gc.collect()
        finally:
            sys.unraisablehook = previous_hook
        # Refused before reading: no read of the checkpoint is left pending (they surfaced as
        # "exception ignored" warnings of Orbax's coroutines once collected).
        assert [str(u.exc_value)[:200] for u in unraisable] == []


def test_a_non_finite_state_is_never_saved_nor_resumed(mesh, tmp_path):
    state = fresh_state(mesh)
    first = jax.tree.leaves(state.params)[0]
    poisoned = state.replace(params=jax.tree.map(lambda x: x.at[(0,) * x.ndim].set(jnp.nan) if x is first else x,
                                                 state.params))
    with TrainCheckpointer(tmp_path / "ck") as ck:
        with pytest.raises(CheckpointError, match="step 0: not saved, non-finite parameters in"):
            ck.save(poisoned)
        assert ck.all_steps() == []
        # A NaN checkpoint written by something else (an older trainer) is refused on restore.
        ck._manager.save(0, args=ocp.args.Composite(state=ocp.args.StandardSave(_arrays_of(poisoned)),
                                                    data=ocp.args.JsonSave({})))
        ck._manager.wait_until_finished()
        with pytest.raises(CheckpointError, match="checkpoint step 0 in .* holds non-finite parameters"):
            ck.restore(fresh_state(mesh))
