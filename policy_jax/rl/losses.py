"""The training losses: RFT negative log-likelihood, value loss, PPO actor loss, truncated IS weights.

Per-token inputs are [B, T] and prediction-aligned (see `batch.py`); masks are 1 on agent
tokens and 0 on environment tokens and padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from policy_jax.rl.masked import aggregate_token_loss

#: Paper (docs/paper.md §7): asymmetric "clip-higher" PPO clipping.
DEFAULT_CLIP_LOW = 0.2
DEFAULT_CLIP_HIGH = 0.28
#: Dual-clip constant for negative advantages (verl's default clip_ratio_c).
DEFAULT_DUAL_CLIP = 3.0
#: Log-ratios are clamped to this magnitude before exp (verl, Tunix).
LOG_RATIO_CLAMP = 20.0
#: Truncated importance sampling cap C (Yao et al. 2025; docs/paper.md §8).
DEFAULT_TIS_CAP = 2.0


def rft_nll_loss(
    logp_bt: jnp.ndarray, mask_bt: jnp.ndarray, mode: str = "token-mean", normalizer: jnp.ndarray | None = None
) -> jnp.ndarray:
    """Behaviour-cloning loss of Rejection Fine-Tuning: -mean log p over agent tokens. [B, T] -> scalar."""
    return aggregate_token_loss(-logp_bt, mask_bt, mode, normalizer)


def value_loss(
    values_bt: jnp.ndarray,
    returns_bt: jnp.ndarray,
    mask_bt: jnp.ndarray,
    old_values_bt: jnp.ndarray | None = None,
    clip_range: float | None = None,
    mode: str = "token-mean",
    normalizer: jnp.ndarray | None = None,
) -> jnp.ndarray:
    """0.5 * mean over agent tokens of (V - V_target)^2, optionally clipped. [B, T] -> scalar.

    With `clip_range` (and `old_values_bt`), the prediction is also clipped to
    old_values ± clip_range and the larger of the two squared errors is taken (PPO's value clipping).
    """
    error_bt = jnp.square(values_bt - returns_bt)
    if clip_range is not None:
        if old_values_bt is None:
            raise ValueError("value clipping needs old_values_bt")
        clipped_bt = old_values_bt + jnp.clip(values_bt - old_values_bt, -clip_range, clip_range)
        error_bt = jnp.maximum(error_bt, jnp.square(clipped_bt - returns_bt))
    return 0.5 * aggregate_token_loss(error_bt, mask_bt, mode, normalizer)


def truncated_is_weights(
    logp_old_bt: jnp.ndarray, logp_rollout_bt: jnp.ndarray, cap: float = DEFAULT_TIS_CAP
) -> jnp.ndarray:
    """Truncated importance weights min(pi_old_trainer / pi_rollout, C), without gradient. [B, T] -> [B, T]."""
    log_ratio_bt = jnp.clip(logp_old_bt - logp_rollout_bt, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return jax.lax.stop_gradient(jnp.minimum(jnp.exp(log_ratio_bt), cap))


@dataclass(frozen=True)
class PPOClip:
    """Clipping of the PPO actor loss. Defaults are the paper's (docs/paper.md §7)."""

    low: float = DEFAULT_CLIP_LOW
    high: float = DEFAULT_CLIP_HIGH
    dual_clip: float | None = DEFAULT_DUAL_CLIP


def ppo_actor_loss(
    logp_bt: jnp.ndarray,
    logp_old_bt: jnp.ndarray,
    advantages_bt: jnp.ndarray,
    mask_bt: jnp.ndarray,
    clip: PPOClip = PPOClip(),
    token_weights_bt: jnp.ndarray | None = None,
    mode: str = "token-mean",
    normalizer: jnp.ndarray | None = None,
) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
    """Clipped surrogate loss with asymmetric clipping and optional dual-clip. [B, T] -> (scalar, stats).

    rho = exp(clamp(logp - logp_old, ±20)); per token
        loss = max(-A * rho, -A * clip(rho, 1 - low, 1 + high))
    and, with dual-clip c, for A < 0 the loss is further capped at -A * c. `token_weights_bt`
    (e.g. truncated IS weights) multiply the per-token loss. Stats are masked means over the
    agent tokens: `clip_frac_low` (A < 0 and rho < 1 - low: the low clip binds),
    `clip_frac_high` (A > 0 and rho > 1 + high), `dual_clip_frac` (A < 0 and the dual clip binds).
    """
    log_ratio_bt = jnp.clip(logp_bt - logp_old_bt, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio_bt = jnp.exp(log_ratio_bt)
    unclipped_bt = -advantages_bt * ratio_bt
    clipped_bt = -advantages_bt * jnp.clip(ratio_bt, 1.0 - clip.low, 1.0 + clip.high)
    loss_bt = jnp.maximum(unclipped_bt, clipped_bt)
    negative_bt = advantages_bt < 0
    if clip.dual_clip is not None:
        dual_bt = -advantages_bt * clip.dual_clip
        dual_binds_bt = negative_bt & (loss_bt > dual_bt)
        loss_bt = jnp.where(negative_bt, jnp.minimum(loss_bt, dual_bt), loss_bt)
    else:
        dual_binds_bt = jnp.zeros_like(negative_bt)
    if token_weights_bt is not None:
        loss_bt = loss_bt * token_weights_bt
    loss = aggregate_token_loss(loss_bt, mask_bt, mode, normalizer)

    count = jnp.maximum(jnp.sum(mask_bt), 1.0)

    def frac(flag_bt):
        return jax.lax.stop_gradient(jnp.sum(flag_bt.astype(jnp.float32) * mask_bt) / count)

    stats = {
        "clip_frac_low": frac(negative_bt & (ratio_bt < 1.0 - clip.low)),
        "clip_frac_high": frac((advantages_bt > 0) & (ratio_bt > 1.0 + clip.high)),
        "dual_clip_frac": frac(dual_binds_bt),
    }
    return loss, stats
