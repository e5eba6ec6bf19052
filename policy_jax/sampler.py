"""Batched rollout generation with a KV cache: prefill, then a compiled decode loop.

Prompts may be padded on either side; they are left-aligned into the cache (padding first), each
row keeping its own positions 0..len-1. The decode loop is one `lax.while_loop` inside one jitted
call that owns (and, on accelerators, donates) the cache; it stops when every row has produced a
stop token or `max_new_tokens` are out.

The returned log-probs are those of the distribution each token was actually drawn from — after
temperature, top-k and top-p — computed in the sampler's own precision (the model's compute dtype,
bf16 by default). That is what truncated importance sampling compares the trainer's FP32 recompute
against (docs/paper.md section 8).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from policy_jax import kv_cache as kvc

LOGITS_PRECISIONS = ("compute", "fp32")


class SamplerError(ValueError):
    """Bad generation request (one clear line for the user)."""


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy (argmax); top_k 0 and top_p 1.0 = off.

    `logits_precision` "compute" keeps the head and softmax in the model's compute dtype (the usual
    bf16 rollout engine); "fp32" runs them in float32 (an FP32-head rollout arm).
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    logits_precision: str = "compute"

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise SamplerError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise SamplerError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise SamplerError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise SamplerError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.logits_precision not in LOGITS_PRECISIONS:
            raise SamplerError(f"logits_precision={self.logits_precision!r}: expected one of {LOGITS_PRECISIONS}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))


@dataclasses.dataclass
class SampleOutput:
    """tokens [b, n] (pad_id after a row stops), logprobs [b, n] (sampler precision, 0 after a stop),
    lengths [b] (generated tokens, the stop token included), stopped [b] (ended on a stop token),
    prompt_lengths [b]; n = max_new_tokens."""

    tokens: jax.Array
    logprobs: jax.Array
    lengths: jax.Array
    stopped: jax.Array
    prompt_lengths: jax.Array


# ---- pure pieces ---------------------------------------------------------------------------------
def left_align(tokens_bt: jax.Array, mask_bt: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Move each row's real tokens (mask True) to the right end, keeping their order.

    [b, t], [b, t] -> (tokens [b, t], mask [b, t], lengths [b]); works for left, right or any padding.
    """
    order_bt = jnp.argsort(mask_bt.astype(jnp.int32), axis=1, stable=True)  # padding first
    tokens_bt = jnp.take_along_axis(tokens_bt, order_bt, axis=1)
    mask_bt = jnp.take_along_axis(mask_bt, order_bt, axis=1)
    return tokens_bt, mask_bt, jnp.sum(mask_bt, axis=1).astype(jnp.int32)


def filter_logits(logits_bv: jax.Array, temperature: float, top_k: int, top_p: float) -> jax.Array:
    """Logits of the distribution to sample from: divided by temperature, then -inf outside the top-k
    and outside the smallest top set whose probability reaches top_p. Ties at a cut-off are kept.

    [b, v] -> [b, v], same dtype.
    """
    neg_inf = jnp.asarray(-jnp.inf, logits_bv.dtype)
    if temperature not in (0.0, 1.0):
        logits_bv = logits_bv / jnp.asarray(temperature, logits_bv.dtype)
    if top_k:
        kth_b1 = jax.lax.top_k(logits_bv, top_k)[0][:, -1:]
        logits_bv = jnp.where(logits_bv >= kth_b1, logits_bv, neg_inf)
    if top_p < 1.0:
        sorted_bv = jnp.sort(logits_bv, axis=-1)[:, ::-1]
        probs_bv = jax.nn.softmax(sorted_bv.astype(jnp.float32), axis=-1)
        mass_before_bv = jnp.cumsum(probs_bv, axis=-1) - probs_bv
        keep_bv = mass_before_bv < top_p  # always keeps the most likely token
        cutoff_b1 = jnp.min(jnp.where(keep_bv, sorted_bv, jnp.inf), axis=-1, keepdims=True).astype(logits_bv.dtype)
        logits_bv = jnp.where(logits_bv >= cutoff_b1, logits_bv, neg_inf)
    return logits_bv


def sample_from_logits(key: jax.Array, logits_bv: jax.Array, params: SamplingParams) -> tuple[jax.Array, jax.Array]:
    """Draw one token per row; return it with its log-prob under the filtered distribution.

    Greedy (temperature 0) takes the argmax and reports its log-prob under the temperature-1
    filtered distribution. [b, v] -> ([b] int32, [b] in logits' dtype).
    """
    greedy = params.temperature == 0.0
    filtered_bv = filter_logits(logits_bv, 1.0 if greedy else params.temperature, params.top_k, params.top_p)
    if greedy:
        token_b = jnp.argmax(filtered_bv, axis=-1)
    else:
        # the Gumbel draw in float32: bf16 noise is too coarse to sample the stated distribution faithfully
        token_b = jax.random.categorical(key, filtered_bv.astype(jnp.float32), axis=-1)
    logp_bv = jax.nn.log_softmax(filtered_bv, axis=-1)
    logp_b = jnp.take_along_axis(logp_bv, token_b[:, None], axis=-1)[:, 0]
    return token_b.astype(jnp.int32), logp_b


def _head_logits(lm, hidden_btd: jax.Array, logits_precision: str) -> jax.Array:
    if logits_precision == "fp32":
        return lm.head(hidden_btd, accumulate_dtype=jnp.float32)
    return lm.head(hidden_btd)


def prefill(lm, tokens_bt: jax.Array, mask_bt: jax.Array, num_slots: int,
            logits_precision: str = "compute") -> tuple[jax.Array, kvc.KVCache, jax.Array]:
    """Run left-aligned prompts into a fresh cache of `num_slots` slots.

    tokens/mask [b, t] (padding first) -> (next-token logits [b, v], cache, next positions [b]).
    """
    b, t = tokens_bt.shape
    positions_bt = jnp.maximum(jnp.cumsum(mask_bt, axis=1) - 1, 0).astype(jnp.int32)
    cache = kvc.init_cache(lm.config, b, num_slots)
    hidden_btd, cache = lm.backbone.forward_with_cache(tokens_bt, positions_bt, mask_bt, cache)
    logits_bv = _head_logits(lm, hidden_btd[:, -1:], logits_precision)[:, 0]
    return logits_bv, cache, jnp.sum(mask_bt, axis=1).astype(jnp.int32)


def decode_step(lm, token_b: jax.Array, position_b: jax.Array, valid_b: jax.Array, cache: kvc.KVCache,
                logits_precision: str = "compute") -> tuple[jax.Array, kvc.KVCache]:
    """Feed one token per row at the next cache slot. [b], [b], [b] -> (logits [b, v], cache)."""
    hidden_b1d, cache = lm.backbone.forward_with_cache(token_b[:, None], position_b[:, None], valid_b[:, None], cache)
    return _head_logits(lm, hidden_b1d, logits_precision)[:, 0], cache


def _decode_loop(lm, logits_bv, cache, next_position_b, key, params: SamplingParams, pad_id: int):
    """Sample, record, feed back; until every row stopped or max_new_tokens. Returns SampleOutput parts."""
    b = logits_bv.shape[0]
    n = params.max_new_tokens
    stop_ids = jnp.asarray(params.stop_token_ids or (-1,), jnp.int32)
    tokens_bn = jnp.full((b, n), pad_id, jnp.int32)
    logps_bn = jnp.zeros((b, n), logits_bv.dtype)
    done_b = jnp.zeros((b,), bool)
    stopped_b = jnp.zeros((b,), bool)
    lengths_b = jnp.zeros((b,), jnp.int32)

    def cond(carry):
        step, _, _, _, _, _, _, done_b, *_ = carry
        return (step < n) & ~jnp.all(done_b)

    def body(carry):
        step, logits_bv, cache, position_b, key, tokens_bn, logps_bn, done_b, stopped_b, lengths_b = carry
        key, draw = jax.random.split(key)
        token_b, logp_b = sample_from_logits(draw, logits_bv, params)
        active_b = ~done_b
        token_b = jnp.where(active_b, token_b, pad_id)
        logp_b = jnp.where(active_b, logp_b, 0)
        tokens_bn = jax.lax.dynamic_update_slice(tokens_bn, token_b[:, None], (0, step))
        logps_bn = jax.lax.dynamic_update_slice(logps_bn, logp_b[:, None].astype(logps_bn.dtype), (0, step))
        lengths_b = lengths_b + active_b.astype(jnp.int32)
        hit_stop_b = active_b & jnp.any(token_b[:, None] == stop_ids[None, :], axis=1)
        stopped_b = stopped_b | hit_stop_b
        done_b = done_b | hit_stop_b
        # feed the token back (after the last step this forward is wasted: 1 of n, no branch on the cache)
        logits_bv, cache = decode_step(lm, token_b, position_b, active_b, cache, params.logits_precision)
        return (step + 1, logits_bv, cache, position_b + 1, key, tokens_bn, logps_bn, done_b, stopped_b, lengths_b)

    carry = (jnp.zeros((), jnp.int32), logits_bv, cache, next_position_b, key, tokens_bn, logps_bn, done_b,
             stopped_b, lengths_b)
    carry = jax.lax.while_loop(cond, body, carry)
    return carry[5], carry[6], carry[9], carry[8]


# ---- compiled entry points -----------------------------------------------------------------------
@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def _prefill_jit(graphdef, state, tokens_bt, mask_bt, num_slots, logits_precision):
    lm = nnx.merge(graphdef, state)
    tokens_bt, mask_bt, prompt_lengths_b = left_align(tokens_bt, mask_bt)
    logits_bv, cache, next_position_b = prefill(lm, tokens_bt, mask_bt, num_slots, logits_precision)
    return logits_bv, cache, next_position_b, prompt_lengths_b


def _decode_jit_impl(graphdef, state, logits_bv, cache, next_position_b, key, params, pad_id):
    lm = nnx.merge(graphdef, state)
    return _decode_loop(lm, logits_bv, cache, next_position_b, key, params, pad_id)


@functools.cache
def _decode_jit(donate: bool):
    """The decode loop, compiled; the cache argument is donated where the backend supports it."""
    return jax.jit(_decode_jit_impl, static_argnums=(0, 6, 7), donate_argnums=(3,) if donate else ())


def generate(lm, prompt_tokens_bt, prompt_mask_bt, params: SamplingParams, key: jax.Array,
             pad_id: int = 0) -> SampleOutput:
    """Sample continuations of a batch of prompts with `lm` (a CausalLM).

    prompt_tokens [b, t] int, prompt_mask [b, t] bool (True on real tokens; padding on any side).
    Every row needs at least one prompt token.
    """
    prompt_mask_bt = jnp.asarray(prompt_mask_bt, bool)
    prompt_tokens_bt = jnp.asarray(prompt_tokens_bt, jnp.int32)
    if prompt_tokens_bt.ndim != 2 or prompt_mask_bt.shape != prompt_tokens_bt.shape:
        raise SamplerError(f"prompt tokens {prompt_tokens_bt.shape} and mask {prompt_mask_bt.shape} must be equal [b, t]")
    if not bool(np.all(np.asarray(prompt_mask_bt).any(axis=1))):
        raise SamplerError("every prompt needs at least one token")
    num_slots = prompt_tokens_bt.shape[1] + params.max_new_tokens
    if num_slots > lm.config.max_position_embeddings:
        raise SamplerError(f"prompt + max_new_tokens = {num_slots} exceeds max_position_embeddings "
                           f"{lm.config.max_position_embeddings}")
    graphdef, state = nnx.split(lm)
    logits_bv, cache, next_position_b, prompt_lengths_b = _prefill_jit(
        graphdef, state, prompt_tokens_bt, prompt_mask_bt, num_slots, params.logits_precision)
    decode = _decode_jit(jax.default_backend() != "cpu")
    tokens_bn, logps_bn, lengths_b, stopped_b = decode(
        graphdef, state, logits_bv, cache, next_position_b, key, params, pad_id)
    return SampleOutput(tokens=tokens_bn, logprobs=logps_bn, lengths=lengths_b, stopped=stopped_b,
                        prompt_lengths=prompt_lengths_b)
