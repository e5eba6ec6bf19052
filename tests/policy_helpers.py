"""Shared helpers for the policy model/sampler/log-prob tests (H3's area)."""

from __future__ import annotations

import numpy as np
from flax import nnx

from policy_jax.sharding import iter_variables


def random_model(cls, cfg, seed: int = 0, scale: float = 1.0):
    """`cls(cfg)` with NumPy-random weights: the same model as a jax.random init, without compiling
    one random kernel per parameter shape (slow on a busy 2-core CPU). Norm scales near 1, other
    weights N(0, scale / fan_in) so the logits are O(1)."""
    model = nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(seed)
    for path, var in iter_variables(model):
        shape, dtype = var.get_value().shape, var.get_value().dtype
        if "scale_d" in path:
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        elif len(shape) <= 1:
            value = 0.1 * rng.standard_normal(shape)
        else:
            value = rng.standard_normal(shape) * scale / np.sqrt(shape[0])
        var.set_value(np.asarray(value, np.float32).astype(dtype))
    return model
