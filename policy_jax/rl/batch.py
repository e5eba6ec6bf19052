"""The trajectory batch the training steps consume, and its alignment to next-token predictions.

The agent loop writes one row per trajectory, token-aligned: `tokens[t]`, `loss_mask[t]`
(1 if the policy generated token t, 0 for prompt, tool output and padding),
`rollout_logprobs[t]` (the sampler's log-prob of token t; 0 where loss_mask is 0) and one
`reward`. The model's log-probs are prediction-aligned: `logp[:, t]` scores token t+1 given
tokens 0..t (see `policy_jax.logprobs.recompute_logprobs`). `TrajectoryBatch` keeps the
token-aligned arrays and exposes prediction-aligned views, so the losses see one convention.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.struct
import jax.numpy as jnp
import numpy as np


def shift_to_predictions(x_bt: jnp.ndarray) -> jnp.ndarray:
    """Token-aligned -> prediction-aligned: out[:, t] = x[:, t+1], out[:, T-1] = 0. [B, T] -> [B, T]."""
    return jnp.concatenate([x_bt[:, 1:], jnp.zeros_like(x_bt[:, :1])], axis=1)


@flax.struct.dataclass
class TrajectoryBatch:
    """A padded batch of trajectories (token-aligned). Shapes: [B, T] except reward_b [B].

    segment_ids_bt is 1 on real tokens and 0 on padding (the model's convention);
    positions_bt counts real tokens from 0.
    """

    tokens_bt: jnp.ndarray
    positions_bt: jnp.ndarray
    segment_ids_bt: jnp.ndarray
    loss_mask_bt: jnp.ndarray
    rollout_logprobs_bt: jnp.ndarray
    reward_b: jnp.ndarray
    truncated_b: jnp.ndarray  # 1.0 where the trajectory was longer than the window (its loss mask is all 0)

    @property
    def action_mask_bt(self) -> jnp.ndarray:
        """Prediction-aligned mask: 1 at t when token t+1 is an agent token. [B, T] float32."""
        return shift_to_predictions(self.loss_mask_bt.astype(jnp.float32) * (self.segment_ids_bt > 0))

    @property
    def rollout_action_logprobs_bt(self) -> jnp.ndarray:
        """Prediction-aligned sampler log-probs: at t, log p_rollout(token t+1). [B, T] float32."""
        return shift_to_predictions(self.rollout_logprobs_bt.astype(jnp.float32))

    @property
    def batch_size(self) -> int:
        return self.tokens_bt.shape[0]


def pad_trajectories(
    tokens: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[int]],
    rollout_logprobs: Sequence[Sequence[float]] | None,
    rewards: Sequence[float],
    seq_len: int,
    pad_id: int = 0,
) -> TrajectoryBatch:
    """Right-pad per-trajectory lists to `seq_len` into a numpy-backed TrajectoryBatch.

    A trajectory longer than `seq_len` is cut to the window and takes no part in the loss: its
    outcome reward belongs to tokens outside the window, so its loss mask is all 0 and
    `truncated_b` counts it. Raises ValueError when a trajectory's fields have different lengths.
    """
    b = len(tokens)
    tok = np.full((b, seq_len), pad_id, np.int32)
    mask = np.zeros((b, seq_len), np.float32)
    logp = np.zeros((b, seq_len), np.float32)
    seg = np.zeros((b, seq_len), np.int32)
    pos = np.zeros((b, seq_len), np.int32)
    truncated = np.zeros((b,), np.float32)
    for i in range(b):
        n = len(tokens[i])
        if len(loss_masks[i]) != n or (rollout_logprobs is not None and len(rollout_logprobs[i]) != n):
            raise ValueError(f"trajectory {i}: tokens, loss_mask and rollout_logprobs have different lengths")
        truncated[i] = float(n > seq_len)
        n = min(n, seq_len)
        tok[i, :n] = np.asarray(tokens[i][:n])
        if not truncated[i]:
            mask[i, :n] = np.asarray(loss_masks[i][:n])
        if rollout_logprobs is not None:
            logp[i, :n] = np.asarray(rollout_logprobs[i][:n])
        seg[i, :n] = 1
        pos[i, :n] = np.arange(n)
    return TrajectoryBatch(
        tokens_bt=tok,
        positions_bt=pos,
        segment_ids_bt=seg,
        loss_mask_bt=mask,
        rollout_logprobs_bt=logp,
        reward_b=np.asarray(rewards, np.float32),
        truncated_b=truncated,
    )
