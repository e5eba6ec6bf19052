"""Building blocks of the decoder: RMSNorm, token embedding, SwiGLU MLP, rotary position embedding.

Axis letters: b batch, t query length, s key length, d hidden, f MLP width, v vocabulary,
n query heads, k key/value heads, h head dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from policy_jax.model_config import ModelConfig


def param(rngs: nnx.Rngs | None, shape: tuple[int, ...], axes: tuple[str | None, ...], dtype,
          init: str = "normal", stddev: float = 0.02) -> nnx.Param:
    """A parameter with its logical axes recorded (see sharding.LOGICAL_RULES)."""
    if init == "normal":
        value = stddev * jax.random.normal(rngs.params(), shape, jnp.float32)
    elif init == "zeros":
        value = jnp.zeros(shape, jnp.float32)
    elif init == "ones":
        value = jnp.ones(shape, jnp.float32)
    else:
        raise ValueError(f"unknown init {init!r}")
    return nnx.Param(value.astype(dtype), logical_axes=axes)


def rms_norm(x_btd: jax.Array, scale_d: jax.Array, eps: float) -> jax.Array:
    """x / sqrt(mean(x^2) + eps) * scale, the statistics in float32; result in x's dtype. [..., d] -> [..., d]."""
    x32 = x_btd.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return normed.astype(x_btd.dtype) * scale_d.astype(x_btd.dtype)


class RMSNorm(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.eps = cfg.rms_norm_eps
        self.scale_d = param(rngs, (cfg.hidden_size,), ("norm",), cfg.param_jnp_dtype, init="ones")

    def __call__(self, x_btd: jax.Array) -> jax.Array:
        return rms_norm(x_btd, self.scale_d.get_value(), self.eps)


class Embedder(nnx.Module):
    """Token id -> vector; its table is also the LM head when embeddings are tied."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.compute_dtype = cfg.compute_jnp_dtype
        self.embedding_vd = param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"),
                                  cfg.param_jnp_dtype, stddev=cfg.initializer_range)

    def __call__(self, tokens_bt: jax.Array) -> jax.Array:
        """[b, t] int -> [b, t, d] in the compute dtype."""
        return jnp.take(self.embedding_vd.get_value(), tokens_bt, axis=0).astype(self.compute_dtype)


class SwiGLU(nnx.Module):
    """down(silu(x @ gate) * (x @ up))."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, f, dt, std = cfg.hidden_size, cfg.intermediate_size, cfg.param_jnp_dtype, cfg.initializer_range
        self.compute_dtype = cfg.compute_jnp_dtype
        self.gate_df = param(rngs, (d, f), ("embed", "mlp"), dt, stddev=std)
        self.up_df = param(rngs, (d, f), ("embed", "mlp"), dt, stddev=std)
        self.down_fd = param(rngs, (f, d), ("mlp", "embed"), dt, stddev=std)

    def __call__(self, x_btd: jax.Array) -> jax.Array:
        c = self.compute_dtype
        gate_btf = jnp.einsum("btd,df->btf", x_btd, self.gate_df.get_value().astype(c))
        up_btf = jnp.einsum("btd,df->btf", x_btd, self.up_df.get_value().astype(c))
        return jnp.einsum("btf,fd->btd", jax.nn.silu(gate_btf) * up_btf, self.down_fd.get_value().astype(c))


def rope_inverse_frequencies(cfg: ModelConfig) -> np.ndarray:
    """The h/2 rotation frequencies theta^(-2i/h), float32, with Llama-3 scaling when configured."""
    h = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, h, 2, dtype=np.int64).astype(np.float32) / h))
    inv_freq = inv_freq.astype(np.float32)
    if cfg.rope_scaling_type == "llama3":
        inv_freq = _llama3_scaled(inv_freq, cfg)
    return inv_freq


def _llama3_scaled(inv_freq: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """Llama 3.1 frequency scaling: long wavelengths divided by `factor`, short ones kept, smooth between."""
    factor, low, high = cfg.rope_scaling_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
    old_len = cfg.rope_original_max_position_embeddings
    wavelen = 2 * np.pi / inv_freq
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def apply_rope(x_btnh: jax.Array, positions_bt: jax.Array, inv_freq_h2: np.ndarray) -> jax.Array:
    """Rotate pairs (x[i], x[i + h/2]) by angle position * inv_freq[i] (the "rotate half" layout).

    [b, t, n, h] with positions [b, t] -> [b, t, n, h] in x's dtype; angles in float32.
    """
    angles_bth2 = positions_bt.astype(jnp.float32)[:, :, None] * jnp.asarray(inv_freq_h2)[None, None, :]
    cos = jnp.cos(angles_bth2)[:, :, None, :].astype(x_btnh.dtype)
    sin = jnp.sin(angles_bth2)[:, :, None, :].astype(x_btnh.dtype)
    x1, x2 = jnp.split(x_btnh, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
