"""Advantages for PPO: GAE over token masks, the outcome reward placement, whitening.

All arrays are prediction-aligned (see `batch.py`): position t holds the action "emit token t+1",
the critic's value V_t of the state before that action (tokens 0..t), its reward r_t and
its mask m_t (1 for agent tokens, 0 for environment tokens and padding).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from policy_jax.rl.masked import masked_mean, masked_variance

#: Paper (docs/paper.md §7): gamma = 1, lambda = 0.95.
DEFAULT_GAMMA = 1.0
DEFAULT_LAMBDA = 0.95


def outcome_rewards(reward_b: jnp.ndarray, mask_bt: jnp.ndarray) -> jnp.ndarray:
    """Place each trajectory's outcome reward on its last agent token. reward_b: [B]; mask_bt: [B, T] -> [B, T].

    Rows with no agent token get no reward.
    """
    t = mask_bt.shape[-1]
    positions_t = jnp.arange(t)
    last_b = jnp.max(jnp.where(mask_bt > 0, positions_t[None, :], -1), axis=-1)
    return jnp.where(positions_t[None, :] == last_b[:, None], reward_b[:, None], 0.0).astype(jnp.float32)


def gae_advantages(
    rewards_bt: jnp.ndarray,
    values_bt: jnp.ndarray,
    mask_bt: jnp.ndarray,
    gamma: float = DEFAULT_GAMMA,
    lam: float = DEFAULT_LAMBDA,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Generalised advantage estimation that skips environment tokens. All [B, T] -> (advantages_bt, returns_bt).

    Backwards over t, with `next_value` and `running` starting at 0:
        delta_t   = r_t + gamma * next_value - V_t
        running'  = delta_t + gamma * lam * running
    and on an agent token (m_t = 1) `next_value <- V_t`, `running <- running'`; on an
    environment token (m_t = 0) both carry through unchanged, so the agent token before a
    tool output bootstraps from the value of the next agent token (verl
    `compute_gae_advantage_return`, Tunix `compute_gae_advantages`).
    returns = V + A (the value targets). Both outputs are 0 where the mask is 0.
    """
    rewards_tb = jnp.swapaxes(rewards_bt.astype(jnp.float32), 0, 1)
    values_tb = jnp.swapaxes(values_bt.astype(jnp.float32), 0, 1)
    mask_tb = jnp.swapaxes(mask_bt.astype(jnp.float32), 0, 1)

    def backward_step(carry, inputs):
        next_value_b, running_b = carry
        reward_b, value_b, m_b = inputs
        delta_b = reward_b + gamma * next_value_b - value_b
        candidate_b = delta_b + gamma * lam * running_b
        next_value_b = m_b * value_b + (1.0 - m_b) * next_value_b
        running_b = m_b * candidate_b + (1.0 - m_b) * running_b
        return (next_value_b, running_b), running_b

    zeros_b = jnp.zeros(rewards_tb.shape[1], jnp.float32)
    _, advantages_tb = jax.lax.scan(backward_step, (zeros_b, zeros_b), (rewards_tb, values_tb, mask_tb), reverse=True)
    advantages_bt = jnp.swapaxes(advantages_tb, 0, 1) * mask_bt
    returns_bt = (advantages_bt + values_bt.astype(jnp.float32)) * mask_bt
    return advantages_bt, returns_bt


def whiten_advantages(advantages_bt: jnp.ndarray, mask_bt: jnp.ndarray, eps: float = 1e-8) -> jnp.ndarray:
    """(A - mean) / sqrt(var + eps) over masked-in tokens of the batch; 0 where masked out. [B, T] -> [B, T]."""
    mean = masked_mean(advantages_bt, mask_bt)
    var = masked_variance(advantages_bt, mask_bt)
    return (advantages_bt - mean) * jax.lax.rsqrt(var + eps) * mask_bt
