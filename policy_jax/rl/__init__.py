"""The RL math of the trainer as pure JAX functions (no model, no optimiser).

- `masked`: masked means and the loss aggregation modes.
- `advantages`: GAE over token masks, outcome rewards, advantage whitening.
- `losses`: RFT negative log-likelihood, value loss, PPO actor loss, truncated importance weights.
- `metrics`: clip fractions, KL estimates, explained variance, rollout-vs-trainer probability diagnostics.
- `batch`: the trajectory batch the training steps consume, and its alignment to next-token predictions.

Every function takes arrays named with their axes (`_bt` = [batch, time]) and is tested
against a plain NumPy loop in `tests/test_rl_math.py`.
"""
