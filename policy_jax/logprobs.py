"""Per-token log-probabilities and entropies of given sequences, recomputed by the trainer.

The paper's fix for the rollout/trainer precision mismatch (docs/paper.md §8): the LM head runs
in float32 (float32 operands, so the head's weights are not rounded to bf16 first, float32
accumulation) and so does the log-softmax. At XLA's default precision a float32 product is one
bf16 pass on a TPU and TF32 on an NVIDIA GPU, which would round the float32 master weights again;
so with float32 hidden states the head asks for the highest precision, and with bf16 hidden states
(bf16 compute) it splits the float32 weights into three bf16 parts whose sum is exactly the
weights: every product is then exact in float32, and the head costs three bf16 passes
(`policy_jax/fp32_head.py`). `precision="bf16"` runs the same computation with bf16 logits and a bf16
log-softmax, for the ablations.

The head is applied chunk by chunk over the sequence (a `lax.map`), each chunk rematerialised in
the backward pass, so neither the forward nor the gradient ever holds the [b, t, v] logits: memory
is O(b * chunk * v) for the head, whatever the trajectory length.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from policy_jax.fp32_head import float32_logits

PRECISIONS = ("fp32", "bf16")
DEFAULT_CHUNK_SIZE = 1024


def next_token_targets(tokens_bt: jax.Array, segment_ids_bt: jax.Array) -> tuple[jax.Array, jax.Array]:
    """targets[:, t] = tokens[:, t+1] and whether that pair is scored (same non-padding segment).

    [b, t] -> ([b, t] int32, [b, t] bool); the last position is never scored.
    """
    targets_bt = jnp.concatenate([tokens_bt[:, 1:], jnp.zeros_like(tokens_bt[:, :1])], axis=1)
    next_seg_bt = jnp.concatenate([segment_ids_bt[:, 1:], jnp.zeros_like(segment_ids_bt[:, :1])], axis=1)
    scored_bt = (next_seg_bt == segment_ids_bt) & (segment_ids_bt != 0)
    return targets_bt.astype(jnp.int32), scored_bt


def _chunk_logprobs(hidden_bcd, targets_bc, head_dv, precision: str, temperature: float):
    """log p(target) and entropy for one chunk. [b, c, d], [b, c] -> ([b, c] f32, [b, c] f32)."""
    if precision == "fp32":  # float32 operands, accumulation and log-softmax
        logits_bcv = float32_logits(hidden_bcd, head_dv)
    else:
        logits_bcv = jnp.einsum("bcd,dv->bcv", hidden_bcd.astype(jnp.bfloat16), head_dv.astype(jnp.bfloat16),
                                preferred_element_type=jnp.bfloat16)
    if temperature != 1.0:
        logits_bcv = logits_bcv / jnp.asarray(temperature, logits_bcv.dtype)
    logp_bcv = jax.nn.log_softmax(logits_bcv, axis=-1)
    logp_bc = jnp.take_along_axis(logp_bcv, targets_bc[..., None], axis=-1)[..., 0]
    entropy_bc = -jnp.sum(jnp.exp(logp_bcv) * logp_bcv, axis=-1)
    return logp_bc.astype(jnp.float32), entropy_bc.astype(jnp.float32)


def token_logprobs_from_hidden(hidden_btd: jax.Array, head_dv: jax.Array, targets_bt: jax.Array, *,
                               precision: str = "fp32", chunk_size: int = DEFAULT_CHUNK_SIZE,
                               temperature: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """log softmax(hidden @ head / temperature)[target] and the distribution's entropy, per position.

    hidden [b, t, d], head [d, v], targets [b, t] -> (logp [b, t] f32, entropy [b, t] f32), computed in
    chunks of `chunk_size` positions (t need not be a multiple; the tail is padded and dropped).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: expected one of {PRECISIONS}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    b, t, d = hidden_btd.shape
    c = min(chunk_size, t)
    n = -(-t // c)
    pad = n * c - t
    if pad:
        hidden_btd = jnp.pad(hidden_btd, ((0, 0), (0, pad), (0, 0)))
        targets_bt = jnp.pad(targets_bt, ((0, 0), (0, pad)))
    hidden_nbcd = hidden_btd.reshape(b, n, c, d).transpose(1, 0, 2, 3)
    targets_nbc = targets_bt.reshape(b, n, c).transpose(1, 0, 2)
    one_chunk = jax.checkpoint(functools.partial(_chunk_logprobs, head_dv=head_dv, precision=precision,
                                                 temperature=temperature))
    logp_nbc, entropy_nbc = jax.lax.map(lambda xs: one_chunk(*xs), (hidden_nbcd, targets_nbc))
    unchunk = lambda x_nbc: x_nbc.transpose(1, 0, 2).reshape(b, n * c)[:, :t]  # noqa: E731
    return unchunk(logp_nbc), unchunk(entropy_nbc)


def recompute_logprobs(lm, tokens_bt: jax.Array, positions_bt: jax.Array | None = None,
                       segment_ids_bt: jax.Array | None = None, *, precision: str = "fp32",
                       chunk_size: int = DEFAULT_CHUNK_SIZE, temperature: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """The trainer's per-token log-probs and entropies of `tokens` under `lm` (a CausalLM).

    Alignment: logp[:, t] = log p(tokens[:, t+1] | tokens[:, :t+1]), i.e. position t scores the
    *next* token; it is 0 at the last position and wherever tokens t and t+1 are not in the same
    non-padding segment. entropy[:, t] is the entropy of that next-token distribution (0 on padding).
    Both [b, t] float32. `temperature` divides the logits, as the sampler did; the sampler's top-k/top-p
    truncation is deliberately not applied (the trainer scores the full policy).
    """
    if segment_ids_bt is None:
        segment_ids_bt = jnp.ones_like(tokens_bt, dtype=jnp.int32)
    hidden_btd = lm.backbone(tokens_bt, positions_bt, segment_ids_bt)
    targets_bt, scored_bt = next_token_targets(tokens_bt, segment_ids_bt)
    head_dv = lm.head_weight()  # the parameter dtype: the fp32 path must not see it rounded to bf16
    if precision != "fp32":
        head_dv = head_dv.astype(lm.config.compute_jnp_dtype)
    logp_bt, entropy_bt = token_logprobs_from_hidden(hidden_btd, head_dv, targets_bt, precision=precision,
                                                     chunk_size=chunk_size, temperature=temperature)
    return jnp.where(scored_bt, logp_bt, 0.0), jnp.where(segment_ids_bt != 0, entropy_bt, 0.0)


def recompute_logprobs_fp32(lm, tokens_bt, positions_bt=None, segment_ids_bt=None, **kwargs):
    """`recompute_logprobs` with the float32 head and log-softmax (the paper's setting)."""
    return recompute_logprobs(lm, tokens_bt, positions_bt, segment_ids_bt, precision="fp32", **kwargs)
