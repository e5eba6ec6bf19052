"""The Qwen2/Llama decoder: a backbone of pre-norm layers, with an LM head (policy) or a value head (critic)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from policy_jax import kv_cache as kvc
from policy_jax.attention import Attention, segment_attention_mask
from policy_jax.attention_dispatch import SEGMENT_IMPLEMENTATIONS, constrain_activations, forward_attention_impl
from policy_jax.fp32_head import float32_logits
from policy_jax.layers import Embedder, RMSNorm, SwiGLU, param
from policy_jax.model_config import ModelConfig

_ModuleList = getattr(nnx, "List", list)


def default_positions(tokens_bt: jax.Array) -> jax.Array:
    """0, 1, 2, ... along each row. [b, t] -> [b, t] int32."""
    return jnp.broadcast_to(jnp.arange(tokens_bt.shape[1], dtype=jnp.int32), tokens_bt.shape)


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.input_layernorm = RMSNorm(cfg, rngs=rngs)
        self.self_attn = Attention(cfg, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(cfg, rngs=rngs)
        self.mlp = SwiGLU(cfg, rngs=rngs)

    def __call__(self, x_btd, positions_bt, mask_b1ts, *, seq_lengths_b=None, segment_ids_bt=None, layer_cache=None, end_index=None):
        """x [b, t, d] -> (x [b, t, d], this layer's updated cache or None)."""
        attn_btd, new_cache = self.self_attn(
            self.input_layernorm(x_btd), positions_bt, mask_b1ts,
            seq_lengths_b=seq_lengths_b, segment_ids_bt=segment_ids_bt, layer_cache=layer_cache, end_index=end_index)
        x_btd = x_btd + attn_btd
        x_btd = x_btd + self.mlp(self.post_attention_layernorm(x_btd))
        return x_btd, new_cache


def _run_layer(layer: DecoderLayer, x_btd, positions_bt, mask_b1ts, seq_lengths_b, segment_ids_bt):
    return layer(x_btd, positions_bt, mask_b1ts, seq_lengths_b=seq_lengths_b, segment_ids_bt=segment_ids_bt)[0]


@functools.cache
def _run_layer_remat(policy_name: str):
    """_run_layer recomputed in the backward pass, keeping what `jax.checkpoint_policies.<policy_name>` saves."""
    return nnx.remat(_run_layer, policy=getattr(jax.checkpoint_policies, policy_name))


class Backbone(nnx.Module):
    """Embedding, decoder layers and the final RMSNorm: tokens -> normalised hidden states."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        self.embed_tokens = Embedder(cfg, rngs=rngs)
        self.layers = _ModuleList([DecoderLayer(cfg, rngs=rngs) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg, rngs=rngs)

    def __call__(self, tokens_bt: jax.Array, positions_bt: jax.Array | None = None,
                 segment_ids_bt: jax.Array | None = None) -> jax.Array:
        """Final-normalised hidden states [b, t, d] in the compute dtype.

        segment_ids [b, t]: tokens attend causally within their own segment; 0 marks padding
        (default: one segment per row). positions [b, t] default to 0..t-1.
        """
        if positions_bt is None:
            positions_bt = default_positions(tokens_bt)
        if segment_ids_bt is None:
            segment_ids_bt = jnp.ones_like(tokens_bt, dtype=jnp.int32)
        impl = forward_attention_impl(self.config.attention_impl, self.config.compute_dtype)
        fused = impl == "cudnn" and self.config.compute_dtype in ("bfloat16", "float16")
        blocks = None
        if fused:  # cuDNN flash attention takes bf16/fp16 only; a float32 model falls back to XLA
            mask_b1ts, seq_lengths_b = None, jnp.sum(segment_ids_bt != 0, axis=1).astype(jnp.int32)
        elif impl in SEGMENT_IMPLEMENTATIONS:  # no [t, t] mask: the segment ids go to the layers
            mask_b1ts, seq_lengths_b, blocks = None, None, segment_ids_bt
        else:
            mask_b1ts, seq_lengths_b = segment_attention_mask(segment_ids_bt), None
        run = _run_layer_remat(self.config.remat_policy) if self.config.remat else _run_layer
        x_btd = constrain_activations(self.embed_tokens(tokens_bt))
        for layer in self.layers:
            x_btd = run(layer, x_btd, positions_bt, mask_b1ts, seq_lengths_b, blocks)
        return self.norm(x_btd)

    def forward_with_cache(self, tokens_bt: jax.Array, positions_bt: jax.Array, valid_bt: jax.Array,
                           cache: kvc.KVCache) -> tuple[jax.Array, kvc.KVCache]:
        """Run t new tokens against the cache, writing them at slots [end_index, end_index + t).

        valid [b, t] bool marks real tokens (False = padding, never attended). Returns the hidden
        states [b, t, d] and the cache with end_index advanced by t.
        """
        t = tokens_bt.shape[1]
        key_valid_bs = kvc.mark_written(cache.key_valid_bs, valid_bt, cache.end_index)
        mask_b1ts = kvc.cache_attention_mask(key_valid_bs, cache.end_index, t)
        x_btd = self.embed_tokens(tokens_bt)
        keys, values = [], []
        for i, layer in enumerate(self.layers):
            x_btd, (k, v) = layer(x_btd, positions_bt, mask_b1ts,
                                  layer_cache=(cache.keys[i], cache.values[i]), end_index=cache.end_index)
            keys.append(k)
            values.append(v)
        new_cache = kvc.KVCache(tuple(keys), tuple(values), key_valid_bs, cache.end_index + t)
        return self.norm(x_btd), new_cache


class CausalLM(nnx.Module):
    """The policy: backbone + LM head (tied to the embedding or separate)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        self.backbone = Backbone(cfg, rngs=rngs)
        if cfg.tie_word_embeddings:
            self.lm_head_dv = None
        else:
            self.lm_head_dv = param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"),
                                    cfg.param_jnp_dtype, stddev=cfg.initializer_range)

    def head_weight(self) -> jax.Array:
        """The LM head as [d, v] in the parameter dtype."""
        if self.lm_head_dv is None:
            return self.backbone.embed_tokens.embedding_vd.get_value().T
        return self.lm_head_dv.get_value()

    def head(self, hidden_btd: jax.Array, accumulate_dtype=None) -> jax.Array:
        """Logits [b, t, v] in `accumulate_dtype` (default: the compute dtype).

        A float32 head is float32 throughout: operands as well as the accumulation, so that the
        head's weights are not rounded to the compute dtype first (policy_jax/fp32_head.py).
        """
        if accumulate_dtype == jnp.float32:
            return float32_logits(hidden_btd, self.head_weight())
        operand = self.config.compute_jnp_dtype
        return jnp.einsum("btd,dv->btv", hidden_btd.astype(operand), self.head_weight().astype(operand),
                          preferred_element_type=accumulate_dtype or operand)

    def __call__(self, tokens_bt: jax.Array, positions_bt: jax.Array | None = None,
                 segment_ids_bt: jax.Array | None = None) -> jax.Array:
        """Logits [b, t, v] in the compute dtype (see Backbone.__call__ for the arguments)."""
        return self.head(self.backbone(tokens_bt, positions_bt, segment_ids_bt))


class Critic(nnx.Module):
    """The value model: the same backbone with a scalar head; values in float32."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        self.backbone = Backbone(cfg, rngs=rngs)
        self.value_d = param(rngs, (cfg.hidden_size,), ("embed",), cfg.param_jnp_dtype, stddev=cfg.initializer_range)
        self.value_bias = param(rngs, (), (), cfg.param_jnp_dtype, init="zeros")

    def __call__(self, tokens_bt: jax.Array, positions_bt: jax.Array | None = None,
                 segment_ids_bt: jax.Array | None = None) -> jax.Array:
        """V(s_t) [b, t] float32: the value of the state ending at token t."""
        hidden_btd = self.backbone(tokens_bt, positions_bt, segment_ids_bt)
        return (jnp.einsum("btd,d->bt", hidden_btd.astype(jnp.float32), self.value_d.get_value().astype(jnp.float32))
                + self.value_bias.get_value().astype(jnp.float32))
