"""Causal attention over segments without a [t, t] array: memory linear in the context length.

Queries are taken in blocks; for each, the key/value blocks are visited in order with an online
softmax (a running maximum, normaliser and weighted sum), as in memory-efficient and flash
attention; a key block that no query of the block can see (in its future, or padding) is skipped.
Both loops are `lax.scan`s whose steps are rematerialised in the backward pass, so
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


def _fold_key_block(carry, key_block, *, q_bqkgh, q_seg_bq, q_idx_q, scale):
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
    return m_new, l_new, acc_new


def _key_block_step(carry, key_block, *, q_bqkgh, q_seg_bq, q_idx_q, scale):
    """Fold one key/value block into the running softmax of one query block, unless no query of the
    block can see any of its keys: keys all after the queries (about half the blocks, by causality),
    or queries or keys all padding. Folding such a block would leave the running softmax exactly as
    it is, so it is skipped (`lax.cond` runs one branch), in the forward and the backward pass."""
    _, _, k_seg_bs, k_idx_s = key_block
    seen = (q_idx_q[-1] >= k_idx_s[0]) & jnp.any(k_seg_bs != 0) & jnp.any(q_seg_bq != 0)
    fold = functools.partial(_fold_key_block, q_bqkgh=q_bqkgh, q_seg_bq=q_seg_bq, q_idx_q=q_idx_q, scale=scale)
    return jax.lax.cond(seen, fold, lambda carry, _: carry, carry, key_block), None


def check_heads(q_btnh, k_btkh):
    """Grouped-query heads: the query heads must be a whole multiple of the key/value heads."""
    n, kv = q_btnh.shape[2], k_btkh.shape[2]
    if n % kv:
        raise ValueError(f"{n} query heads are not a multiple of {kv} key/value heads")


def _check(q_btnh, k_btkh, block_size):
    check_heads(q_btnh, k_btkh)
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")


def _blocks(x, c):
    """[b, t, ...] padded to a multiple of c -> [t/c, b, c, ...]."""
    x = _pad_to(x, 1, c)
    return x.reshape(x.shape[0], x.shape[1] // c, c, *x.shape[2:]).swapaxes(0, 1)


def _attend(q_btnh, k_bskh, v_bskh, q_seg_bt, k_seg_bs, q_offset, block_size: int) -> jax.Array:
    """The block loops. Queries sit at global positions q_offset + [0, t); keys at [0, s)."""
    b, t, n, h = q_btnh.shape
    kv = k_bskh.shape[2]
    g, cq, ck = n // kv, min(block_size, t), min(block_size, k_bskh.shape[1])
    q_blocks = _blocks(q_btnh.reshape(b, t, kv, g, h), cq)
    q_seg_blocks = _blocks(q_seg_bt.astype(jnp.int32), cq)  # padded positions are segment 0: never visible
    q_idx_blocks = (q_offset + jnp.arange(q_seg_blocks.shape[0] * cq)).reshape(-1, cq)
    k_blocks, v_blocks = _blocks(k_bskh, ck), _blocks(v_bskh, ck)
    k_seg_blocks = _blocks(k_seg_bs.astype(jnp.int32), ck)
    k_idx_blocks = jnp.arange(k_seg_blocks.shape[0] * ck).reshape(-1, ck)
    scale = 1.0 / (h ** 0.5)

    @jax.checkpoint
    def query_block(_, inputs):
        q_bqkgh, q_seg_bq, q_idx_q = inputs
        step = jax.checkpoint(functools.partial(_key_block_step, q_bqkgh=q_bqkgh, q_seg_bq=q_seg_bq, q_idx_q=q_idx_q, scale=scale))
        init = (jnp.full((b, kv, g, cq), _NEG, jnp.float32), jnp.zeros((b, kv, g, cq), jnp.float32),
                jnp.zeros((b, cq, kv, g, h), jnp.float32))
        (_, l_bkgq, acc_bqkgh), _ = jax.lax.scan(step, init, (k_blocks, v_blocks, k_seg_blocks, k_idx_blocks))
        denominator = jnp.moveaxis(l_bkgq, -1, 1)[..., None]
        out = jnp.where(denominator > 0, acc_bqkgh / jnp.where(denominator > 0, denominator, 1.0), 0.0)
        return None, out.astype(q_btnh.dtype)

    _, out_blocks = jax.lax.scan(query_block, None, (q_blocks, q_seg_blocks, q_idx_blocks))
    return out_blocks.swapaxes(0, 1).reshape(b, -1, n, h)[:, :t]


def blockwise_attention(q_btnh: jax.Array, k_btkh: jax.Array, v_btkh: jax.Array, segment_ids_bt: jax.Array, *,
                        block_size: int = DEFAULT_BLOCK_SIZE) -> jax.Array:
    """softmax(q kᵀ / √h) v under the causal segment mask, block by block. -> [b, t, n, h] in q's dtype.

    q [b, t, n, h]; k, v [b, t, k, h] with n a multiple of k (grouped-query heads); segment_ids [b, t].
    """
    _check(q_btnh, k_btkh, block_size)
    return _attend(q_btnh, k_btkh, v_btkh, segment_ids_bt, segment_ids_bt, 0, block_size)


def context_parallel_attention(q_btnh: jax.Array, k_btkh: jax.Array, v_btkh: jax.Array, segment_ids_bt: jax.Array,
                               mesh, axis: str, *, block_size: int = DEFAULT_BLOCK_SIZE,
                               batch_axes: str | tuple[str, ...] | None = None,
                               head_axis: str | None = None) -> jax.Array:
    """blockwise_attention with the sequence split over the mesh axis `axis` (context parallelism).

    Each device keeps its slice of the queries and gathers every device's keys, values and
    segment ids (all-gather over `axis`), then attends blockwise with its queries' global
    positions. Per device: queries t/P, keys t (linear in t), no [t, t] array. The rows may be
    split over `batch_axes` and the query and key/value heads over `head_axis` at the same time
    (`mesh` may be abstract: the mesh of the computation being traced).
    """
    from jax.sharding import PartitionSpec as P

    _check(q_btnh, k_btkh, block_size)
    parts = mesh.shape[axis]
    if q_btnh.shape[1] % parts:
        raise ValueError(f"sequence of {q_btnh.shape[1]} tokens does not split over {parts} devices of axis {axis!r}")
    spec_tokens, spec_ids = P(batch_axes, axis, head_axis, None), P(batch_axes, axis)

    def local(q, k, v, seg):
        k_all = jax.lax.all_gather(k, axis, axis=1, tiled=True)
        v_all = jax.lax.all_gather(v, axis, axis=1, tiled=True)
        seg_all = jax.lax.all_gather(seg, axis, axis=1, tiled=True)
        offset = jax.lax.axis_index(axis) * q.shape[1]
        return _attend(q, k_all, v_all, seg, seg_all, offset, block_size)

    return jax.shard_map(local, mesh=mesh, in_specs=(spec_tokens, spec_tokens, spec_tokens, spec_ids),
                         out_specs=spec_tokens, check_vma=False)(q_btnh, k_btkh, v_btkh, segment_ids_bt)
