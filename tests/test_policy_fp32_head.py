"""The float32 head in bf16 passes (policy_jax/fp32_head.py) against float64 NumPy: three bf16 parts sum
to the float32 weights bit for bit, the logits are the float32 product of bf16 hidden states and float32
weights, and both gradients carry the precision they claim."""

import jax
import jax.numpy as jnp
import numpy as np

from policy_jax.fp32_head import bf16_parts, exact_head_logits, float32_logits


def _operands(b=2, c=16, d=64, v=300, seed=0):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.standard_normal((b, c, d)), jnp.bfloat16)
    head = jnp.asarray(rng.standard_normal((d, v)) * 0.05, jnp.float32)
    return hidden, head


def test_three_bf16_parts_sum_to_the_float32_weights_exactly():
    x = jnp.asarray(np.random.default_rng(1).standard_normal(100_000) * np.logspace(-6, 3, 100_000), jnp.float32)
    parts = bf16_parts(x, 3)
    assert all(p.dtype == jnp.bfloat16 for p in parts)
    total = np.float64(0) + sum(np.asarray(p, np.float64) for p in parts)
    assert np.array_equal(total.astype(np.float32), np.asarray(x))
    two = sum(np.asarray(p, np.float64) for p in parts[:2])
    assert not np.array_equal(two.astype(np.float32), np.asarray(x))  # the third part is needed


def test_logits_are_the_float32_product_and_one_bf16_pass_is_not():
    hidden, head = _operands()
    exact = np.asarray(hidden, np.float64) @ np.asarray(head, np.float64)
    got = np.asarray(jax.jit(float32_logits)(hidden, head))
    assert got.dtype == np.float32
    err = np.abs(got - exact).max()
    one_pass = np.asarray(hidden, np.float64) @ np.asarray(head.astype(jnp.bfloat16), np.float64)
    assert err < 4e-6 * np.abs(exact).max()  # float32 accumulation of exact products
    assert np.abs(one_pass - exact).max() > 100 * err


def test_gradients_match_float64_to_the_precision_they_claim():
    hidden, head = _operands(seed=2)
    weights = jnp.asarray(np.random.default_rng(3).standard_normal((2, 16, 300)), jnp.float32)
    d_hidden, d_head = jax.jit(jax.grad(lambda h, w: jnp.sum(exact_head_logits(h, w) * weights), argnums=(0, 1)))(
        hidden, head)
    g = np.asarray(weights, np.float64)
    want_head = np.einsum("bcd,bcv->dv", np.asarray(hidden, np.float64), g)
    want_hidden = g @ np.asarray(head, np.float64).T
    assert d_head.dtype == jnp.float32 and d_hidden.dtype == jnp.bfloat16
    # the head's gradient: the cotangent in two bf16 parts, 16 significant bits
    assert np.abs(np.asarray(d_head) - want_head).max() < 2.0 ** -14 * np.abs(want_head).max()
    # the hidden states' gradient is bf16: one rounding of it, plus 16-bit terms of its sum
    err = np.abs(np.asarray(d_hidden, np.float64) - want_hidden)
    bound = 2.0 ** -8 * np.abs(want_hidden) + 2.0 ** -14 * (np.abs(g) @ np.abs(np.asarray(head, np.float64)).T)
    assert np.all(err <= bound)
    rounded = lambda x: np.asarray(jnp.asarray(x, jnp.float32).astype(jnp.bfloat16), np.float64)  # noqa: E731
    one_pass = np.abs(rounded(rounded(g) @ rounded(head).T) - want_hidden)
    assert not np.all(one_pass <= bound)  # one bf16 pass of the cotangent and weights would not pass


def test_float32_hidden_states_take_the_highest_precision_product():
    hidden, head = _operands(seed=4)
    hidden = hidden.astype(jnp.float32) + 1e-3  # no longer bf16 values
    exact = np.asarray(hidden, np.float64) @ np.asarray(head, np.float64)
    assert np.abs(np.asarray(float32_logits(hidden, head)) - exact).max() < 4e-6 * np.abs(exact).max()
