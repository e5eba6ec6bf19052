"""RL math against plain NumPy loops written independently here (3x5 and similar arrays)."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from policy_jax.rl import advantages, losses, masked, metrics
from policy_jax.rl.batch import pad_trajectories, shift_to_predictions

RNG = np.random.default_rng(0)
MASK = np.array(
    [
        [1, 1, 0, 0, 1],  # agent, agent, tool output x2, agent
        [0, 1, 1, 1, 0],  # prompt, agent x3, padding
        [1, 0, 1, 0, 0],
    ],
    np.float32,
)


def loop_gae(r, v, m, gamma, lam):
    """Textbook backward recursion, written per element; env tokens are skipped by hand."""
    b, t = r.shape
    adv = np.zeros((b, t))
    for i in range(b):
        agent = [j for j in range(t) if m[i, j] == 1]
        for k, j in enumerate(agent):
            total = 0.0
            for l, jj in enumerate(agent[k:]):
                nxt = v[i, agent[k + l + 1]] if k + l + 1 < len(agent) else 0.0
                delta = r[i, jj] + gamma * nxt - v[i, jj]
                total += (gamma * lam) ** l * delta
            adv[i, j] = total
    return adv, (adv + v) * m


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.8), (1.0, 1.0)])
def test_gae_skips_environment_tokens_like_a_hand_loop(gamma, lam):
    r = RNG.normal(size=MASK.shape).astype(np.float32)
    v = RNG.normal(size=MASK.shape).astype(np.float32)
    a, ret = advantages.gae_advantages(jnp.asarray(r), jnp.asarray(v), jnp.asarray(MASK), gamma, lam)
    a_ref, ret_ref = loop_gae(r, v, MASK, gamma, lam)
    np.testing.assert_allclose(np.asarray(a), a_ref, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ret), ret_ref, atol=1e-5)


def test_gae_outcome_reward_gamma1_lambda1_is_reward_minus_value():
    # gamma = lambda = 1 and one terminal reward: A_t = R - V_t on every agent token.
    m = jnp.asarray(MASK)
    reward = jnp.array([1.0, -1.0, 3.0])
    r = advantages.outcome_rewards(reward, m)
    v = jnp.asarray(RNG.normal(size=MASK.shape).astype(np.float32))
    a, ret = advantages.gae_advantages(r, v, m, 1.0, 1.0)
    expected = (np.asarray(reward)[:, None] - np.asarray(v)) * MASK
    np.testing.assert_allclose(np.asarray(a), expected, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ret), np.asarray(reward)[:, None] * MASK, atol=1e-5)


def test_outcome_reward_sits_on_last_agent_token():
    r = np.asarray(advantages.outcome_rewards(jnp.array([2.0, 5.0, -1.0]), jnp.asarray(MASK)))
    expected = np.zeros_like(MASK)
    expected[0, 4], expected[1, 3], expected[2, 2] = 2.0, 5.0, -1.0
    np.testing.assert_array_equal(r, expected)
    empty = np.asarray(advantages.outcome_rewards(jnp.array([1.0]), jnp.zeros((1, 4))))
    assert not empty.any()


def test_whiten_over_masked_tokens():
    a = RNG.normal(size=MASK.shape).astype(np.float32) * 3 + 1
    w = np.asarray(advantages.whiten_advantages(jnp.asarray(a), jnp.asarray(MASK)))
    vals = a[MASK == 1]
    np.testing.assert_allclose(w[MASK == 1], (vals - vals.mean()) / vals.std(), atol=1e-4)
    assert not w[MASK == 0].any()


def test_rft_nll_is_token_mean_of_agent_negative_logprobs():
    logp = -RNG.random(MASK.shape).astype(np.float32)
    got = float(losses.rft_nll_loss(jnp.asarray(logp), jnp.asarray(MASK)))
    total, n = 0.0, 0
    for i in range(3):
        for j in range(5):
            if MASK[i, j]:
                total -= logp[i, j]
                n += 1
    assert got == pytest.approx(total / n, rel=1e-6)


def test_aggregation_modes_by_hand():
    x = RNG.random(MASK.shape).astype(np.float32)
    seq_sums = [sum(x[i, j] for j in range(5) if MASK[i, j]) for i in range(3)]
    seq_means = [seq_sums[i] / MASK[i].sum() for i in range(3)]
    agg = lambda mode: float(masked.aggregate_token_loss(jnp.asarray(x), jnp.asarray(MASK), mode))
    assert agg("token-mean") == pytest.approx(sum(seq_sums) / MASK.sum(), rel=1e-6)
    assert agg("seq-mean-token-sum") == pytest.approx(sum(seq_sums) / 3, rel=1e-6)
    assert agg("seq-mean-token-mean") == pytest.approx(sum(seq_means) / 3, rel=1e-6)
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        masked.aggregate_token_loss(jnp.asarray(x), jnp.asarray(MASK), "sum-of-everything")


def test_aggregation_with_a_global_normalizer_adds_up_over_micro_batches():
    x = jnp.asarray(RNG.random(MASK.shape).astype(np.float32))
    m = jnp.asarray(MASK)
    for mode in masked.LOSS_AGGREGATIONS:
        whole = masked.aggregate_token_loss(x, m, mode)
        norm = masked.aggregation_normalizer(m, mode)
        parts = masked.aggregate_token_loss(x[:1], m[:1], mode, norm) + masked.aggregate_token_loss(x[1:], m[1:], mode, norm)
        assert float(parts) == pytest.approx(float(whole), rel=1e-6)


def loop_value_loss(v, ret, m, old=None, clip=None):
    total, n = 0.0, 0
    for i in range(v.shape[0]):
        for j in range(v.shape[1]):
            if not m[i, j]:
                continue
            e = (v[i, j] - ret[i, j]) ** 2
            if clip is not None:
                vc = min(max(v[i, j], old[i, j] - clip), old[i, j] + clip)
                e = max(e, (vc - ret[i, j]) ** 2)
            total += e
            n += 1
    return 0.5 * total / n


def test_value_loss_plain_and_clipped():
    v, ret, old = (RNG.normal(size=MASK.shape).astype(np.float32) for _ in range(3))
    j = jnp.asarray
    assert float(losses.value_loss(j(v), j(ret), j(MASK))) == pytest.approx(loop_value_loss(v, ret, MASK), rel=1e-5)
    got = float(losses.value_loss(j(v), j(ret), j(MASK), old_values_bt=j(old), clip_range=0.2))
    assert got == pytest.approx(loop_value_loss(v, ret, MASK, old, 0.2), rel=1e-5)
    with pytest.raises(ValueError, match="old_values"):
        losses.value_loss(j(v), j(ret), j(MASK), clip_range=0.2)


def loop_ppo(logp, old, adv, m, low, high, dual, weights=None):
    total, n = 0.0, 0
    lo = hi = du = 0
    for i in range(logp.shape[0]):
        for j in range(logp.shape[1]):
            if not m[i, j]:
                continue
            rho = math.exp(max(min(logp[i, j] - old[i, j], 20.0), -20.0))
            a = adv[i, j]
            l = max(-a * rho, -a * min(max(rho, 1 - low), 1 + high))
            if dual is not None and a < 0:
                if l > -a * dual:
                    du += 1
                l = min(l, -a * dual)
            if weights is not None:
                l *= weights[i, j]
            total += l
            n += 1
            lo += a < 0 and rho < 1 - low
            hi += a > 0 and rho > 1 + high
    return total / n, lo / n, hi / n, du / n


@pytest.mark.parametrize("dual", [None, 3.0])
def test_ppo_loss_asymmetric_clip_and_dual_clip(dual):
    # Ratios spread from e^-1.5 to e^1.5 so every clip (low, high, dual at 3) binds somewhere.
    logp = -RNG.random(MASK.shape).astype(np.float32) * 2
    old = logp - RNG.uniform(-1.5, 1.5, size=MASK.shape).astype(np.float32)
    adv = RNG.normal(size=MASK.shape).astype(np.float32)
    weights = RNG.uniform(0.5, 2.0, size=MASK.shape).astype(np.float32)
    clip = losses.PPOClip(low=0.2, high=0.28, dual_clip=dual)
    j = jnp.asarray
    loss, stats = losses.ppo_actor_loss(j(logp), j(old), j(adv), j(MASK), clip, token_weights_bt=j(weights))
    ref, lo, hi, du = loop_ppo(logp, old, adv, MASK, 0.2, 0.28, dual, weights)
    assert float(loss) == pytest.approx(ref, rel=1e-5)
    assert float(stats["clip_frac_low"]) == pytest.approx(lo)
    assert float(stats["clip_frac_high"]) == pytest.approx(hi)
    assert float(stats["dual_clip_frac"]) == pytest.approx(du)


def test_ppo_loss_planted_cases_by_hand():
    # One token each; old logp 0. rho = e^x.
    x = np.log(np.array([[1.5, 1.5, 0.5, 0.5, 5.0]], np.float32))
    adv = np.array([[1.0, -1.0, 1.0, -1.0, -1.0]], np.float32)
    m = np.ones_like(adv)
    j = jnp.asarray
    _, stats = losses.ppo_actor_loss(j(x), j(np.zeros_like(x)), j(adv), j(m), losses.PPOClip(0.2, 0.28, 3.0))
    # per token: A>0,rho 1.5 -> -1.28 (high clip); A<0,rho 1.5 -> 1.5; A>0,rho .5 -> -.5; A<0,rho .5 -> .8 (low clip);
    # A<0, rho 5 -> min(5, 3) = 3 (dual clip).
    loss, _ = losses.ppo_actor_loss(j(x), j(np.zeros_like(x)), j(adv), j(m), losses.PPOClip(0.2, 0.28, 3.0))
    assert float(loss) == pytest.approx((-1.28 + 1.5 - 0.5 + 0.8 + 3.0) / 5, rel=1e-5)
    assert float(stats["clip_frac_high"]) == pytest.approx(1 / 5)
    assert float(stats["clip_frac_low"]) == pytest.approx(1 / 5)
    assert float(stats["dual_clip_frac"]) == pytest.approx(1 / 5)


def test_ppo_log_ratio_clamp_keeps_loss_finite():
    logp = jnp.array([[0.0]])
    old = jnp.array([[-1000.0]])
    loss, _ = losses.ppo_actor_loss(logp, old, jnp.array([[-1.0]]), jnp.ones((1, 1)), losses.PPOClip(dual_clip=None))
    assert float(loss) == pytest.approx(math.exp(20.0), rel=1e-4)


def test_truncated_is_weights():
    old = np.log(np.array([[0.5, 0.9, 0.01]], np.float32))
    rollout = np.log(np.array([[0.1, 0.9, 0.02]], np.float32))
    w = np.asarray(losses.truncated_is_weights(jnp.asarray(old), jnp.asarray(rollout), cap=2.0))
    np.testing.assert_allclose(w, [[2.0, 1.0, 0.5]], rtol=1e-5)


def test_approx_kl_k1_k3():
    logp = np.log(RNG.uniform(0.05, 1, size=MASK.shape))
    old = np.log(RNG.uniform(0.05, 1, size=MASK.shape))
    out = metrics.approx_kl(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(MASK))
    sel = MASK == 1
    r = np.exp(logp - old)[sel]
    assert float(out["kl_k1"]) == pytest.approx(np.mean((old - logp)[sel]), rel=1e-5)
    assert float(out["kl_k3"]) == pytest.approx(np.mean(r - 1 - np.log(r)), rel=1e-5)


def test_entropy_and_explained_variance():
    ent = RNG.random(MASK.shape).astype(np.float32)
    assert float(metrics.masked_entropy(jnp.asarray(ent), jnp.asarray(MASK))) == pytest.approx(ent[MASK == 1].mean(), rel=1e-6)
    ret = RNG.normal(size=MASK.shape).astype(np.float32)
    val = ret + 0.3 * RNG.normal(size=MASK.shape).astype(np.float32)
    sel = MASK == 1
    ev = 1 - np.var(ret[sel] - val[sel]) / np.var(ret[sel])
    assert float(metrics.explained_variance(jnp.asarray(val), jnp.asarray(ret), jnp.asarray(MASK))) == pytest.approx(ev, rel=1e-5)
    # Perfect critic: 1; constant returns: undefined (nan), not a division error.
    assert float(metrics.explained_variance(jnp.asarray(ret), jnp.asarray(ret), jnp.asarray(MASK))) == pytest.approx(1.0)
    assert math.isnan(float(metrics.explained_variance(jnp.zeros((1, 3)), jnp.ones((1, 3)), jnp.ones((1, 3)))))


def test_pearson_matches_numpy():
    x = RNG.random(MASK.shape)
    y = x + 0.2 * RNG.random(MASK.shape)
    sel = MASK == 1
    got = float(metrics.pearson_correlation(jnp.asarray(x), jnp.asarray(y), jnp.asarray(MASK)))
    assert got == pytest.approx(np.corrcoef(x[sel], y[sel])[0, 1], rel=1e-5)


def test_ratio_stats_by_probability_buckets():
    prob = np.array([[0.0005, 0.005, 0.05, 0.3, 0.7, 1.0], [0.0009, 0.2, 0.95, 0.6, 0.001, 0.5]], np.float32)
    ratio = np.array([[1.5, 0.9, 1.0, 0.7, 1.1, 1.0], [1.0, 1.3, 0.99, 1.2, 0.5, 3.0]], np.float32)
    mask = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]], np.float32)
    out = {k: np.asarray(v) for k, v in metrics.ratio_stats_by_probability(
        jnp.asarray(ratio), jnp.asarray(prob), jnp.asarray(mask), 0.2, 0.28).items()}
    edges = metrics.PROBABILITY_BUCKET_EDGES
    for k in range(len(edges) - 1):
        members = [
            ratio[i, j]
            for i in range(2)
            for j in range(6)
            if mask[i, j] and edges[k] <= prob[i, j] and (prob[i, j] < edges[k + 1] or (k == len(edges) - 2 and prob[i, j] <= 1))
        ]
        assert out["count"][k] == len(members)
        if members:
            assert out["mean"][k] == pytest.approx(np.mean(members), rel=1e-6)
            assert out["max_abs_dev"][k] == pytest.approx(max(abs(r - 1) for r in members), rel=1e-6)
            assert out["clipped_frac"][k] == pytest.approx(np.mean([r < 0.8 or r > 1.28 for r in members]))
        else:
            assert out["mean"][k] == 0 and out["clipped_frac"][k] == 0
    assert out["count"].sum() == mask.sum()


def test_rollout_mismatch_metrics():
    p_roll = RNG.uniform(0.01, 1, size=MASK.shape)
    p_train = np.clip(p_roll * RNG.uniform(0.3, 3.0, size=MASK.shape), 1e-6, 1)
    out = metrics.rollout_mismatch_metrics(
        jnp.asarray(np.log(p_train), jnp.float32), jnp.asarray(np.log(p_roll), jnp.float32), jnp.asarray(MASK), 2.0)
    sel = MASK == 1
    rho = p_train[sel] / p_roll[sel]
    assert float(out["chi2"]) == pytest.approx(np.mean(rho**2) - 1, rel=1e-4)
    assert float(out["prob_pearson"]) == pytest.approx(np.corrcoef(p_train[sel], p_roll[sel])[0, 1], rel=1e-4)
    assert float(out["prob_abs_diff_max"]) == pytest.approx(np.max(np.abs(p_train - p_roll)[sel]), rel=1e-4)
    assert float(out["prob_abs_diff_mean"]) == pytest.approx(np.mean(np.abs(p_train - p_roll)[sel]), rel=1e-4)
    assert float(out["tis_clipped_frac"]) == pytest.approx(np.mean(rho > 2.0))


def test_batch_alignment_and_padding():
    batch = pad_trajectories([[5, 6, 7], [8, 9]], [[0, 1, 1], [0, 1]], [[0.0, -0.5, -0.25], [0.0, -1.0]], [1.0, 0.0], seq_len=4)
    np.testing.assert_array_equal(batch.tokens_bt, [[5, 6, 7, 0], [8, 9, 0, 0]])
    np.testing.assert_array_equal(batch.segment_ids_bt, [[1, 1, 1, 0], [1, 1, 0, 0]])
    np.testing.assert_array_equal(batch.positions_bt, [[0, 1, 2, 0], [0, 1, 0, 0]])
    # Position t predicts token t+1: the agent tokens 6, 7 are predicted at positions 0, 1.
    np.testing.assert_array_equal(np.asarray(batch.action_mask_bt), [[1, 1, 0, 0], [1, 0, 0, 0]])
    np.testing.assert_allclose(np.asarray(batch.rollout_action_logprobs_bt), [[-0.5, -0.25, 0, 0], [-1.0, 0, 0, 0]])
    np.testing.assert_array_equal(np.asarray(shift_to_predictions(jnp.array([[1, 2, 3]]))), [[2, 3, 0]])
    with pytest.raises(ValueError, match="different lengths"):
        pad_trajectories([[1, 2]], [[1]], None, [0.0], seq_len=4)


def test_a_trajectory_longer_than_the_window_is_masked_out_and_counted():
    """Its reward belongs to tokens outside the window: none of its tokens is trained on."""
    batch = pad_trajectories([[5, 6, 7, 8, 9, 10], [8, 9]], [[0, 1, 1, 0, 1, 1], [0, 1]], None, [1.0, 1.0], seq_len=4)
    np.testing.assert_array_equal(batch.tokens_bt[0], [5, 6, 7, 8])  # cut to the window ...
    np.testing.assert_array_equal(np.asarray(batch.action_mask_bt), [[0, 0, 0, 0], [1, 0, 0, 0]])  # ... and out of the loss
    np.testing.assert_array_equal(batch.truncated_b, [1.0, 0.0])
