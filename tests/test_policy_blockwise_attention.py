"""Blockwise attention (memory linear in the context) against the plain masked attention at small
sizes: the same outputs and gradients on packed segments and padding, and no [t, t] array."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from policy_jax.blockwise_attention import blockwise_attention
from policy_helpers import attention_inputs, model_pair_on_packed_rows, plain_attention


def _inputs(b=2, t=37, n=4, kv=2, h=8, seed=0):
    # two packed documents in row 0; right padding in the last row
    return attention_inputs(b, t, n, kv, h, {(0, 20): 2, (b - 1, 30): 0}, seed)


_plain = plain_attention


# one query per block, blocks that leave a remainder (37 = 4 x 8 + 5), one block, a block longer than the row
@pytest.mark.parametrize("block_size", [1, 8, 37, 64])
def test_outputs_and_gradients_match_the_plain_path(block_size):
    q, k, v, seg = _inputs()
    valid = np.asarray(seg) != 0
    blocked = jax.jit(lambda q, k, v: blockwise_attention(q, k, v, seg, block_size=block_size))
    plain = jax.jit(lambda q, k, v: _plain(q, k, v, seg))
    got, want = blocked(q, k, v), plain(q, k, v)
    np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(want)[valid], atol=2e-5, rtol=0)
    assert np.all(np.asarray(got)[~valid] == 0)  # a padding query sees nothing: zeros

    weights = jnp.asarray(np.random.default_rng(1).standard_normal(got.shape), jnp.float32) * jnp.asarray(valid)[:, :, None, None]
    loss = lambda fn: lambda q, k, v: jnp.sum(fn(q, k, v) * weights)  # noqa: E731
    grads = jax.jit(jax.grad(loss(blocked), argnums=(0, 1, 2)))(q, k, v)
    grads_want = jax.jit(jax.grad(loss(plain), argnums=(0, 1, 2)))(q, k, v)
    for g, w in zip(grads, grads_want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=5e-5, rtol=0)


def test_bfloat16_inputs_stay_close_to_float32():
    q, k, v, seg = _inputs(t=64, seed=2)
    valid = np.asarray(seg) != 0
    exact = np.asarray(blockwise_attention(q, k, v, seg, block_size=16))
    low = blockwise_attention(q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v.astype(jnp.bfloat16), seg, block_size=16)
    assert low.dtype == jnp.bfloat16
    assert np.abs(np.asarray(low, np.float32)[valid] - exact[valid]).max() < 3e-2


def test_no_array_grows_with_the_square_of_the_context():
    """At t = 4096 with blocks of 256, no intermediate of the forward or the backward holds t² elements."""
    t, c = 4096, 256
    q, k, v, seg = _inputs(b=1, t=t, n=2, kv=1, h=8)
    fn = jax.grad(lambda q, k, v: jnp.sum(blockwise_attention(q, k, v, seg, block_size=c)), argnums=(0, 1, 2))
    text = jax.jit(fn).lower(q, k, v).as_text()
    shapes = [s for s in __import__("re").findall(r"tensor<([0-9x]+)x(?:f32|bf16|i1|i32)>", text)]
    largest = max(np.prod([int(d) for d in s.split("x")]) for s in shapes)
    assert largest < t * t // 8, largest
    assert largest >= t * 8  # the check sees real arrays (the [t, n, h]-sized ones)


def test_bad_arguments_are_refused():
    q, k, v, seg = _inputs()
    with pytest.raises(ValueError, match="not a multiple"):
        blockwise_attention(q[:, :, :3], k, v, seg)
    with pytest.raises(ValueError, match="block_size must be positive"):
        blockwise_attention(q, k, v, seg, block_size=0)


def test_the_model_gives_the_same_logits_and_gradients_with_blockwise_attention():
    from flax import nnx

    plain, blocked, tokens, seg = model_pair_on_packed_rows(attention_impl="blockwise", attention_block_size=8)
    forward = nnx.jit(lambda m, t, s: m(t, None, s))
    valid = np.asarray(seg) != 0
    np.testing.assert_allclose(np.asarray(forward(blocked, tokens, seg))[valid], np.asarray(forward(plain, tokens, seg))[valid], atol=1e-4, rtol=0)
    loss = lambda m: jnp.sum(jnp.where(seg[..., None] != 0, m(tokens, None, seg), 0.0) ** 2)  # noqa: E731
    gradient = nnx.jit(nnx.grad(loss))
    g_blocked, g_plain = gradient(blocked), gradient(plain)
    for a, b in zip(jax.tree.leaves(g_blocked), jax.tree.leaves(g_plain)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-3, rtol=1e-4)


def test_context_parallel_attention_on_eight_devices_equals_the_unsharded_result():
    """The sequence split over a mesh axis of 4 (keys and values all-gathered), beside a data axis
    of 2: the same outputs and gradients as one device, with packed segments and padding."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from policy_jax.blockwise_attention import context_parallel_attention

    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "sequence"))
    q, k, v, seg = _inputs(b=2, t=64, seed=3)
    seg = np.asarray(seg).copy()
    seg[0, 20:], seg[0, 50:] = 2, 3  # three documents across shard boundaries in row 0
    seg[1, 40:] = 0  # padding over the last shards of row 1
    seg = jnp.asarray(seg)
    valid = np.asarray(seg) != 0
    put = lambda x: jax.device_put(x, NamedSharding(mesh, P(None, "sequence", *([None] * (x.ndim - 2)))))  # noqa: E731
    fn = jax.jit(lambda q, k, v, s: context_parallel_attention(q, k, v, s, mesh, "sequence", block_size=8))
    got = fn(put(q), put(k), put(v), put(seg))
    want = _plain(q, k, v, seg)
    np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(want)[valid], atol=2e-5, rtol=0)

    weights = jnp.asarray(np.random.default_rng(4).standard_normal(got.shape), jnp.float32) * jnp.asarray(valid)[:, :, None, None]
    grads = jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v, put(seg)) * weights), argnums=(0, 1, 2)))(put(q), put(k), put(v))
    grads_want = jax.jit(jax.grad(lambda q, k, v: jnp.sum(_plain(q, k, v, seg) * weights), argnums=(0, 1, 2)))(q, k, v)
    for g, w in zip(grads, grads_want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=5e-5, rtol=0)
    with pytest.raises(ValueError, match="does not split over 4 devices"):
        context_parallel_attention(q[:, :62], k[:, :62], v[:, :62], seg[:, :62], mesh, "sequence")
