"""The attention kernels against the plain masked path at small sizes: splash (the Pallas TPU kernel,
interpreted on CPU) and blockwise agree with it on packed segments and padding, in float32 and
within bf16 tolerance; "auto" picks the kernel of the platform; splash laid over a mesh gives the
same result as on one device."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from policy_jax.attention_dispatch import mesh_scope, resolve_attention_impl, segment_attention
from policy_jax.blockwise_attention import blockwise_attention
from policy_jax.splash_attention import splash_attention, splash_block
from policy_helpers import attention_inputs, model_pair_on_packed_rows, plain_attention


def _inputs(b=2, t=200, n=4, kv=2, h=32, seed=0):
    # three packed documents in row 0, across kernel blocks; right padding in the last row
    return attention_inputs(b, t, n, kv, h, {(0, 90): 2, (0, 150): 3, (b - 1, 170): 0}, seed)


_plain = plain_attention


def _splash(q, k, v, seg):
    return splash_attention(q, k, v, seg, block_size=128, interpret=True)


def test_splash_outputs_and_gradients_match_the_plain_path():
    q, k, v, seg = _inputs()
    valid = np.asarray(seg) != 0
    got = jax.jit(_splash)(q, k, v, seg)
    np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(_plain(q, k, v, seg))[valid], atol=2e-5, rtol=0)
    assert np.all(np.asarray(got)[~valid] == 0)  # padding queries get zeros, as in blockwise attention

    weights = jnp.asarray(np.random.default_rng(1).standard_normal(got.shape), jnp.float32) * valid[:, :, None, None]
    loss = lambda fn: lambda q, k, v: jnp.sum(fn(q, k, v, seg) * weights)  # noqa: E731
    grads = jax.jit(jax.grad(loss(_splash), argnums=(0, 1, 2)))(q, k, v)
    grads_want = jax.jit(jax.grad(loss(_plain), argnums=(0, 1, 2)))(q, k, v)
    for g, w in zip(grads, grads_want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=5e-5, rtol=0)


def test_all_kernels_agree_within_bfloat16_tolerance():
    q, k, v, seg = _inputs(seed=2)
    valid = np.asarray(seg) != 0
    exact = np.asarray(_plain(q, k, v, seg))[valid]
    low = [x.astype(jnp.bfloat16) for x in (q, k, v)]
    outputs = {
        "plain": _plain(*low, seg),
        "blockwise": jax.jit(lambda q, k, v: blockwise_attention(q, k, v, seg, block_size=64))(*low),
        "splash": jax.jit(_splash)(*low, seg),
    }
    for name, out in outputs.items():
        assert out.dtype == jnp.bfloat16, name
        assert np.abs(np.asarray(out, np.float32)[valid] - exact).max() < 3e-2, name


def test_auto_picks_the_kernel_of_the_platform():
    assert resolve_attention_impl("auto", "tpu", "bfloat16") == "splash"
    assert resolve_attention_impl("auto", "gpu", "bfloat16") == "cudnn"
    assert resolve_attention_impl("auto", "gpu", "float32") == "blockwise"  # cuDNN takes bf16/fp16 only
    assert resolve_attention_impl("auto", "cpu", "bfloat16") == "blockwise"
    assert resolve_attention_impl("xla", "tpu", "bfloat16") == "xla"


def test_splash_blocks_are_whole_lanes_and_no_larger_than_the_row():
    assert splash_block(200, 512) == 256
    assert splash_block(131072, 512) == 512
    assert splash_block(131072, 300) == 256
    assert splash_block(5, 64) == 128


def test_splash_over_a_mesh_equals_one_device():
    """Rows split over data x fsdp and heads over tensor (shard_map), as in a sharded training step."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    from policy_jax.sharding import MeshConfig, make_mesh

    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    q, k, v, seg = _inputs(b=4, t=130, seed=3)
    valid = np.asarray(seg) != 0

    def sharded(q, k, v, seg):
        with mesh_scope(mesh):
            return segment_attention(q, k, v, seg, impl="splash", block_size=128)

    put = lambda x: jax.device_put(x, NamedSharding(mesh, P(("data", "fsdp"))))  # noqa: E731
    got = jax.jit(sharded)(put(q), put(k), put(v), put(seg))
    np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(_plain(q, k, v, seg))[valid], atol=2e-5, rtol=0)


def test_the_model_gives_the_same_logits_with_splash_attention():
    from flax import nnx

    plain, splash, tokens, seg = model_pair_on_packed_rows(attention_impl="splash", attention_block_size=128)
    forward = nnx.jit(lambda m, t, s: m(t, None, s))
    valid = np.asarray(seg) != 0
    np.testing.assert_allclose(np.asarray(forward(splash, tokens, seg))[valid],
                               np.asarray(forward(plain, tokens, seg))[valid], atol=1e-4, rtol=0)
