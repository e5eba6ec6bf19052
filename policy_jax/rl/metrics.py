"""Training diagnostics: KL estimates, entropy, explained variance, and the precision-mismatch
statistics of docs/paper.md §8 (rollout vs trainer probabilities, importance ratios by token probability).

Inputs are [B, T] prediction-aligned arrays with a 0/1 mask; every statistic is over masked-in tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from policy_jax.rl.losses import LOG_RATIO_CLAMP
from policy_jax.rl.masked import masked_mean, masked_variance

#: Token-probability bucket edges for the importance-ratio statistics: [0,1e-3), [1e-3,1e-2),
#: [1e-2,0.1), [0.1,0.5), [0.5,0.9), [0.9,1].
PROBABILITY_BUCKET_EDGES = (0.0, 1e-3, 1e-2, 0.1, 0.5, 0.9, 1.0)


def approx_kl(logp_bt: jnp.ndarray, logp_old_bt: jnp.ndarray, mask_bt: jnp.ndarray) -> dict[str, jnp.ndarray]:
    """Estimates of KL(pi_old || pi) from tokens sampled under pi_old. [B, T] -> {"kl_k1", "kl_k3"}.

    k1 = E[log pi_old - log pi]; k3 = E[(r - 1) - log r] with r = pi / pi_old (non-negative, lower variance).
    """
    log_r_bt = jnp.clip(logp_bt - logp_old_bt, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    k3_bt = jnp.expm1(log_r_bt) - log_r_bt
    return {"kl_k1": masked_mean(-log_r_bt, mask_bt), "kl_k3": masked_mean(k3_bt, mask_bt)}


def masked_entropy(entropy_bt: jnp.ndarray, mask_bt: jnp.ndarray) -> jnp.ndarray:
    """Mean per-token entropy over agent tokens. [B, T] -> scalar."""
    return masked_mean(entropy_bt, mask_bt)


def explained_variance(values_bt: jnp.ndarray, returns_bt: jnp.ndarray, mask_bt: jnp.ndarray) -> jnp.ndarray:
    """1 - Var[returns - values] / Var[returns] over masked-in tokens. [B, T] -> scalar (nan when Var[returns] = 0)."""
    var_returns = masked_variance(returns_bt, mask_bt)
    var_residual = masked_variance(returns_bt - values_bt, mask_bt)
    return jnp.where(var_returns > 0, 1.0 - var_residual / jnp.where(var_returns > 0, var_returns, 1.0), jnp.nan)


def pearson_correlation(x_bt: jnp.ndarray, y_bt: jnp.ndarray, mask_bt: jnp.ndarray) -> jnp.ndarray:
    """Pearson correlation of x and y over masked-in positions. [B, T] -> scalar (nan if either is constant)."""
    dx_bt = x_bt - masked_mean(x_bt, mask_bt)
    dy_bt = y_bt - masked_mean(y_bt, mask_bt)
    cov = masked_mean(dx_bt * dy_bt, mask_bt)
    denom = jnp.sqrt(masked_mean(dx_bt * dx_bt, mask_bt) * masked_mean(dy_bt * dy_bt, mask_bt))
    return jnp.where(denom > 0, cov / jnp.where(denom > 0, denom, 1.0), jnp.nan)


def ratio_stats_by_probability(
    ratio_bt: jnp.ndarray,
    prob_bt: jnp.ndarray,
    mask_bt: jnp.ndarray,
    clip_low: float,
    clip_high: float,
    edges: tuple[float, ...] = PROBABILITY_BUCKET_EDGES,
) -> dict[str, jnp.ndarray]:
    """Importance-ratio statistics per token-probability bucket. [B, T] -> each value [K], K = len(edges) - 1.

    Bucket k holds tokens with edges[k] <= prob < edges[k+1] (the last bucket includes its upper
    edge). Per bucket: `count`, `mean` ratio, `max_abs_dev` = max |ratio - 1|, and `clipped_frac`,
    the share outside [1 - clip_low, 1 + clip_high]. Empty buckets give count 0 and 0 elsewhere.
    """
    k = len(edges) - 1
    lower_k = jnp.asarray(edges[:-1], jnp.float32)
    upper_k = jnp.asarray(edges[1:], jnp.float32)
    is_last_k = jnp.arange(k) == k - 1
    p_bt1 = prob_bt[..., None]
    in_bucket_btk = (p_bt1 >= lower_k) & jnp.where(is_last_k, p_bt1 <= upper_k, p_bt1 < upper_k)
    weight_btk = in_bucket_btk.astype(jnp.float32) * mask_bt[..., None]
    count_k = jnp.sum(weight_btk, axis=(0, 1))
    safe_k = jnp.maximum(count_k, 1.0)
    r_bt1 = ratio_bt[..., None]
    clipped_bt1 = ((r_bt1 < 1.0 - clip_low) | (r_bt1 > 1.0 + clip_high)).astype(jnp.float32)
    return {
        "count": count_k,
        "mean": jnp.sum(weight_btk * r_bt1, axis=(0, 1)) / safe_k,
        "max_abs_dev": jnp.max(jnp.where(weight_btk > 0, jnp.abs(r_bt1 - 1.0), 0.0), axis=(0, 1)),
        "clipped_frac": jnp.sum(weight_btk * clipped_bt1, axis=(0, 1)) / safe_k,
    }


def rollout_mismatch_metrics(
    logp_train_bt: jnp.ndarray, logp_rollout_bt: jnp.ndarray, mask_bt: jnp.ndarray, tis_cap: float
) -> dict[str, jnp.ndarray]:
    """How far the sampler's probabilities are from the trainer's (docs/paper.md §8). [B, T] -> scalars.

    rho = p_train / p_rollout (log-ratio clamped to ±20). Returns `prob_pearson` (correlation of
    p_train and p_rollout), `chi2` = E[rho^2] - 1, `prob_abs_diff_max` / `prob_abs_diff_mean`
    = max / mean |p_train - p_rollout|, `tis_clipped_frac` = share of tokens with rho > C.
    """
    p_train_bt = jnp.exp(logp_train_bt)
    p_rollout_bt = jnp.exp(logp_rollout_bt)
    rho_bt = jnp.exp(jnp.clip(logp_train_bt - logp_rollout_bt, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    abs_diff_bt = jnp.abs(p_train_bt - p_rollout_bt)
    return {
        "prob_pearson": pearson_correlation(p_train_bt, p_rollout_bt, mask_bt),
        "chi2": masked_mean(jnp.square(rho_bt), mask_bt) - 1.0,
        "prob_abs_diff_max": jnp.max(jnp.where(mask_bt > 0, abs_diff_bt, 0.0)),
        "prob_abs_diff_mean": masked_mean(abs_diff_bt, mask_bt),
        "tis_clipped_frac": masked_mean((rho_bt > tis_cap).astype(jnp.float32), mask_bt),
    }


def stop_gradient_tree(tree):
    """Metrics never carry gradient."""
    return jax.tree.map(jax.lax.stop_gradient, tree)
