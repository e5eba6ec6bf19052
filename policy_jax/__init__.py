"""Policy and critic in JAX/Flax: model, checkpoint import, sampler, FP32 log-probs, RL losses, training. Never imports torch."""
