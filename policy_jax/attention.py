"""Grouped-query self-attention with rotary positions, optional q/k/v bias and an optional KV cache."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from policy_jax import kv_cache
from policy_jax.attention_dispatch import forward_attention_impl, segment_attention
from policy_jax.layers import apply_rope, param, rope_inverse_frequencies
from policy_jax.model_config import ModelConfig


def segment_attention_mask(segment_ids_bt: jax.Array) -> jax.Array:
    """[b, 1, t, t] bool: causal, within the same segment, never onto padding (segment id 0)."""
    seg = segment_ids_bt
    t = seg.shape[1]
    causal_tt = jnp.arange(t)[:, None] >= jnp.arange(t)[None, :]
    same_btt = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] != 0)
    return (same_btt & causal_tt[None])[:, None]


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, n, k, h = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        dt, std = cfg.param_jnp_dtype, cfg.initializer_range
        self.compute_dtype = cfg.compute_jnp_dtype
        self.block_size = cfg.attention_block_size
        self.attention_impl, self.compute_dtype_name = cfg.attention_impl, cfg.compute_dtype
        self.inv_freq_h2 = tuple(rope_inverse_frequencies(cfg).tolist())  # static constant, not a parameter
        self.q_dnh = param(rngs, (d, n, h), ("embed", "q_heads", "head_dim"), dt, stddev=std)
        self.k_dkh = param(rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), dt, stddev=std)
        self.v_dkh = param(rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), dt, stddev=std)
        self.o_nhd = param(rngs, (n, h, d), ("q_heads", "head_dim", "embed"), dt, stddev=std)
        if cfg.attention_bias:
            self.q_bias_nh = param(rngs, (n, h), ("q_heads", "head_dim"), dt, init="zeros")
            self.k_bias_kh = param(rngs, (k, h), ("kv_heads", "head_dim"), dt, init="zeros")
            self.v_bias_kh = param(rngs, (k, h), ("kv_heads", "head_dim"), dt, init="zeros")
        else:
            self.q_bias_nh = self.k_bias_kh = self.v_bias_kh = None
        self.o_bias_d = param(rngs, (d,), ("embed",), dt, init="zeros") if cfg.attention_out_bias else None

    def _project(self, x_btd, kernel, bias, spec):
        c = self.compute_dtype
        y = jnp.einsum(spec, x_btd, kernel.get_value().astype(c))
        return y if bias is None else y + bias.get_value().astype(c)

    def project_qkv(self, x_btd: jax.Array, positions_bt: jax.Array):
        """Queries [b, t, n, h] and keys [b, t, k, h] with rotary positions, values [b, t, k, h]."""
        q_btnh = self._project(x_btd, self.q_dnh, self.q_bias_nh, "btd,dnh->btnh")
        k_btkh = self._project(x_btd, self.k_dkh, self.k_bias_kh, "btd,dkh->btkh")
        v_btkh = self._project(x_btd, self.v_dkh, self.v_bias_kh, "btd,dkh->btkh")
        inv_freq_h2 = np.asarray(self.inv_freq_h2, np.float32)
        return apply_rope(q_btnh, positions_bt, inv_freq_h2), apply_rope(k_btkh, positions_bt, inv_freq_h2), v_btkh

    def __call__(self, x_btd: jax.Array, positions_bt: jax.Array, mask_b1ts: jax.Array | None, *,
                 seq_lengths_b: jax.Array | None = None,
                 segment_ids_bt: jax.Array | None = None,
                 layer_cache: tuple[jax.Array, jax.Array] | None = None,
                 end_index: jax.Array | None = None):
        """Attend over the current tokens (no cache) or over the cache after writing them into it.

        x [b, t, d], positions [b, t], mask [b, 1, t, s] (s = t without cache, cache slots with one).
        With `attention_impl="cudnn"` and no cache, `seq_lengths_b` replaces the mask (right padding);
        with a segment kernel ("blockwise", "splash"), `segment_ids_bt` does (memory linear in t,
        laid over the traced mesh: see attention_dispatch).
        Returns (out [b, t, d], updated (keys, values) of this layer or None).
        """
        q_btnh, k_btkh, v_btkh = self.project_qkv(x_btd, positions_bt)
        new_cache = None
        if layer_cache is not None:
            keys_bskh, values_bskh = kv_cache.write_layer(*layer_cache, k_btkh, v_btkh, end_index)
            new_cache = (keys_bskh, values_bskh)
            out_btnh = jax.nn.dot_product_attention(
                q_btnh, keys_bskh.astype(q_btnh.dtype), values_bskh.astype(q_btnh.dtype),
                mask=mask_b1ts, implementation="xla")
        elif segment_ids_bt is not None:  # the backbone chose a segment kernel (long contexts)
            impl = forward_attention_impl(self.attention_impl, self.compute_dtype_name)
            out_btnh = segment_attention(q_btnh, k_btkh, v_btkh, segment_ids_bt, impl=impl, block_size=self.block_size)
        elif mask_b1ts is None:  # the backbone chose the fused cuDNN kernel (right-padded rows)
            out_btnh = jax.nn.dot_product_attention(
                q_btnh, k_btkh, v_btkh, is_causal=True, query_seq_lengths=seq_lengths_b,
                key_value_seq_lengths=seq_lengths_b, implementation="cudnn")
        else:
            out_btnh = jax.nn.dot_product_attention(q_btnh, k_btkh, v_btkh, mask=mask_b1ts, implementation="xla")

        out_btd = jnp.einsum("btnh,nhd->btd", out_btnh, self.o_nhd.get_value().astype(self.compute_dtype))
        if self.o_bias_d is not None:
            out_btd = out_btd + self.o_bias_d.get_value().astype(self.compute_dtype)
        return out_btd, new_cache
