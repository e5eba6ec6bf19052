"""Jitted update steps: the actor (PPO or RFT) and the critic (value loss), with gradient accumulation.

Each step is one compiled function `(TrainState, batch) -> (TrainState, metrics)` with the state
donated; parameters keep their mesh shardings and the batch is split over ("data", "fsdp").
All per-token arrays are [B, T] and prediction-aligned (policy_jax/rl/batch.py): position t
scores token t+1, and `action_mask_bt` is 1 where token t+1 is an agent token.

Losses are normalised by the whole batch (token count or sequence count), so summing the
micro-batches' losses and gradients gives exactly the loss and gradient of the whole batch.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from policy_jax.attention_dispatch import mesh_scope
from policy_jax.sharding import batch_sharding
from policy_jax.rl.losses import PPOClip, ppo_actor_loss, rft_nll_loss, value_loss
from policy_jax.rl.masked import aggregate_token_loss, aggregation_normalizer, masked_sum
from policy_jax.rl.metrics import approx_kl
from policy_jax.train_state import TrainState, state_shardings


@flax.struct.dataclass
class PolicyBatch:
    """Inputs of an actor step. [B, T] each; `old_logp_bt`, `advantages_bt` are needed for PPO only and
    `token_weights_bt` (truncated IS weights) is optional."""

    tokens_bt: jax.Array
    positions_bt: jax.Array
    segment_ids_bt: jax.Array
    action_mask_bt: jax.Array
    old_logp_bt: jax.Array | None = None
    advantages_bt: jax.Array | None = None
    token_weights_bt: jax.Array | None = None


@flax.struct.dataclass
class ValueBatch:
    """Inputs of a critic step. [B, T] each; `old_values_bt` only with value clipping."""

    tokens_bt: jax.Array
    positions_bt: jax.Array
    segment_ids_bt: jax.Array
    action_mask_bt: jax.Array
    returns_bt: jax.Array
    old_values_bt: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class ActorObjective:
    """What the actor step minimises. kind: "ppo" or "rft" (negative log-likelihood of agent tokens)."""

    kind: str = "ppo"
    clip: PPOClip = PPOClip()
    loss_aggregation: str = "token-mean"
    entropy_coeff: float = 0.0
    logprob_precision: str = "fp32"
    logprob_chunk_size: int = 1024
    num_micro_batches: int = 1
    temperature: float = 1.0  # the sampler's: the trainer scores the distribution it sampled from

    def __post_init__(self):
        if self.kind not in ("ppo", "rft"):
            raise ValueError(f"actor objective {self.kind!r}: expected 'ppo' or 'rft'")


@dataclasses.dataclass(frozen=True)
class CriticObjective:
    value_clip: float | None = None
    loss_aggregation: str = "token-mean"
    num_micro_batches: int = 1


def policy_logprobs(model, batch: PolicyBatch, objective: ActorObjective) -> tuple[jax.Array, jax.Array]:
    """Per-token log-probs and entropies of the policy on `batch` (FP32 head unless asked otherwise). -> [B, T] x 2."""
    from policy_jax.logprobs import recompute_logprobs

    return recompute_logprobs(
        model, batch.tokens_bt, batch.positions_bt, batch.segment_ids_bt,
        precision=objective.logprob_precision, chunk_size=objective.logprob_chunk_size,
        temperature=objective.temperature,
    )


def actor_loss(params: Any, state: TrainState, batch: PolicyBatch, normalizer: jax.Array,
               objective: ActorObjective) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The actor's loss on one (micro-)batch, and metric sums over its agent tokens."""
    model = state.module(params)
    logp_bt, entropy_bt = policy_logprobs(model, batch, objective)
    mask_bt = batch.action_mask_bt.astype(jnp.float32)
    tokens = jnp.sum(mask_bt)
    sums = {"tokens": tokens, "entropy": masked_sum(entropy_bt, mask_bt), "logp": masked_sum(logp_bt, mask_bt)}
    if objective.kind == "rft":
        loss = rft_nll_loss(logp_bt, mask_bt, objective.loss_aggregation, normalizer)
    else:
        loss, stats = ppo_actor_loss(
            logp_bt, batch.old_logp_bt, batch.advantages_bt, mask_bt, objective.clip,
            token_weights_bt=batch.token_weights_bt, mode=objective.loss_aggregation, normalizer=normalizer,
        )
        sums.update({k: v * tokens for k, v in stats.items()})
        sums.update({k: v * tokens for k, v in approx_kl(logp_bt, batch.old_logp_bt, mask_bt).items()})
    if objective.entropy_coeff:
        loss = loss - objective.entropy_coeff * aggregate_token_loss(entropy_bt, mask_bt, objective.loss_aggregation, normalizer)
    sums = jax.tree.map(jax.lax.stop_gradient, sums)
    return loss, sums


def critic_loss(params: Any, state: TrainState, batch: ValueBatch, normalizer: jax.Array,
                objective: CriticObjective) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The critic's loss on one (micro-)batch, and sums for the metrics (explained variance needs moments)."""
    values_bt = state.module(params)(batch.tokens_bt, batch.positions_bt, batch.segment_ids_bt)
    mask_bt = batch.action_mask_bt.astype(jnp.float32)
    loss = value_loss(values_bt, batch.returns_bt, mask_bt, batch.old_values_bt, objective.value_clip,
                      objective.loss_aggregation, normalizer)
    residual_bt = batch.returns_bt - values_bt
    sums = {
        "tokens": jnp.sum(mask_bt),
        "value": masked_sum(values_bt, mask_bt),
        "returns": masked_sum(batch.returns_bt, mask_bt),
        "returns_sq": masked_sum(jnp.square(batch.returns_bt), mask_bt),
        "residual": masked_sum(residual_bt, mask_bt),
        "residual_sq": masked_sum(jnp.square(residual_bt), mask_bt),
    }
    return loss, jax.tree.map(jax.lax.stop_gradient, sums)


def split_micro_batches(batch: Any, n: int) -> Any:
    """[B, ...] leaves -> [n, B/n, ...]; micro-batch i holds rows i, i+n, i+2n, ... so that each
    device's contiguous block of rows contributes equally to every micro-batch."""

    def split(x):
        if x.shape[0] % n:
            raise ValueError(f"batch of {x.shape[0]} rows cannot be split into {n} micro-batches")
        return jnp.swapaxes(x.reshape(x.shape[0] // n, n, *x.shape[1:]), 0, 1)

    return jax.tree.map(split, batch)


def accumulated_value_and_grad(loss_fn: Callable, params: Any, batch: Any, num_micro_batches: int,
                               mesh: Mesh | None = None):
    """Sum of loss, metric sums and gradients over micro-batches of `batch`. -> ((loss, sums), grads).

    With `mesh`, each micro-batch is kept split over the batch axes of the mesh.
    """
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if num_micro_batches == 1:
        return grad_fn(params, batch)
    micro = split_micro_batches(batch, num_micro_batches)
    first = jax.tree.map(lambda x: x[0], micro)
    zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(grad_fn, params, first))

    def body(total, one_micro_batch):
        if mesh is not None:
            one_micro_batch = jax.tree.map(
                lambda x: jax.lax.with_sharding_constraint(x, batch_sharding(mesh, x.ndim)), one_micro_batch)
        out = grad_fn(params, one_micro_batch)
        return jax.tree.map(jnp.add, total, out), None

    total, _ = jax.lax.scan(body, zeros, micro)
    return total


def _global_norm(tree: Any) -> jax.Array:
    """sqrt of the sum of squares of every leaf (optax.tree.norm where available)."""
    tree_ns = getattr(optax, "tree", None)
    if tree_ns is not None and hasattr(tree_ns, "norm"):
        return tree_ns.norm(tree)
    return optax.global_norm(tree)


def _apply(state: TrainState, grads: Any) -> TrainState:
    updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state)


def _finish_actor_metrics(loss, sums, grads, objective: ActorObjective) -> dict[str, jax.Array]:
    n = jnp.maximum(sums.pop("tokens"), 1.0)
    metrics = {"loss": loss, "grad_norm": _global_norm(grads), "agent_tokens": n}
    metrics.update({k: v / n for k, v in sums.items()})
    return metrics


def _finish_critic_metrics(loss, sums, grads, objective: CriticObjective) -> dict[str, jax.Array]:
    n = jnp.maximum(sums["tokens"], 1.0)
    var_returns = sums["returns_sq"] / n - jnp.square(sums["returns"] / n)
    var_residual = sums["residual_sq"] / n - jnp.square(sums["residual"] / n)
    explained = jnp.where(var_returns > 0, 1.0 - var_residual / jnp.where(var_returns > 0, var_returns, 1.0), jnp.nan)
    return {
        "value_loss": loss,
        "grad_norm": _global_norm(grads),
        "agent_tokens": n,
        "value_mean": sums["value"] / n,
        "returns_mean": sums["returns"] / n,
        "explained_variance": explained,
    }


def actor_gradients(state: TrainState, batch: PolicyBatch, objective: ActorObjective, mesh: Mesh | None = None):
    """((loss, metric sums), grads) of the actor on `batch`, accumulated over micro-batches."""
    normalizer = aggregation_normalizer(batch.action_mask_bt.astype(jnp.float32), objective.loss_aggregation)
    fn = lambda p, b: actor_loss(p, state, b, normalizer, objective)
    return accumulated_value_and_grad(fn, state.params, batch, objective.num_micro_batches, mesh)


def critic_gradients(state: TrainState, batch: ValueBatch, objective: CriticObjective, mesh: Mesh | None = None):
    """((loss, metric sums), grads) of the critic on `batch`, accumulated over micro-batches."""
    normalizer = aggregation_normalizer(batch.action_mask_bt.astype(jnp.float32), objective.loss_aggregation)
    fn = lambda p, b: critic_loss(p, state, b, normalizer, objective)
    return accumulated_value_and_grad(fn, state.params, batch, objective.num_micro_batches, mesh)


def _replicated_metrics(mesh: Mesh):
    return NamedSharding(mesh, PartitionSpec())


# Steps kept compiled per process, keyed by role, objective, mesh and the state's shardings (which carry the
# model's graph and optimiser): a stage resumed or run again in the same process (a pipeline, an ablation,
# a test suite) takes the step compiled before instead of tracing and compiling it again.
STEPS_KEPT = 16


def make_actor_step(state: TrainState, objective: ActorObjective, mesh: Mesh) -> Callable:
    """A jitted `(state, PolicyBatch) -> (state, metrics)`; the state is donated and keeps its shardings."""
    return _jitted_step("actor", objective, mesh, *_flat_shardings(state))


def make_critic_step(state: TrainState, objective: CriticObjective, mesh: Mesh) -> Callable:
    """A jitted `(state, ValueBatch) -> (state, metrics)`; the state is donated and keeps its shardings."""
    return _jitted_step("critic", objective, mesh, *_flat_shardings(state))


def _flat_shardings(state: TrainState) -> tuple[Any, tuple]:
    leaves, treedef = jax.tree.flatten(state_shardings(state))
    return treedef, tuple(leaves)


_ROLES = {"actor": (actor_gradients, _finish_actor_metrics), "critic": (critic_gradients, _finish_critic_metrics)}


@functools.lru_cache(maxsize=STEPS_KEPT)
def _jitted_step(role: str, objective: ActorObjective | CriticObjective, mesh: Mesh, treedef, leaves: tuple):
    gradients, finish = _ROLES[role]

    def step(state: TrainState, batch):
        with mesh_scope(mesh):  # the attention kernels lay themselves over the mesh
            (loss, sums), grads = gradients(state, batch, objective, mesh)
        return _apply(state, grads), finish(loss, sums, grads, objective)

    out_shardings = (jax.tree.unflatten(treedef, leaves), _replicated_metrics(mesh))
    return jax.jit(step, donate_argnums=(0,), out_shardings=out_shardings)
