"""Ablations of the importance ratio between the rollout engine and the trainer.

`cuda-agent ablate importance-ratio --config configs/ablation_<size>.yaml` runs several arms (sampler
head precision, source of the old log-probs, truncated importance sampling, RFT initialisation and
value pretraining) from one starting checkpoint, each an on-policy PPO run on a cheap verifiable
task, and writes per-iteration statistics as JSON lines with a Markdown report next to them.

- `statistics`: the per-token statistics as small pure NumPy functions.
- `collapse`: the named rules that declare a run collapsed.
- `config`: the ablation config (arms, seeds, task, warm start, collapse rule).
- `task`: the modular-addition task and its exact-match reward.
- `rollout`, `warm_start`, `runner`: sampling, the shared starting point, the arms' runs.
- `report`: the Markdown report and its plots, from the data alone.
"""
