"""The state a training step updates: parameters, optimiser state and step, placed on a mesh.

A model is split once into its static graph (`graphdef`) and pure-dict parameter values, so the
update step is one jitted function of arrays with the state donated. Optimiser moments take the
sharding of the parameters they track.
"""

from __future__ import annotations

from typing import Any

import dataclasses
import functools

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from policy_jax.run_config import OptimizerConfig


@flax.struct.dataclass
class TrainState:
    """Parameters (`params`, a pure dict of arrays), optimiser state and the number of updates taken.

    `graphdef` and `rest` (non-parameter variables such as RNG state) rebuild the module;
    `optimizer` says how parameters are updated. The static fields compare by value, so a state
    restored into a fresh template runs through the same compiled step.
    """

    step: jax.Array
    params: Any
    opt_state: Any
    rest: Any
    graphdef: Any = flax.struct.field(pytree_node=False)
    optimizer: "Optimizer" = flax.struct.field(pytree_node=False)

    @property
    def tx(self) -> optax.GradientTransformation:
        return self.optimizer.tx

    def module(self, params: Any | None = None) -> nnx.Module:
        """The nnx module with `params` (default: this state's)."""
        return nnx.merge(self.graphdef, self.params if params is None else params, self.rest)


def learning_rate_schedule(cfg: OptimizerConfig, total_steps: int) -> optax.Schedule:
    """The learning rate at each update: constant, linear warm-up then constant, or warm-up then cosine."""
    if cfg.schedule == "constant":
        return optax.constant_schedule(cfg.learning_rate)
    if cfg.schedule == "warmup_constant":
        return optax.join_schedules(
            [optax.linear_schedule(0.0, cfg.learning_rate, max(cfg.warmup_steps, 1)),
             optax.constant_schedule(cfg.learning_rate)],
            [max(cfg.warmup_steps, 1)],
        )
    decay_steps = cfg.decay_steps or total_steps
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=cfg.learning_rate,
        warmup_steps=cfg.warmup_steps,
        decay_steps=max(decay_steps, cfg.warmup_steps + 1),
        end_value=cfg.learning_rate * cfg.end_learning_rate_ratio,
    )


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """An optimiser named by its config (hashable, compared by value); `.tx` is the optax transformation."""

    config: OptimizerConfig
    total_steps: int

    @property
    def tx(self) -> optax.GradientTransformation:
        return _adamw_transformation(self.config, self.total_steps)


def make_optimizer(cfg: OptimizerConfig, total_steps: int) -> Optimizer:
    """AdamW with the configured schedule, after global-norm clipping when `grad_clip_norm` is set."""
    return Optimizer(cfg, total_steps)


@functools.lru_cache(maxsize=64)
def _adamw_transformation(cfg: OptimizerConfig, total_steps: int) -> optax.GradientTransformation:
    adamw = optax.adamw(
        learning_rate=learning_rate_schedule(cfg, total_steps),
        b1=cfg.b1,
        b2=cfg.b2,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
    )
    if cfg.grad_clip_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(cfg.grad_clip_norm), adamw)


def opt_state_shardings(opt_state_shape: Any, params: Any, mesh: Mesh) -> Any:
    """Shardings for an optimiser state: every sub-tree shaped like `params` (Adam's moments) takes
    the parameters' shardings; everything else (step counts) is replicated."""
    params_treedef = jax.tree.structure(params)
    param_shardings = jax.tree.map(lambda p: p.sharding, params)
    replicated = NamedSharding(mesh, PartitionSpec())

    def is_params_like(node: Any) -> bool:
        return jax.tree.structure(node) == params_treedef and not isinstance(node, jax.ShapeDtypeStruct)

    return jax.tree.map(
        lambda node: param_shardings if is_params_like(node) else replicated,
        opt_state_shape,
        is_leaf=is_params_like,
    )


def create_train_state(model: nnx.Module, optimizer: Optimizer, mesh: Mesh) -> TrainState:
    """Split a (sharded) model into a TrainState and initialise the optimiser on the same shardings.

    The model's parameters should already be placed (policy_jax.sharding.shard_module or init_sharded).
    The state shares the model's arrays and steps donate them: after the first step use
    `state.module()`, not `model`.
    """
    graphdef, params_state, rest_state = nnx.split(model, nnx.Param, ...)
    params = nnx.to_pure_dict(params_state)
    rest = nnx.to_pure_dict(rest_state)
    tx = optimizer.tx
    shape = jax.eval_shape(tx.init, params)
    opt_state = jax.jit(tx.init, out_shardings=opt_state_shardings(shape, params, mesh))(params)
    step = jax.device_put(jnp.zeros((), jnp.int32), NamedSharding(mesh, PartitionSpec()))
    return TrainState(step=step, params=params, opt_state=opt_state, rest=rest, graphdef=graphdef, optimizer=optimizer)


def state_shardings(state: TrainState) -> TrainState:
    """A TrainState-shaped tree of the shardings of `state`'s arrays (for jit in/out shardings and restores)."""
    return jax.tree.map(lambda x: x.sharding, state)
