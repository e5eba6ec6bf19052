"""One iteration's JSON record: the statistics of `ablations.statistics` over the iteration's arrays."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ablations import statistics as st


def mismatch_stats(train_logp: np.ndarray, rollout_logp: np.ndarray, low: float, high: float) -> dict[str, Any]:
    """The trainer (FP32 head) against the sampler, before any update: ratio = p_train / p_rollout,
    bucketed by p_train; KL(rollout || train); the engines' probability correlation."""
    ratio = np.exp(np.clip(train_logp - rollout_logp, -20.0, 20.0))
    return {"ratio": st.ratio_summary(ratio), "buckets": st.ratio_by_bucket(ratio, np.exp(train_logp)),
            "outside": st.outside_fraction(ratio, low, high), "kl": st.kl_estimators(rollout_logp, train_logp),
            "prob_correlation": st.probability_correlation(rollout_logp, train_logp)}


def update_stats(logp: np.ndarray, old_logp: np.ndarray, advantage: np.ndarray, low: float,
                 high: float) -> dict[str, Any]:
    """PPO's ratio pi_theta / pi_old as each mini-batch met it (every mini-batch of every epoch),
    bucketed by pi_old; the shares where the clip binds low and high."""
    ratio = np.exp(np.clip(logp - old_logp, -20.0, 20.0))
    return {"ratio": st.ratio_summary(ratio), "buckets": st.ratio_by_bucket(ratio, np.exp(old_logp)),
            "outside": st.outside_fraction(ratio, low, high), "clip": st.clip_fractions(ratio, advantage, low, high)}


PPO_KEYS = {"entropy": "actor/entropy", "grad_norm": "actor/grad_norm", "actor_loss": "actor/loss",
            "value_loss": "critic/value_loss", "critic_grad_norm": "critic/grad_norm",
            "explained_variance": "critic/explained_variance", "tis_clipped_frac": "rollout/tis_clipped_frac",
            "update_kl_k3": "actor/kl_k3", "updates": "actor/updates"}


def from_ppo_record(ppo_record: dict[str, Any]) -> dict[str, Any]:
    return {name: ppo_record.get(key) for name, key in PPO_KEYS.items()}


def json_ready(value: Any) -> Any:
    """NaN and infinities become null (plain JSON); numpy scalars become floats."""
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value
