"""Sequence (context) parallelism as a mesh axis, on 8 host devices: the model's logits, log-probs
and the critic's gradients with each row's tokens split over the "sequence" axis (beside fsdp and tensor)
equal the single-device results computed with the plain masked attention."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from policy_helpers import random_model
from policy_jax.attention_dispatch import mesh_scope
from policy_jax.logprobs import recompute_logprobs
from policy_jax.model_config import ModelConfig
from policy_jax.sharding import MESH_AXES, MeshConfig, MeshConfigError, batch_sharding, make_mesh, shard_module
from policy_jax.transformer import CausalLM

BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, attention_bias=True, compute_dtype="float32")
B, T = 4, 32

needs_eight = pytest.mark.skipif(len(jax.devices()) < 8,
                                 reason="needs 8 devices (xla_force_host_platform_device_count)")


def _rows():
    rng = np.random.default_rng(0)
    seg = np.ones((B, T), np.int32)
    seg[0, 13:], seg[0, 26:] = 2, 3  # packed documents across the shards of row 0
    seg[2, 20:] = 0  # padding over the last shards of row 2
    tokens = rng.integers(1, 64, (B, T)).astype(np.int32) * (seg > 0)
    return jnp.asarray(tokens), jnp.asarray(seg)


def test_the_mesh_has_a_sequence_axis():
    assert "sequence" in MESH_AXES
    sizes = MeshConfig(fsdp=-1, tensor=2, sequence=2).sizes(8)
    assert sizes == {"data": 1, "fsdp": 2, "sequence": 2, "tensor": 2}
    assert tuple(sizes) == MESH_AXES
    assert MeshConfig(fsdp=-1, tensor=2, sequence=2).resolve(8) == (1, 2, 2)  # (data, fsdp, tensor) as before
    with pytest.raises(MeshConfigError, match="unknown mesh axes: context"):
        MeshConfig.from_dict({"context": 2})


@needs_eight
@pytest.mark.parametrize("layout", [dict(data=2, fsdp=1, sequence=4), dict(fsdp=2, sequence=2, tensor=2)])
def test_logits_and_logprobs_with_the_sequence_split_equal_one_device(layout):
    tokens, seg = _rows()
    plain = random_model(CausalLM, ModelConfig(**BASE), seed=1, scale=2.0)
    split = random_model(CausalLM, ModelConfig(**BASE, attention_impl="blockwise", attention_block_size=4), seed=1,
                         scale=2.0)
    mesh = make_mesh(MeshConfig(**layout))
    assert mesh.shape["sequence"] > 1
    shard_module(split, mesh)

    def on_mesh(model, tokens, seg):
        with mesh_scope(mesh):
            return model(tokens, None, seg), recompute_logprobs(model, tokens, None, seg, chunk_size=8)[0]

    put = lambda x: jax.device_put(x, batch_sharding(mesh, x.ndim))  # noqa: E731
    logits, logp = nnx.jit(on_mesh)(split, put(tokens), put(seg))
    logits_want = plain(tokens, None, seg)
    logp_want = recompute_logprobs(plain, tokens, None, seg, chunk_size=8)[0]
    valid = np.asarray(seg) != 0
    np.testing.assert_allclose(np.asarray(logits)[valid], np.asarray(logits_want)[valid], atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(logp), np.asarray(logp_want), atol=1e-4, rtol=0)


@needs_eight
def test_critic_gradients_with_the_sequence_split_equal_one_device():
    from policy_jax.run_config import OptimizerConfig
    from policy_jax.train_state import create_train_state, make_optimizer
    from policy_jax.train_steps import CriticObjective, ValueBatch, critic_gradients
    from policy_jax.transformer import Critic

    tokens, seg = _rows()
    returns = np.random.default_rng(2).standard_normal((B, T)).astype(np.float32)
    batch = ValueBatch(tokens_bt=tokens, positions_bt=jnp.broadcast_to(jnp.arange(T), (B, T)), segment_ids_bt=seg,
                       action_mask_bt=(seg > 0).astype(jnp.float32), returns_bt=jnp.asarray(returns))
    optimizer = make_optimizer(OptimizerConfig(learning_rate=1e-2), 4)

    def gradients(cfg, mesh):
        """The loss and gradients of the critic step (two micro-batches), traced in the step's mesh scope."""
        model = shard_module(random_model(Critic, cfg, seed=3, scale=2.0), mesh)
        state = create_train_state(model, optimizer, mesh)
        placed = jax.tree.map(lambda x: jax.device_put(x, batch_sharding(mesh, x.ndim)), batch)

        def fn(state, batch):
            with mesh_scope(mesh):
                return critic_gradients(state, batch, CriticObjective(num_micro_batches=2), mesh)

        (loss, _), grads = jax.jit(fn)(state, placed)
        return jax.device_get(loss), jax.device_get(grads)

    split_cfg = ModelConfig(**BASE, attention_impl="blockwise", attention_block_size=4)
    loss, grads = gradients(split_cfg, make_mesh(MeshConfig(fsdp=2, sequence=2, tensor=2)))
    loss_want, grads_want = gradients(ModelConfig(**BASE), make_mesh(MeshConfig(1, 1, 1), jax.devices()[:1]))
    np.testing.assert_allclose(loss, loss_want, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-4)
