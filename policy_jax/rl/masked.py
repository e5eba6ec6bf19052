"""Masked reductions and the loss aggregation modes used by every RL loss."""

from __future__ import annotations

import jax.numpy as jnp

#: Aggregation modes for per-token losses (verl's names).
#: - "token-mean": sum over all agent tokens of the batch / number of agent tokens (the paper's choice).
#: - "seq-mean-token-sum": per sequence, sum over its agent tokens; mean over sequences that have any.
#: - "seq-mean-token-mean": per sequence, mean over its agent tokens; mean over sequences that have any.
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")


def masked_sum(x_bt: jnp.ndarray, mask_bt: jnp.ndarray) -> jnp.ndarray:
    """Sum of `x` over positions where `mask` is 1. x_bt, mask_bt: [B, T] -> scalar."""
    return jnp.sum(x_bt * mask_bt)


def masked_mean(x_bt: jnp.ndarray, mask_bt: jnp.ndarray) -> jnp.ndarray:
    """Mean of `x` over positions where `mask` is 1 (0 when the mask is empty). [B, T] -> scalar."""
    count = jnp.sum(mask_bt)
    return jnp.sum(x_bt * mask_bt) / jnp.maximum(count, 1.0)


def masked_variance(x_bt: jnp.ndarray, mask_bt: jnp.ndarray) -> jnp.ndarray:
    """Population (biased) variance of `x` over masked-in positions. [B, T] -> scalar."""
    mean = masked_mean(x_bt, mask_bt)
    return masked_mean(jnp.square(x_bt - mean), mask_bt)


def aggregation_normalizer(mask_bt: jnp.ndarray, mode: str) -> jnp.ndarray:
    """The denominator `aggregate_token_loss` divides by for `mode`. mask_bt: [B, T] -> scalar.

    Computed once over a whole batch, it lets micro-batches of that batch be summed into the
    same value as the loss of the whole batch (gradient accumulation).
    """
    if mode == "token-mean":
        return jnp.maximum(jnp.sum(mask_bt), 1.0)
    if mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        return jnp.maximum(jnp.sum(jnp.any(mask_bt > 0, axis=-1)), 1.0)
    raise ValueError(f"unknown loss aggregation {mode!r}; expected one of {LOSS_AGGREGATIONS}")


def aggregate_token_loss(
    loss_bt: jnp.ndarray, mask_bt: jnp.ndarray, mode: str = "token-mean", normalizer: jnp.ndarray | None = None
) -> jnp.ndarray:
    """Reduce a per-token loss to a scalar over masked-in tokens. loss_bt, mask_bt: [B, T] -> scalar.

    `normalizer` overrides the denominator (see `aggregation_normalizer`); by default it is the
    one of this batch.
    """
    if normalizer is None:
        normalizer = aggregation_normalizer(mask_bt, mode)
    if mode == "token-mean":
        return jnp.sum(loss_bt * mask_bt) / normalizer
    if mode == "seq-mean-token-sum":
        return jnp.sum(loss_bt * mask_bt) / normalizer
    if mode == "seq-mean-token-mean":
        per_seq_b = jnp.sum(loss_bt * mask_bt, axis=-1) / jnp.maximum(jnp.sum(mask_bt, axis=-1), 1.0)
        return jnp.sum(per_seq_b) / normalizer
    raise ValueError(f"unknown loss aggregation {mode!r}; expected one of {LOSS_AGGREGATIONS}")
