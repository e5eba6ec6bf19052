"""Per-token statistics of the importance ratio, as small pure NumPy functions.

Inputs are 1-D arrays over the agent tokens of a batch (already masked in): `ratio` is
pi_a / pi_b per token, `prob` the probability used for bucketing, `advantage` the token's
advantage. Every function returns plain floats (JSON-ready); an empty input gives NaN. The KL
estimators and the probability correlation are the trainer's own (policy_jax.rl.metrics) over
every token, so the ablation and a training run report the same numbers.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from policy_jax.rl.metrics import approx_kl, pearson_correlation

#: Token-probability buckets: [0, 1e-4), [1e-4, 1e-2), [1e-2, 0.5), [0.5, 1].
BUCKET_EDGES = (0.0, 1e-4, 1e-2, 0.5, 1.0)
BUCKET_NAMES = ("<1e-4", "1e-4..1e-2", "1e-2..0.5", ">0.5")
QUANTILES = (0.01, 0.1, 0.5, 0.9, 0.99)
NAN = float("nan")


def _flat(x) -> np.ndarray:
    return np.asarray(x, np.float64).reshape(-1)


def ratio_summary(ratio) -> dict[str, float]:
    """count, mean, std (population), min, max and the QUANTILES (linear interpolation) of the ratios."""
    r = _flat(ratio)
    if r.size == 0:
        return {"count": 0.0, "mean": NAN, "std": NAN, "min": NAN, "max": NAN, **{f"q{q:g}": NAN for q in QUANTILES}}
    out = {"count": float(r.size), "mean": float(r.mean()), "std": float(r.std()), "min": float(r.min()),
           "max": float(r.max())}
    out.update({f"q{q:g}": float(v) for q, v in zip(QUANTILES, np.quantile(r, QUANTILES))})
    return out


def bucket_indices(prob, edges: Sequence[float] = BUCKET_EDGES) -> np.ndarray:
    """Bucket k holds edges[k] <= p < edges[k+1]; the last bucket includes its upper edge."""
    p = _flat(prob)
    return np.clip(np.searchsorted(np.asarray(edges[1:-1]), p, side="right"), 0, len(edges) - 2)


def ratio_by_bucket(ratio, prob, edges: Sequence[float] = BUCKET_EDGES,
                    names: Sequence[str] = BUCKET_NAMES) -> dict[str, dict[str, float]]:
    """`ratio_summary` of the tokens of each probability bucket, keyed by bucket name."""
    r, k = _flat(ratio), bucket_indices(prob, edges)
    return {name: ratio_summary(r[k == i]) for i, name in enumerate(names)}


def outside_fraction(ratio, low: float, high: float) -> dict[str, float]:
    """Shares of tokens with ratio < 1 - low ("below") and > 1 + high ("above"), and their sum ("outside")."""
    r = _flat(ratio)
    if r.size == 0:
        return {"below": NAN, "above": NAN, "outside": NAN}
    below, above = float(np.mean(r < 1.0 - low)), float(np.mean(r > 1.0 + high))
    return {"below": below, "above": above, "outside": below + above}


def clip_fractions(ratio, advantage, low: float, high: float) -> dict[str, float]:
    """Shares of tokens where PPO's clip binds: "low" (A < 0 and ratio < 1 - low), "high" (A > 0 and
    ratio > 1 + high)."""
    r, a = _flat(ratio), _flat(advantage)
    if r.size == 0:
        return {"low": NAN, "high": NAN}
    return {"low": float(np.mean((a < 0) & (r < 1.0 - low))), "high": float(np.mean((a > 0) & (r > 1.0 + high)))}


def kl_estimators(logp_sampled, logp_other) -> dict[str, float]:
    """KL(sampled || other) from tokens drawn under `sampled`: k1 and k3 of the trainer's own
    estimator (policy_jax.rl.metrics.approx_kl) over every token."""
    sampled, other = _flat(logp_sampled), _flat(logp_other)
    if sampled.size == 0:
        return {"k1": NAN, "k3": NAN}
    kl = approx_kl(jnp.asarray(other), jnp.asarray(sampled), jnp.ones(sampled.shape))
    return {"k1": float(kl["kl_k1"]), "k3": float(kl["kl_k3"])}


def probability_correlation(logp_a, logp_b) -> float:
    """Pearson correlation of the two engines' token probabilities (NaN if either is constant), by the
    trainer's own policy_jax.rl.metrics.pearson_correlation."""
    a, b = _flat(logp_a), _flat(logp_b)
    if a.size < 2:
        return NAN
    return float(pearson_correlation(jnp.exp(jnp.asarray(a)), jnp.exp(jnp.asarray(b)), jnp.ones(a.shape)))


def length_clip_ratio(stopped: Sequence[bool]) -> float:
    """Share of responses cut at the length limit (no stop token)."""
    s = np.asarray(stopped, bool)
    return float(np.mean(~s)) if s.size else NAN


def seed_spread(values: Sequence[float]) -> dict[str, float]:
    """mean, std (sample, ddof 1; NaN for one value), min, max and count of finite values over seeds."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], np.float64)
    if v.size == 0:
        return {"mean": NAN, "std": NAN, "min": NAN, "max": NAN, "n": 0.0}
    std = float(v.std(ddof=1)) if v.size > 1 else NAN
    return {"mean": float(v.mean()), "std": std, "min": float(v.min()), "max": float(v.max()), "n": float(v.size)}


def difference_verdict(a: Sequence[float], b: Sequence[float]) -> str:
    """Whether two arms' per-seed values differ by more than their seed spread.

    "exceeds": the ranges over seeds do not overlap (two seeds or more on each side);
    "within": they overlap; "one seed": a side has fewer than two finite values, so there is no spread.
    """
    sa, sb = seed_spread(a), seed_spread(b)
    if sa["n"] < 2 or sb["n"] < 2:
        return "one seed"
    return "exceeds" if sa["max"] < sb["min"] or sb["max"] < sa["min"] else "within"
