"""Shared helpers for the policy model/sampler/log-prob tests (H3's area)."""

from __future__ import annotations

import numpy as np
from flax import nnx

from policy_jax.sharding import iter_variables


def random_model(cls, cfg, seed: int = 0, scale: float = 1.0):
    """`cls(cfg)` with NumPy-random weights: the same model as a jax.random init, without compiling
    one random kernel per parameter shape (slow on a busy 2-core CPU). Norm scales near 1, other
    weights N(0, scale / fan_in) so the logits are O(1)."""
    model = nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(seed)
    for path, var in iter_variables(model):
        shape, dtype = var.get_value().shape, var.get_value().dtype
        if "scale_d" in path:
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        elif len(shape) <= 1:
            value = 0.1 * rng.standard_normal(shape)
        else:
            value = rng.standard_normal(shape) * scale / np.sqrt(shape[0])
        var.set_value(np.asarray(value, np.float32).astype(dtype))
    return model


def attention_inputs(b: int, t: int, n: int, kv: int, h: int, segments: dict, seed: int = 0):
    """q [b,t,n,h], k and v [b,t,kv,h] (float32, standard normal) and segment ids [b,t]: ones, with
    `segments` {(row, start): id} marking where later documents (or padding, id 0) begin."""
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((b, t, n, h)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((b, t, kv, h)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((b, t, kv, h)), jnp.float32)
    seg = np.ones((b, t), np.int32)
    for (row, start), segment in sorted(segments.items()):
        seg[row, start:] = segment
    return q, k, v, jnp.asarray(seg)


def plain_attention(q, k, v, seg):
    """The reference every other attention path is checked against: XLA's, with the full mask."""
    import jax

    from policy_jax.attention import segment_attention_mask

    return jax.nn.dot_product_attention(q, k, v, mask=segment_attention_mask(seg), implementation="xla")


def model_pair_on_packed_rows(**attention):
    """A tiny CausalLM with plain attention and the same weights with `attention` settings, plus
    tokens [2, 29] and segment ids with two packed documents in row 0 and padding in row 1."""
    import jax.numpy as jnp

    from policy_jax.model_config import ModelConfig
    from policy_jax.transformer import CausalLM

    base = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, attention_bias=True, compute_dtype="float32")
    plain = random_model(CausalLM, ModelConfig(**base), seed=5, scale=2.0)
    other = random_model(CausalLM, ModelConfig(**base, **attention), seed=5, scale=2.0)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 29)))
    seg = np.ones((2, 29), np.int32)
    seg[0, 11:] = 2
    seg[1, 25:] = 0
    return plain, other, tokens, jnp.asarray(seg)
