"""The KV-cache sampler against full (cache-free) forwards of the same model and NumPy filtering."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from policy_jax.model_config import ModelConfig
from policy_jax.sampler import (SamplerError, SamplingParams, decode_step, filter_logits, generate, left_align, prefill,
                                sample_from_logits)
from policy_jax.transformer import CausalLM
from policy_helpers import random_model

VOCAB = 61
PROMPT_LENGTHS = np.array([7, 3, 5])


def _cfg(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, attention_bias=True, compute_dtype="float32",
                tie_word_embeddings=True, max_position_embeddings=64)
    return ModelConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def lm():
    return random_model(CausalLM, _cfg(), seed=0, scale=3.0)


@pytest.fixture(scope="module")
def prompts():
    """Right-padded prompts of unequal length: tokens [3, 7], mask [3, 7]."""
    rng = np.random.default_rng(0)
    mask = np.arange(7)[None, :] < PROMPT_LENGTHS[:, None]
    return np.where(mask, rng.integers(1, VOCAB, (3, 7)), 0), mask


def _full_logits(lm, rows):
    """Cache-free forward of each token list alone (right-padded into one batch). -> list of [len, v]."""
    t = max(map(len, rows))
    tokens = np.zeros((len(rows), t), np.int32)
    segments = np.zeros((len(rows), t), np.int32)
    for i, r in enumerate(rows):
        tokens[i, :len(r)], segments[i, :len(r)] = r, 1
    logits = np.asarray(nnx.jit(lambda m, x, s: m(x, None, s))(lm, jnp.asarray(tokens), jnp.asarray(segments)))
    return [logits[i, :len(r)] for i, r in enumerate(rows)]


def _generated_rows(prompts, out):
    tokens, mask = prompts
    gen = np.asarray(out.tokens)
    lengths = np.asarray(out.lengths)
    return [list(tokens[i][mask[i]]) + list(gen[i, :lengths[i]]) for i in range(len(tokens))]


def _np_filtered_logp(logits, temperature, top_k, top_p):
    x = np.asarray(logits, np.float64) / temperature
    if top_k:
        x = np.where(x >= np.sort(x)[-top_k], x, -np.inf)
    if top_p < 1.0:
        p = np.exp(x - x.max())
        p /= p.sum()
        order = np.argsort(-x)
        before = np.cumsum(p[order]) - p[order]
        keep = np.zeros(x.shape, bool)
        keep[order[before < top_p]] = True
        x = np.where(keep, x, -np.inf)
    return x - (np.log(np.sum(np.exp(x - x.max()))) + x.max())


def test_cached_decode_logits_equal_full_forward(lm, prompts):
    tokens, mask = prompts
    cont = np.random.default_rng(1).integers(1, VOCAB, (3, 4))
    run_prefill = nnx.jit(lambda m, t, k: prefill(m, *left_align(t, k)[:2], num_slots=7 + 4), )
    logits, cache, pos = run_prefill(lm, jnp.asarray(tokens), jnp.asarray(mask))
    step = nnx.jit(lambda m, tok, p, c: decode_step(m, tok, p, jnp.ones_like(tok, bool), c))
    per_step = [np.asarray(logits)]
    for j in range(3):
        logits, cache = step(lm, jnp.asarray(cont[:, j]), pos + j, cache)
        per_step.append(np.asarray(logits))
    full = _full_logits(lm, [list(tokens[i][mask[i]]) + list(cont[i]) for i in range(3)])
    for i, n in enumerate(PROMPT_LENGTHS):
        for j in range(4):
            np.testing.assert_allclose(per_step[j][i], full[i][n - 1 + j], atol=2e-5, rtol=0)


def test_greedy_equals_argmax_of_full_forward_and_padding_side_does_not_matter(lm, prompts):
    tokens, mask = prompts
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    out = generate(lm, tokens, mask, params, jax.random.key(0))
    assert np.all(np.asarray(out.lengths) == 6) and not np.any(np.asarray(out.stopped))
    np.testing.assert_array_equal(np.asarray(out.prompt_lengths), PROMPT_LENGTHS)
    rows = _generated_rows(prompts, out)
    for row, logits, n in zip(rows, _full_logits(lm, rows), PROMPT_LENGTHS):
        for j in range(6):
            assert row[n + j] == int(np.argmax(logits[n - 1 + j]))
    # the same prompts left-padded give the same continuation
    left_mask = mask[:, ::-1]
    left_tokens = np.zeros_like(tokens)
    for i, n in enumerate(PROMPT_LENGTHS):
        left_tokens[i, 7 - n:] = tokens[i, :n]
    out_left = generate(lm, left_tokens, left_mask, params, jax.random.key(5))
    np.testing.assert_array_equal(np.asarray(out_left.tokens), np.asarray(out.tokens))


def test_top_k_one_is_greedy_with_log_prob_zero(lm, prompts):
    tokens, mask = prompts
    greedy = generate(lm, tokens, mask, SamplingParams(max_new_tokens=6, temperature=0.0), jax.random.key(0))
    top1 = generate(lm, tokens, mask, SamplingParams(max_new_tokens=6, temperature=1.3, top_k=1), jax.random.key(7))
    np.testing.assert_array_equal(np.asarray(top1.tokens), np.asarray(greedy.tokens))
    np.testing.assert_allclose(np.asarray(top1.logprobs), 0.0, atol=1e-6)


def test_sampled_logprobs_are_those_of_the_filtered_distribution(lm, prompts):
    tokens, mask = prompts
    params = SamplingParams(max_new_tokens=8, temperature=0.8, top_k=12, top_p=0.85)
    out = generate(lm, tokens, mask, params, jax.random.key(3))
    rows = _generated_rows(prompts, out)
    logps = np.asarray(out.logprobs)
    assert logps.dtype == np.float32  # the model computes in float32 here
    for i, (row, logits, n) in enumerate(zip(rows, _full_logits(lm, rows), PROMPT_LENGTHS)):
        for j in range(8):
            ref = _np_filtered_logp(logits[n - 1 + j], 0.8, 12, 0.85)
            assert np.isfinite(ref[row[n + j]])  # the token came from the kept set
            np.testing.assert_allclose(logps[i, j], ref[row[n + j]], atol=1e-4)


def test_stop_tokens_stop_rows_independently(lm, prompts):
    tokens, mask = prompts
    free = generate(lm, tokens, mask, SamplingParams(max_new_tokens=8, temperature=0.0), jax.random.key(0))
    free_tokens = np.asarray(free.tokens)
    stop = int(free_tokens[0, 2])  # row 0 will stop at step 2 at the latest
    out = generate(lm, tokens, mask, SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=(stop,)),
                   jax.random.key(0), pad_id=-1)
    got, lengths, stopped = np.asarray(out.tokens), np.asarray(out.lengths), np.asarray(out.stopped)
    for i in range(3):
        hits = np.flatnonzero(free_tokens[i] == stop)
        expected_len = hits[0] + 1 if hits.size else 8
        assert lengths[i] == expected_len and stopped[i] == bool(hits.size)
        np.testing.assert_array_equal(got[i, :expected_len], free_tokens[i, :expected_len])
        assert np.all(got[i, expected_len:] == -1)
        assert np.all(np.asarray(out.logprobs)[i, expected_len:] == 0)
    assert lengths[0] <= 3


def test_sampling_frequencies_follow_the_filtered_distribution():
    logits = jnp.asarray([[2.0, 1.5, 1.0, 0.2, -1.0, 0.0, 1.2, -0.5]], jnp.float32)
    params = SamplingParams(temperature=0.7, top_k=5, top_p=0.8)
    n = 20000
    tokens, logps = jax.jit(lambda k: sample_from_logits(k, jnp.repeat(logits, n, 0), params))(jax.random.key(0))
    expected = np.exp(_np_filtered_logp(np.asarray(logits[0]), 0.7, 5, 0.8))
    freq = np.bincount(np.asarray(tokens), minlength=8) / n
    np.testing.assert_allclose(freq, expected, atol=0.015)
    np.testing.assert_allclose(np.asarray(logps), np.log(expected[np.asarray(tokens)]), atol=1e-5)
    # filtered-out tokens have -inf logits
    filtered = np.asarray(filter_logits(logits, 0.7, 5, 0.8))[0]
    assert np.array_equal(np.isfinite(filtered), expected > 0)


def test_bf16_model_samples_with_bf16_logprobs_unless_fp32_head_asked():
    lm = random_model(CausalLM, _cfg(param_dtype="bfloat16", compute_dtype="bfloat16"), seed=1)
    tokens = np.array([[1, 2, 3], [4, 5, 0]])
    mask = np.array([[1, 1, 1], [1, 1, 0]], bool)
    out = generate(lm, tokens, mask, SamplingParams(max_new_tokens=3), jax.random.key(0))
    assert out.logprobs.dtype == jnp.bfloat16
    out32 = generate(lm, tokens, mask, SamplingParams(max_new_tokens=3, logits_precision="fp32"), jax.random.key(0))
    assert out32.logprobs.dtype == jnp.float32
    assert np.all(np.asarray(out32.logprobs) <= 0)


def test_bad_requests_give_clear_errors(lm):
    with pytest.raises(SamplerError, match="at least one token"):
        generate(lm, np.array([[1, 2], [3, 4]]), np.array([[1, 1], [0, 0]], bool), SamplingParams(max_new_tokens=2),
                 jax.random.key(0))
    with pytest.raises(SamplerError, match="max_position_embeddings"):
        generate(lm, np.ones((1, 10), int), np.ones((1, 10), bool), SamplingParams(max_new_tokens=60), jax.random.key(0))
    with pytest.raises(SamplerError, match="must be equal"):
        generate(lm, np.ones((1, 4), int), np.ones((1, 3), bool), SamplingParams(max_new_tokens=2), jax.random.key(0))
    for bad in (dict(top_p=0.0), dict(top_k=-1), dict(temperature=-1.0), dict(max_new_tokens=0),
                dict(logits_precision="fp8")):
        with pytest.raises(SamplerError):
            SamplingParams(**bad)


def test_sharded_model_generates_the_same_tokens(prompts):
    """Parameters spread over 8 devices (data 2 x fsdp 2 x tensor 2) sample exactly what one device does."""
    from policy_jax.sharding import MeshConfig, make_mesh, shard_module

    if jax.device_count() < 8:
        pytest.skip(f"needs 8 devices, this run has {jax.device_count()} (a GPU run of this file)")
    tokens, mask = prompts
    params = SamplingParams(max_new_tokens=5, temperature=0.9, top_k=20)
    single = random_model(CausalLM, _cfg(), seed=0, scale=3.0)
    sharded = shard_module(random_model(CausalLM, _cfg(), seed=0, scale=3.0),
                           make_mesh(MeshConfig(data=2, fsdp=2, tensor=2)))
    assert len(sharded.backbone.layers[0].mlp.up_df.get_value().sharding.device_set) == 8
    a = generate(single, tokens, mask, params, jax.random.key(11))
    b = generate(sharded, tokens, mask, params, jax.random.key(11))
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_allclose(np.asarray(a.logprobs), np.asarray(b.logprobs), atol=1e-4)


def test_bf16_logits_are_sampled_faithfully():
    """bf16 logits, 200k draws: frequencies within 0.004 of the exact probabilities (a bf16 Gumbel draw
    is off by ~0.008 on the top token; the sampler draws in float32)."""
    logits = jnp.asarray([[2.0, 1.5, 1.0, 0.2, -1.0, 0.0, 1.2, -3.5]], jnp.bfloat16)
    n = 200_000
    tokens, logps = jax.jit(lambda k: sample_from_logits(k, jnp.repeat(logits, n, 0), SamplingParams()))(jax.random.key(1))
    assert logps.dtype == jnp.bfloat16
    x = np.asarray(logits[0], np.float64)
    p = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    np.testing.assert_allclose(np.bincount(np.asarray(tokens), minlength=8) / n, p, atol=0.004)
