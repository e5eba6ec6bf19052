"""Causal attention over segments without a [t, t] array: memory linear in the context length.

Queries are taken in blocks; for each, the key/value blocks are visited in order with an online
softmax (a running maximum, normaliser and weighted sum), as in memory-efficient and flash
attention. Both loops are `lax.scan`s whose steps are rematerialised in the backward pass, so
what is kept for the gradient is O(b · t · n · h), never O(t²). It is plain XLA and runs on
every backend; it is the long-context path where no fused kernel applies.

Masking matches `attention.segment_attention_mask`: causal, within the same segment, never onto
padding (segment id 0). A query with no visible key (a padding position) gets zeros.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

DEFAULT_BLOCK_SIZE = 512
_NEG = -1e30  # "minus infinity" that keeps exp() and the arithmetic finite


def _pad_to(x: jax.Array, axis: int, multiple: int) -> jax.Array:
    pad = -x.shape[axis] % multiple
    if not pad:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


def _key_block_step(carry, key_block, *, q_bqkgh, q_seg_bq, q_idx_q, scale):
    """Fold one key/value block into the running softmax of one query block."""
    m_bkgq, l_bkgq, acc_bqkgh = carry
    k_bskh, v_bskh, k_seg_bs, k_idx_s = key_block
    scores_bkgqs = jnp.einsum("bqkgh,bskh->bkgqs", q_bqkgh, k_bskh, preferred_element_type=jnp.float32) * scale
    visible_bqs = (q_seg_bq[:, :, None] == k_seg_bs[:, None, :]) & (k_seg_bs[:, None, :] != 0) \
        & (q_idx_q[None, :, None] >= k_idx_s[None, None, :])
    scores_bkgqs = jnp.where(visible_bqs[:, None, None], scores_bkgqs, _NEG)
    m_new = jnp.maximum(m_bkgq, scores_bkgqs.max(axis=-1))
    p_bkgqs = jnp.exp(scores_bkgqs - m_new[..., None]) * visible_bqs[:, None, None]
    correction = jnp.exp(m_bkgq - m_new)
    l_new = l_bkgq * correction + p_bkgqs.sum(axis=-1)
    pv_bqkgh = jnp.einsum("bkgqs,bskh->bqkgh", p_bkgqs.astype(v_bskh.dtype), v_bskh, preferred_element_type=jnp.float32)
    acc_new = acc_bqkgh * jnp.moveaxis(correction, -1, 1)[..., None] + pv_bqkgh
    return (m_new, l_new, acc_new), None


def blockwise_attention(q_btnh: jax.Array, k_btkh: jax.Array, v_btkh: jax.Array, segment_ids_bt: jax.Array, *,
                        block_size: int = DEFAULT_BLOCK_SIZE) -> jax.Array:
    """softmax(q kᵀ / √h) v under the causal segment mask, block by block. -> [b, t, n, h] in q's dtype.

    q [b, t, n, h]; k, v [b, t, k, h] with n a multiple of k (grouped-query heads); segment_ids [b, t].
    """
    b, t, n, h = q_btnh.shape
    kv = k_btkh.shape[2]
    if n % kv:
        raise ValueError(f"{n} query heads are not a multiple of {kv} key/value heads")
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
    g, c = n // kv, min(block_size, t)
    q = _pad_to(q_btnh, 1, c).reshape(b, -1, kv, g, h)
    k, v = _pad_to(k_btkh, 1, c), _pad_to(v_btkh, 1, c)
    seg = _pad_to(segment_ids_bt.astype(jnp.int32), 1, c)  # padded positions are segment 0: never visible
    blocks = q.shape[1] // c
    idx = jnp.arange(blocks * c)
    # [blocks, ...] views for the scans
    q_blocks = q.reshape(b, blocks, c, kv, g, h).swapaxes(0, 1)
    k_blocks = k.reshape(b, blocks, c, kv, h).swapaxes(0, 1)
    v_blocks = v.reshape(b, blocks, c, kv, h).swapaxes(0, 1)
    seg_blocks = seg.reshape(b, blocks, c).swapaxes(0, 1)
    idx_blocks = idx.reshape(blocks, c)
    scale = 1.0 / (h ** 0.5)

    @jax.checkpoint
    def query_block(_, inputs):
        q_bqkgh, q_seg_bq, q_idx_q = inputs
        step = jax.checkpoint(functools.partial(_key_block_step, q_bqkgh=q_bqkgh, q_seg_bq=q_seg_bq, q_idx_q=q_idx_q, scale=scale))
        init = (jnp.full((b, kv, g, c), _NEG, jnp.float32), jnp.zeros((b, kv, g, c), jnp.float32),
                jnp.zeros((b, c, kv, g, h), jnp.float32))
        (_, l_bkgq, acc_bqkgh), _ = jax.lax.scan(step, init, (k_blocks, v_blocks, seg_blocks, idx_blocks))
        denominator = jnp.moveaxis(l_bkgq, -1, 1)[..., None]
        out = jnp.where(denominator > 0, acc_bqkgh / jnp.where(denominator > 0, denominator, 1.0), 0.0)
        return None, out.astype(q_btnh.dtype)

    _, out_blocks = jax.lax.scan(query_block, None, (q_blocks, seg_blocks, idx_blocks))
    return out_blocks.swapaxes(0, 1).reshape(b, blocks * c, n, h)[:, :t]
