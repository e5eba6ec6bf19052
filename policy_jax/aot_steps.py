"""The four steps of a training run, compiled ahead of time for a mesh of TPU devices (see aot.py):
the actor's PPO update, the critic's update, the trainer's log-prob recompute and the sampler's
decode step, each on abstract arguments shaped by the run config."""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from policy_jax import kv_cache as kvc
from policy_jax.aot import CompiledStep, abstract_module, abstract_train_state, cache_sharding, compile_step
from policy_jax.aot import for_platform, token_array, with_mesh
from policy_jax.logprobs import recompute_logprobs
from policy_jax.run_config import RunConfig
from policy_jax.sampler import decode_step
from policy_jax.sharding import batch_sharding
from policy_jax.stages import actor_objective, critic_objective
from policy_jax.train_steps import PolicyBatch, ValueBatch, make_actor_step, make_critic_step
from policy_jax.transformer import CausalLM, Critic


@dataclasses.dataclass(frozen=True)
class StepShapes:
    """Rows of each step and the tokens per row."""

    seq_len: int
    update_rows: int  # one PPO mini-batch (split into micro-batches inside the step)
    logprob_rows: int
    decode_rows: int


def shapes_of(cfg: RunConfig, decode_rows: int | None = None) -> StepShapes:
    update = min(cfg.ppo.mini_batch_size, cfg.train.global_batch_size)
    micro = cfg.train.micro_batch_size or update
    return StepShapes(cfg.train.seq_len, update, micro, decode_rows or micro)


def _floats(mesh, rows, length):
    return token_array(mesh, rows, length, jnp.float32)


def actor_ppo_step(cfg: RunConfig, mesh, shapes: StepShapes) -> CompiledStep:
    model = abstract_module(CausalLM, for_platform(cfg.model), mesh)
    state = abstract_train_state(model, cfg.actor_optimizer, cfg.train.steps, mesh)
    rows, t = shapes.update_rows, shapes.seq_len
    ints, floats = token_array(mesh, rows, t), _floats(mesh, rows, t)
    batch = PolicyBatch(tokens_bt=ints, positions_bt=ints, segment_ids_bt=ints, action_mask_bt=floats,
                        old_logp_bt=floats, advantages_bt=floats,
                        token_weights_bt=floats if cfg.ppo.tis_cap is not None else None)
    objective = actor_objective(cfg, "ppo", rows)
    step = make_actor_step(state, objective, mesh)
    return compile_step("actor PPO step", rows, step, state, batch, repeats=objective.num_micro_batches)


def critic_step(cfg: RunConfig, mesh, shapes: StepShapes) -> CompiledStep:
    model = abstract_module(Critic, for_platform(cfg.model), mesh)
    state = abstract_train_state(model, cfg.critic_optimizer, cfg.train.steps, mesh)
    rows, t = shapes.update_rows, shapes.seq_len
    ints, floats = token_array(mesh, rows, t), _floats(mesh, rows, t)
    batch = ValueBatch(tokens_bt=ints, positions_bt=ints, segment_ids_bt=ints, action_mask_bt=floats,
                       returns_bt=floats, old_values_bt=floats if cfg.ppo.value_clip is not None else None)
    objective = critic_objective(cfg, rows)
    step = make_critic_step(state, objective, mesh)
    return compile_step("critic step", rows, step, state, batch, repeats=objective.num_micro_batches)


def logprob_recompute(cfg: RunConfig, mesh, shapes: StepShapes) -> CompiledStep:
    model = abstract_module(CausalLM, for_platform(cfg.model), mesh)
    state = abstract_train_state(model, cfg.actor_optimizer, cfg.train.steps, mesh)
    rows, t = shapes.logprob_rows, shapes.seq_len

    def recompute(params, tokens, positions, segments):
        return recompute_logprobs(state.module(params), tokens, positions, segments,
                                  precision=cfg.ppo.logprob_precision, chunk_size=cfg.train.logprob_chunk_size,
                                  temperature=cfg.sampling.scoring_temperature)

    ints = token_array(mesh, rows, t)
    return compile_step("log-prob recompute", rows, jax.jit(with_mesh(recompute, mesh)), state.params, ints, ints, ints)


def _abstract_cache(model_cfg, mesh, rows: int, slots: int) -> kvc.KVCache:
    layer = jax.ShapeDtypeStruct((rows, slots, model_cfg.num_key_value_heads, model_cfg.head_dim),
                                 model_cfg.compute_jnp_dtype, sharding=cache_sharding(mesh, rows, model_cfg))
    layers = tuple(layer for _ in range(model_cfg.num_hidden_layers))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)
    return kvc.KVCache(layers, layers, token_array(mesh, rows, slots, jnp.bool_), scalar)


def sampler_decode_step(cfg: RunConfig, mesh, shapes: StepShapes) -> CompiledStep:
    """One token per row against a cache of `seq_len` slots (the cache donated, as the decode loop does)."""
    model_cfg = for_platform(cfg.model)
    model = abstract_module(CausalLM, model_cfg, mesh)
    state = abstract_train_state(model, cfg.actor_optimizer, cfg.train.steps, mesh)
    rows = shapes.decode_rows
    cache = _abstract_cache(model_cfg, mesh, rows, shapes.seq_len)
    one = lambda dtype: jax.ShapeDtypeStruct((rows,), dtype, sharding=batch_sharding(mesh, 1))  # noqa: E731

    def decode(params, token, position, valid, cache):
        return decode_step(state.module(params), token, position, valid, cache)

    fn = jax.jit(with_mesh(decode, mesh), donate_argnums=(4,))
    return compile_step("sampler decode step", rows, fn, state.params, one(jnp.int32), one(jnp.int32), one(jnp.bool_),
                        cache)


STEPS: dict[str, Callable[[RunConfig, object, StepShapes], CompiledStep]] = {
    "actor": actor_ppo_step,
    "critic": critic_step,
    "logprobs": logprob_recompute,
    "decode": sampler_decode_step,
}
