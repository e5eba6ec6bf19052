"""recompute_logprobs against a float64 NumPy computation on the unchunked logits."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from policy_jax.logprobs import recompute_logprobs, token_logprobs_from_hidden
from policy_jax.model_config import ModelConfig
from policy_jax.transformer import CausalLM
from policy_helpers import random_model

VOCAB = 97


def _cfg(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, attention_bias=True, compute_dtype="float32")
    return ModelConfig(**{**base, **kw})


def _numpy_reference(hidden_btd, head_dv, tokens_bt, segment_ids_bt, temperature=1.0):
    """float64 log-softmax of the full logits; position t scores token t+1 within its segment."""
    logits = np.asarray(hidden_btd, np.float64) @ np.asarray(head_dv, np.float64) / temperature
    logits -= logits.max(-1, keepdims=True)
    logp_all = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    entropy = -(np.exp(logp_all) * logp_all).sum(-1)
    b, t = tokens_bt.shape
    logp = np.zeros((b, t))
    for i in range(b):
        for j in range(t - 1):
            if segment_ids_bt[i, j] != 0 and segment_ids_bt[i, j + 1] == segment_ids_bt[i, j]:
                logp[i, j] = logp_all[i, j, tokens_bt[i, j + 1]]
    entropy = np.where(segment_ids_bt != 0, entropy, 0.0)
    return logp, entropy


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, size=(3, 13))
    segment_ids = np.ones((3, 13), np.int32)
    segment_ids[1, 9:] = 0                      # right padding
    segment_ids[2, :5], segment_ids[2, 5:] = 1, 2  # two packed documents
    positions = np.broadcast_to(np.arange(13), (3, 13)).copy()
    positions[2, 5:] = np.arange(8)
    return tokens, positions, segment_ids


def _jitted(precision, chunk_size, temperature=1.0):
    return nnx.jit(lambda m, t, p, s: recompute_logprobs(m, t, p, s, precision=precision, chunk_size=chunk_size,
                                                         temperature=temperature))


@pytest.mark.parametrize("chunk_size", [4, 13, 1024])
def test_fp32_logprobs_match_float64_reference(batch, chunk_size):
    tokens, positions, segment_ids = batch
    lm = random_model(CausalLM, _cfg(), seed=1, scale=3.0)
    logp, entropy = _jitted("fp32", chunk_size)(lm, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segment_ids))
    hidden = nnx.jit(lambda m: m.backbone(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segment_ids)))(lm)
    ref_logp, ref_entropy = _numpy_reference(hidden, lm.head_weight(), tokens, segment_ids)
    assert logp.dtype == entropy.dtype == jnp.float32
    assert np.abs(ref_logp).max() > 1.0
    np.testing.assert_allclose(np.asarray(logp), ref_logp, atol=2e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(entropy), ref_entropy, atol=2e-5, rtol=0)
    # the alignment convention, spelled out: last position and segment/padding boundaries are 0
    assert np.all(np.asarray(logp)[:, -1] == 0)
    assert np.asarray(logp)[1, 8] == 0 and np.asarray(logp)[2, 4] == 0


def test_temperature_divides_the_logits(batch):
    tokens, positions, segment_ids = batch
    lm = random_model(CausalLM, _cfg(), seed=1, scale=3.0)
    logp, entropy = _jitted("fp32", 5, temperature=0.7)(lm, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segment_ids))
    hidden = nnx.jit(lambda m: m.backbone(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segment_ids)))(lm)
    ref_logp, ref_entropy = _numpy_reference(hidden, lm.head_weight(), tokens, segment_ids, temperature=0.7)
    np.testing.assert_allclose(np.asarray(logp), ref_logp, atol=3e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(entropy), ref_entropy, atol=3e-5, rtol=0)


def test_bf16_switch_is_less_exact_than_fp32_head_on_a_bf16_model():
    """With bf16 activations and weights, the fp32-accumulated head stays near the exact float64 value of
    the same bf16 operands; the bf16 path (bf16 logits, bf16 log-softmax) is much further away."""
    cfg = _cfg(vocab_size=512, param_dtype="bfloat16", compute_dtype="bfloat16")
    lm = random_model(CausalLM, cfg, seed=2, scale=4.0)
    rng = np.random.default_rng(3)
    hidden = jnp.asarray(rng.standard_normal((2, 64, 32)), jnp.bfloat16)
    targets = jnp.asarray(rng.integers(0, 512, (2, 64)))
    head = lm.head_weight().astype(jnp.bfloat16)
    logits = np.asarray(hidden, np.float64) @ np.asarray(head, np.float64)
    logits -= logits.max(-1, keepdims=True)
    logp_all = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    ref_logp = np.take_along_axis(logp_all, np.asarray(targets)[..., None], -1)[..., 0]
    run = jax.jit(token_logprobs_from_hidden, static_argnames=("precision", "chunk_size"))
    fp32, _ = run(hidden, head, targets, precision="fp32", chunk_size=16)
    bf16, _ = run(hidden, head, targets, precision="bf16", chunk_size=16)
    err32 = np.abs(np.asarray(fp32) - ref_logp).max()
    err16 = np.abs(np.asarray(bf16) - ref_logp).max()
    assert err32 < 1e-3
    assert err16 > 10 * err32


def test_chunked_gradient_equals_unchunked(batch):
    tokens, positions, segment_ids = batch
    lm = random_model(CausalLM, _cfg(), seed=4)
    args = (jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segment_ids))

    def loss(m, chunk):
        logp, entropy = recompute_logprobs(m, *args, chunk_size=chunk)
        return jnp.sum(logp) + 0.1 * jnp.sum(entropy)

    g_small = nnx.jit(nnx.grad(lambda m: loss(m, 3)))(lm)
    g_whole = nnx.jit(nnx.grad(lambda m: loss(m, 13)))(lm)
    for a, b in zip(jax.tree.leaves(g_small), jax.tree.leaves(g_whole)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=1e-4)


def test_head_memory_is_bounded_by_the_chunk():
    """Compiled temporary memory with chunks of 64 stays far below the full [b, t, v] float32 logits,
    while one chunk covering the whole sequence does need them (so the measurement can tell)."""
    b, t, d, v = 2, 1024, 16, 4096
    hidden = jax.ShapeDtypeStruct((b, t, d), jnp.float32)
    head = jax.ShapeDtypeStruct((d, v), jnp.float32)
    targets = jax.ShapeDtypeStruct((b, t), jnp.int32)
    full_logits = b * t * v * 4

    def temp_bytes(chunk):
        f = jax.jit(lambda h, w, y: token_logprobs_from_hidden(h, w, y, chunk_size=chunk))
        analysis = f.lower(hidden, head, targets).compile().memory_analysis()
        if analysis is None or not hasattr(analysis, "temp_size_in_bytes"):
            pytest.skip("memory_analysis is not available on this backend")
        return analysis.temp_size_in_bytes

    assert temp_bytes(t) >= full_logits
    assert temp_bytes(64) < full_logits / 4  # a few chunk-sized buffers (1/16 of the logits each)


def test_bad_arguments_raise_clear_errors():
    h = jnp.zeros((1, 4, 8))
    w = jnp.zeros((8, 10))
    y = jnp.zeros((1, 4), jnp.int32)
    with pytest.raises(ValueError, match="precision"):
        token_logprobs_from_hidden(h, w, y, precision="fp16")
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs_from_hidden(h, w, y, chunk_size=0)


def test_fp32_head_is_float32_on_a_model_with_bf16_compute(batch):
    """Training's usual setting: float32 master weights, bf16 compute. The FP32 path must score
    with the float32 head weights (the bf16-rounded head left up to 0.05 nats of error)."""
    tokens, positions, segment_ids = batch
    lm = random_model(CausalLM, _cfg(vocab_size=VOCAB, compute_dtype="bfloat16"), seed=4, scale=4.0)
    assert lm.head_weight().dtype == jnp.float32
    logp, _ = _jitted("fp32", 5)(lm, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segment_ids))
    hidden = nnx.jit(lambda m: m.backbone(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segment_ids)))(lm)
    ref_logp, _ = _numpy_reference(hidden, lm.head_weight(), tokens, segment_ids)  # float64 of the same operands
    rounded_logp, _ = _numpy_reference(hidden, lm.head_weight().astype(jnp.bfloat16), tokens, segment_ids)
    assert np.abs(rounded_logp - ref_logp).max() > 1e-3  # the bug this guards against would show
    np.testing.assert_allclose(np.asarray(logp), ref_logp, atol=5e-5, rtol=0)
    logits = nnx.jit(lambda m, h: m.head(h, accumulate_dtype=jnp.float32))(lm, hidden)
    exact = np.asarray(hidden, np.float64) @ np.asarray(lm.head_weight(), np.float64)
    assert logits.dtype == jnp.float32 and np.abs(np.asarray(logits) - exact).max() < 1e-4


def test_the_trainer_scores_at_the_samplers_temperature(tmp_path):
    """One `sampling` section feeds the sampler and the trainer's recomputed log-probs (PPO);
    RFT clones the sampled actions under the plain policy."""
    from policy_jax.run_config import RunConfigError, load_run_config
    from policy_jax.stages import actor_objective

    path = tmp_path / "run.yaml"
    path.write_text(open("configs/tiny.yaml").read() + "\nsampling:\n  temperature: 0.7\n  top_p: 0.9\n")
    cfg = load_run_config(path)
    assert actor_objective(cfg, "ppo", cfg.train.global_batch_size).temperature == 0.7
    assert actor_objective(cfg, "rft", cfg.train.global_batch_size).temperature == 1.0
    path.write_text(open("configs/tiny.yaml").read() + "\nsampling:\n  temperature: -1\n")
    with pytest.raises(RunConfigError, match="sampling.temperature must be >= 0"):
        load_run_config(path)


def _head_products(precision: str, hidden_dtype) -> list[tuple[str, str, str, str]]:
    """(precision, left operand, right operand, result) element types of every matrix product in the
    lowered program of the head's log-probs and their gradient."""
    hidden = jax.ShapeDtypeStruct((2, 8, 16), hidden_dtype)
    head = jax.ShapeDtypeStruct((16, 64), jnp.float32)
    targets = jax.ShapeDtypeStruct((2, 8), jnp.int32)

    def loss(h, w, y):
        logp, _ = token_logprobs_from_hidden(h, w, y, precision=precision, chunk_size=4)
        return jnp.sum(logp)

    text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(hidden, head, targets).as_text()
    lines = [x for x in text.splitlines() if "dot_general" in x]
    return [(re.search(r"precision = \[(\w+)", x).group(1), *re.findall(r"tensor<[^>]*x(\w+)>", x)) for x in lines]


def test_fp32_head_never_multiplies_float32_at_the_default_precision():
    """The CPU computes float32 products exactly whatever is asked, so the float64 tests above cannot see
    this: at the default precision a TPU multiplies float32 matrices in one bf16 pass and an NVIDIA GPU
    in TF32. With bf16 hidden states every product of the fp32 head, forward and backward, is bf16 by
    bf16 into float32 (exact); with float32 hidden states every product asks for the highest precision."""
    split = _head_products("fp32", jnp.bfloat16)
    assert len(split) == 6, split  # the head's three parts in one product; three and two terms in the gradients
    assert all(p[1:] == ("bf16", "bf16", "f32") for p in split), split
    full = _head_products("fp32", jnp.float32)
    assert len(full) >= 3 and all(p[0] == "HIGHEST" and p[1:3] == ("f32", "f32") for p in full), full
    assert all(p[0] == "DEFAULT" and p[3] == "bf16" for p in _head_products("bf16", jnp.bfloat16))
