"""Causal segment attention through the Pallas splash-attention kernel that ships with JAX for TPUs.

The kernel keeps the softmax online in VMEM, block by block, so memory is linear in the context
and no [t, t] array exists. It takes one row at a time with heads first ([n, t, h]) and a
grouped-query layout (n a multiple of the key/value heads); rows are mapped over with vmap.
Its mask is the causal mask and-ed with segment equality, which matches
`attention.segment_attention_mask` on every query that has a segment; padding queries (segment
0) are given zeros, as `blockwise_attention` does.

On a backend other than TPU the kernel runs in the Pallas interpreter: exact, slow, for tests.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from policy_jax.blockwise_attention import DEFAULT_BLOCK_SIZE, check_heads

LANES = 128  # the kernel's blocks are whole multiples of the TPU's 128 lanes


def splash_block(t: int, block_size: int) -> int:
    """The kernel's query and key block for a row of t tokens: at most `block_size`, a multiple of 128."""
    wanted = max(LANES, block_size // LANES * LANES)
    return min(wanted, -(-t // LANES) * LANES)


@functools.cache
def _kernel(t: int, heads: int, block: int, interpret: bool):
    """The kernel for rows of t tokens (a multiple of `block`) and `heads` query heads; built once per shape."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    mask = splash.MultiHeadMask([splash.CausalMask((t, t))] * heads)
    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                              block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    with jax.ensure_compile_time_eval():  # the mask tables are constants, kept across traces
        return splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)


def splash_attention(q_btnh: jax.Array, k_btkh: jax.Array, v_btkh: jax.Array, segment_ids_bt: jax.Array, *,
                     block_size: int = DEFAULT_BLOCK_SIZE, interpret: bool | None = None) -> jax.Array:
    """softmax(q kᵀ / √h) v under the causal segment mask, by the splash kernel. -> [b, t, n, h] in q's dtype.

    q [b, t, n, h]; k, v [b, t, k, h]; segment_ids [b, t] (0 = padding). Rows are padded to a
    multiple of the block with segment 0, which no real query sees. `interpret` defaults to
    "not on a TPU".
    """
    from jax.experimental.pallas.ops.tpu.splash_attention import SegmentIds

    check_heads(q_btnh, k_btkh)
    if interpret is None:
        interpret = jax.default_backend() != "tpu"
    b, t, n, h = q_btnh.shape
    block = splash_block(t, block_size)
    pad = -t % block
    widths = ((0, 0), (0, pad), (0, 0), (0, 0))
    q = (q_btnh.astype(jnp.float32) / (h ** 0.5)).astype(q_btnh.dtype)
    q_bnth, k_bkth, v_bkth = (jnp.pad(x.astype(q.dtype), widths).swapaxes(1, 2) for x in (q, k_btkh, v_btkh))
    seg_bt = jnp.pad(segment_ids_bt.astype(jnp.int32), ((0, 0), (0, pad)))
    kernel = _kernel(t + pad, n, block, bool(interpret))
    one_row = lambda q, k, v, s: kernel(q, k, v, segment_ids=SegmentIds(q=s, kv=s))  # noqa: E731
    out_btnh = jax.vmap(one_row)(q_bnth, k_bkth, v_bkth, seg_bt)
    out_btnh = out_btnh.swapaxes(1, 2)[:, :t]
    return jnp.where((segment_ids_bt != 0)[:, :, None, None], out_btnh, 0).astype(q_btnh.dtype)
