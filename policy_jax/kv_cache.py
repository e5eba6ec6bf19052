"""Key/value cache for batched generation.

Slots are shared by all rows: slot i of every row is written at the same step, so prompts are
left-aligned into the cache with padding first (`key_valid_bs` False on padding). Each row keeps its
own RoPE positions, so padding never shifts a row's positions. A slot may be attended only by
queries in the same or a later slot (causal by slot).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from policy_jax.model_config import ModelConfig


@dataclasses.dataclass
class KVCache:
    """keys[l], values[l]: [b, s, k, h] for layer l; key_valid_bs: [b, s] bool; end_index: int32 scalar,
    the number of slots written so far (the next write goes to slot end_index)."""

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    key_valid_bs: jax.Array
    end_index: jax.Array

    @property
    def num_slots(self) -> int:
        return self.key_valid_bs.shape[1]

    @property
    def nbytes(self) -> int:
        return sum(x.size * x.dtype.itemsize for x in self.keys + self.values)


jax.tree_util.register_dataclass(
    KVCache, data_fields=["keys", "values", "key_valid_bs", "end_index"], meta_fields=[]
)


def init_cache(cfg: ModelConfig, batch: int, num_slots: int, dtype=None) -> KVCache:
    """An empty cache of `num_slots` slots per row, in the compute dtype unless `dtype` is given."""
    dtype = dtype or cfg.compute_jnp_dtype
    shape = (batch, num_slots, cfg.num_key_value_heads, cfg.head_dim)
    zeros = lambda: jnp.zeros(shape, dtype)  # noqa: E731
    return KVCache(
        keys=tuple(zeros() for _ in range(cfg.num_hidden_layers)),
        values=tuple(zeros() for _ in range(cfg.num_hidden_layers)),
        key_valid_bs=jnp.zeros((batch, num_slots), bool),
        end_index=jnp.zeros((), jnp.int32),
    )


def write_layer(keys_bskh: jax.Array, values_bskh: jax.Array, new_k_btkh: jax.Array, new_v_btkh: jax.Array,
                end_index: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Write t new keys/values at slots [end_index, end_index + t) of one layer's cache."""
    start = (0, end_index, 0, 0)
    keys_bskh = jax.lax.dynamic_update_slice(keys_bskh, new_k_btkh.astype(keys_bskh.dtype), start)
    values_bskh = jax.lax.dynamic_update_slice(values_bskh, new_v_btkh.astype(values_bskh.dtype), start)
    return keys_bskh, values_bskh


def mark_written(cache_valid_bs: jax.Array, new_valid_bt: jax.Array, end_index: jax.Array) -> jax.Array:
    """key_valid after writing t slots whose validity is `new_valid_bt` [b, t] at `end_index`."""
    return jax.lax.dynamic_update_slice(cache_valid_bs, new_valid_bt.astype(bool), (0, end_index))


def cache_attention_mask(key_valid_bs: jax.Array, end_index: jax.Array, num_queries: int) -> jax.Array:
    """[b, 1, t, s] bool: query i (slot end_index + i) may see slot j iff j is valid and j <= its slot.

    `key_valid_bs` must already include the t slots being written.
    """
    query_slot_t = end_index + jnp.arange(num_queries)
    key_slot_s = jnp.arange(key_valid_bs.shape[1])
    causal_ts = key_slot_s[None, :] <= query_slot_t[:, None]
    return (key_valid_bs[:, None, None, :] & causal_ts[None, None, :, :])
