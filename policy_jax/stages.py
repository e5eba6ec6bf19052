"""Stage drivers over trajectory batches: Rejection Fine-Tuning, value pretraining, PPO (docs/paper.md §7).

Input: rows of the agent loop's trajectory table (agent/trajectory.py: `tokens`, `loss_mask`,
`rollout_logprobs`, `reward`, `schema_violations`, `redundant_loop`), read from parquet or
given in memory. A NaN/None reward is an infrastructure failure: such rows are never trained on.

- RFT: keep reward > min_reward, no schema violations, no redundant loops; minimise the NLL of agent tokens.
- Value pretraining: the critic regresses GAE targets built from the outcome reward on the last agent token.
- PPO: per rollout batch, old log-probs recomputed by the trainer (FP32 head), values, GAE advantages,
  truncated IS weights against the sampler's log-probs; then mini-batch epochs of actor and critic steps.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from policy_jax.attention_dispatch import mesh_scope
from policy_jax.distributed import global_batch_from_local
from policy_jax.rl.advantages import gae_advantages, outcome_rewards, whiten_advantages
from policy_jax.rl.batch import TrajectoryBatch, pad_trajectories
from policy_jax.rl.losses import PPOClip, truncated_is_weights
from policy_jax.rl.metrics import ratio_stats_by_probability, rollout_mismatch_metrics
from policy_jax.run_config import PPOConfig, RFTConfig, RunConfig
from policy_jax.sharding import batch_sharding
from policy_jax.train_state import TrainState
from policy_jax.train_steps import (
    ActorObjective,
    CriticObjective,
    PolicyBatch,
    ValueBatch,
    make_actor_step,
    make_critic_step,
    policy_logprobs,
)

REQUIRED_COLUMNS = ("tokens", "loss_mask", "rollout_logprobs", "reward")
Log = Callable[[dict[str, Any]], None]


class StageError(ValueError):
    """Training data or settings a stage cannot use (one clear line for the user)."""


# ---- trajectory table ------------------------------------------------------------------------


def read_trajectory_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a trajectory parquet file (only the columns training uses)."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise StageError(f"trajectory file not found: {path}")
    try:
        schema = pq.read_schema(path)
    except Exception as e:  # pyarrow raises several types for a non-parquet file
        raise StageError(f"{path} is not a parquet file: {str(e).splitlines()[0]}") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in schema.names]
    if missing:
        raise StageError(f"{path} lacks column(s) {', '.join(missing)} (needs {', '.join(REQUIRED_COLUMNS)})")
    wanted = [c for c in (*REQUIRED_COLUMNS, "schema_violations", "redundant_loop") if c in schema.names]
    return pq.read_table(path, columns=wanted).to_pylist()


def is_infrastructure_failure(row: dict[str, Any]) -> bool:
    reward = row.get("reward")
    return reward is None or (isinstance(reward, float) and math.isnan(reward))


def rft_filter(rows: Sequence[dict[str, Any]], cfg: RFTConfig) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Rejection sampling for RFT: keep rows with reward > min_reward and, as configured, no tool-schema
    violation and no redundant loop. Returns the kept rows and the count of each rejection reason
    (a row is counted under its first failing reason)."""
    kept: list[dict[str, Any]] = []
    rejected = {"infrastructure_failure": 0, "reward": 0, "schema_violation": 0, "redundant_loop": 0, "no_agent_tokens": 0}
    for row in rows:
        if is_infrastructure_failure(row):
            rejected["infrastructure_failure"] += 1
        elif not row["reward"] > cfg.min_reward:
            rejected["reward"] += 1
        elif cfg.drop_schema_violations and int(row.get("schema_violations") or 0) > 0:
            rejected["schema_violation"] += 1
        elif cfg.drop_redundant_loops and bool(row.get("redundant_loop")):
            rejected["redundant_loop"] += 1
        elif not any(row["loss_mask"]):
            rejected["no_agent_tokens"] += 1
        else:
            kept.append(row)
    return kept, rejected


def trainable_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with a real reward (infrastructure failures are never scored, never trained on)."""
    return [r for r in rows if not is_infrastructure_failure(r)]


@dataclasses.dataclass
class BatchIterator:
    """Endless, resumable batches of rows: a fresh permutation (from `seed` and the epoch) per epoch.

    An epoch has ceil(N / batch_size) batches; the last one wraps to the permutation's start.
    `position()` is JSON (saved with checkpoints); pass it back as `position` to resume.
    """

    rows: Sequence[dict[str, Any]]
    batch_size: int
    seq_len: int
    seed: int = 0
    position: dict[str, int] | None = None

    def __post_init__(self):
        if not self.rows:
            raise StageError("no trajectories left to train on")
        pos = self.position or {}
        self.epoch = int(pos.get("epoch", 0))
        self.index = int(pos.get("index", 0))

    @property
    def batches_per_epoch(self) -> int:
        return -(-len(self.rows) // self.batch_size)

    def current_position(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def _order(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch]).permutation(len(self.rows))

    def __iter__(self) -> Iterator[TrajectoryBatch]:
        return self

    def __next__(self) -> TrajectoryBatch:
        order = self._order()
        picks = [order[(self.index * self.batch_size + k) % len(order)] for k in range(self.batch_size)]
        self.index += 1
        if self.index >= self.batches_per_epoch:
            self.epoch, self.index = self.epoch + 1, 0
        chosen = [self.rows[i] for i in picks]
        return pad_trajectories(
            [r["tokens"] for r in chosen],
            [r["loss_mask"] for r in chosen],
            [r["rollout_logprobs"] for r in chosen],
            [float(r["reward"]) for r in chosen],
            self.seq_len,
        )


def to_device(batch: TrajectoryBatch, mesh) -> TrajectoryBatch:
    """Place a (global, numpy) batch on the mesh: each process contributes its contiguous share of rows."""
    n, i = jax.process_count(), jax.process_index()
    rows = batch.batch_size
    if rows % n:
        raise StageError(f"batch of {rows} rows does not split over {n} processes")
    local = jax.tree.map(lambda x: np.asarray(x)[i * rows // n:(i + 1) * rows // n], batch)
    return global_batch_from_local(local, lambda ndim: batch_sharding(mesh, ndim))


def micro_batches_for(rows: int, micro_batch_size: int | None) -> int:
    if micro_batch_size is None or micro_batch_size >= rows:
        return 1
    if rows % micro_batch_size:
        raise StageError(f"{rows} rows per update are not a multiple of micro_batch_size={micro_batch_size}")
    return rows // micro_batch_size


def _floats(tree: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in jax.device_get(tree).items():
        v = np.asarray(v)
        out[k] = float(v) if v.ndim == 0 else v.tolist()
    return out


def _policy_batch(tb: TrajectoryBatch, **extra) -> PolicyBatch:
    return PolicyBatch(tokens_bt=tb.tokens_bt, positions_bt=tb.positions_bt, segment_ids_bt=tb.segment_ids_bt,
                       action_mask_bt=tb.action_mask_bt, **extra)


# ---- RFT ----------------------------------------------------------------------------------


def actor_objective(cfg: RunConfig, kind: str, rows_per_update: int) -> ActorObjective:
    return ActorObjective(
        kind=kind,
        clip=PPOClip(cfg.ppo.clip_low, cfg.ppo.clip_high, cfg.ppo.dual_clip),
        loss_aggregation=cfg.ppo.loss_aggregation,
        entropy_coeff=cfg.ppo.entropy_coeff,
        logprob_precision=cfg.ppo.logprob_precision,
        logprob_chunk_size=cfg.train.logprob_chunk_size,
        num_micro_batches=micro_batches_for(rows_per_update, cfg.train.micro_batch_size),
        # RFT clones the sampled actions under the plain policy; PPO's ratio needs the sampler's temperature.
        temperature=cfg.sampling.scoring_temperature if kind == "ppo" else 1.0,
    )


def critic_objective(cfg: RunConfig, rows_per_update: int) -> CriticObjective:
    return CriticObjective(
        value_clip=cfg.ppo.value_clip,
        loss_aggregation=cfg.ppo.loss_aggregation,
        num_micro_batches=micro_batches_for(rows_per_update, cfg.train.micro_batch_size),
    )


def run_rft(state: TrainState, batches: BatchIterator, cfg: RunConfig, mesh, steps: int,
            checkpointer=None, log: Log = lambda record: None) -> TrainState:
    """`steps` behaviour-cloning updates of the actor on filtered trajectories."""
    step_fn = make_actor_step(state, actor_objective(cfg, "rft", batches.batch_size), mesh)

    def one(state, tb):
        return step_fn(state, _policy_batch(tb))

    return _loop(state, batches, mesh, steps, one, "rft", checkpointer, log)


# ---- value pretraining --------------------------------------------------------------------


def value_targets(values_bt: jax.Array, tb: TrajectoryBatch, ppo: PPOConfig) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Outcome reward on the last agent token, then GAE. -> (rewards_bt, advantages_bt, returns_bt), [B, T]."""
    mask_bt = tb.action_mask_bt
    rewards_bt = outcome_rewards(tb.reward_b, mask_bt)
    advantages_bt, returns_bt = gae_advantages(rewards_bt, values_bt, mask_bt, ppo.gamma, ppo.lam)
    return rewards_bt, advantages_bt, returns_bt


def run_value_pretraining(state: TrainState, batches: BatchIterator, cfg: RunConfig, mesh, steps: int,
                          checkpointer=None, log: Log = lambda record: None) -> TrainState:
    """`steps` critic updates towards GAE targets of the outcome reward (the critic's own values bootstrap)."""
    step_fn = make_critic_step(state, critic_objective(cfg, batches.batch_size), mesh)

    @jax.jit
    def prepare(state, tb):
        with mesh_scope(mesh):
            values_bt = state.module()(tb.tokens_bt, tb.positions_bt, tb.segment_ids_bt)
        _, _, returns_bt = value_targets(values_bt, tb, cfg.ppo)
        return ValueBatch(tokens_bt=tb.tokens_bt, positions_bt=tb.positions_bt, segment_ids_bt=tb.segment_ids_bt,
                          action_mask_bt=tb.action_mask_bt, returns_bt=returns_bt,
                          old_values_bt=values_bt if cfg.ppo.value_clip is not None else None)

    def one(state, tb):
        return step_fn(state, prepare(state, tb))

    return _loop(state, batches, mesh, steps, one, "value", checkpointer, log)


def require_agent_tokens(tb: TrajectoryBatch, stage: str) -> None:
    """StageError when a batch has no token to train on (e.g. every trajectory longer than the window)."""
    if not np.asarray(tb.loss_mask_bt).any():
        truncated, seq_len = int(np.asarray(tb.truncated_b).sum()), tb.tokens_bt.shape[1]
        raise StageError(f"{stage}: a batch of {tb.batch_size} trajectories has no agent token to train on "
                         f"({truncated} longer than train.seq_len={seq_len}); raise train.seq_len or use shorter trajectories")


LOSS_KEYS = ("loss", "value_loss")


def require_finite_loss(metrics: dict[str, Any], stage: str, step: int) -> None:
    """StageError on a NaN or infinite loss: training stops before anything is saved."""
    bad = {k: metrics[k] for k in LOSS_KEYS if k in metrics and not math.isfinite(metrics[k])}
    if bad:
        raise StageError(f"{stage} step {step}: non-finite {', '.join(f'{k}={v}' for k, v in bad.items())}; stopped without saving this step")


def average_metrics(updates: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One record for several updates (every mini-batch of every epoch of a PPO step): each number
    is averaged over the updates, weighted by their agent tokens, ignoring NaN (an undefined
    explained variance); agent_tokens is summed; `updates` counts them."""
    if not updates:
        return {}
    weights = [float(u.get("agent_tokens", 1.0)) for u in updates]
    out: dict[str, Any] = {"updates": len(updates)}
    for key in updates[0]:
        values = [u[key] for u in updates]
        if key == "agent_tokens":
            out[key] = float(sum(values))
        elif all(isinstance(v, float) for v in values):
            pairs = [(w, v) for w, v in zip(weights, values) if not math.isnan(v)]
            total = sum(w for w, _ in pairs)
            out[key] = sum(w * v for w, v in pairs) / total if pairs and total > 0 else float("nan")
        else:
            out[key] = values[-1]
    return out


def compiling_notice(stage: str, step: int) -> dict:
    """The event logged before a stage's first update, which XLA compiles first (silent otherwise:
    tens of seconds for a 0.5B model on a GPU, minutes on a CPU)."""
    return {"stage": stage, "event": "compiling", "step": step, "note": "the first update compiles first (XLA)"}


def _loop(state, batches, mesh, steps, one, stage, checkpointer, log):
    for index in range(steps):
        tb = next(batches)
        require_agent_tokens(tb, stage)
        if index == 0:
            log(compiling_notice(stage, int(jax.device_get(state.step))))
        state, metrics = one(state, to_device(tb, mesh))
        step = int(jax.device_get(state.step))
        record = {"stage": stage, "step": step, **_floats(metrics), "truncated_trajectories": int(np.asarray(tb.truncated_b).sum())}
        require_finite_loss(record, stage, step)
        log(record)
        if checkpointer is not None and checkpointer.should_save(step):
            checkpointer.save(state, {"stage": stage, **batches.current_position()})
    return state


# ---- PPO ----------------------------------------------------------------------------------


@dataclasses.dataclass
class PPOStates:
    actor: TrainState
    critic: TrainState


def ppo_rollout_inputs(actor: TrainState, critic: TrainState, tb: TrajectoryBatch, cfg: RunConfig,
                       objective: ActorObjective) -> tuple[PolicyBatch, ValueBatch, dict[str, jax.Array]]:
    """Everything PPO needs from one rollout batch, before any update: old log-probs recomputed by the
    trainer, values, GAE advantages (whitened if configured), truncated IS weights, and the
    sampler-vs-trainer diagnostics (ratio = p_trainer / p_sampler, bucketed by the trainer's probability).
    With `ppo.old_logprobs: rollout`, pi_old is the sampler's log-probs instead (ablation). Pure; jit it."""
    ppo = cfg.ppo
    mask_bt = tb.action_mask_bt
    old_logp_bt, entropy_bt = policy_logprobs(actor.module(), _policy_batch(tb), objective)
    values_bt = critic.module()(tb.tokens_bt, tb.positions_bt, tb.segment_ids_bt)
    rewards_bt, advantages_bt, returns_bt = value_targets(values_bt, tb, ppo)
    if ppo.whiten_advantages:
        advantages_bt = whiten_advantages(advantages_bt, mask_bt)
    rollout_logp_bt = tb.rollout_action_logprobs_bt
    trainer_logp_bt = old_logp_bt
    diagnostics = rollout_mismatch_metrics(trainer_logp_bt, rollout_logp_bt, mask_bt, ppo.tis_cap or float("inf"))
    ratio_bt = jnp.exp(jnp.clip(trainer_logp_bt - rollout_logp_bt, -20.0, 20.0))
    buckets = ratio_stats_by_probability(ratio_bt, jnp.exp(trainer_logp_bt), mask_bt, ppo.clip_low, ppo.clip_high)
    if ppo.old_logprobs == "rollout":
        old_logp_bt = rollout_logp_bt * mask_bt
        weights_bt = None
    else:
        weights_bt = truncated_is_weights(old_logp_bt, rollout_logp_bt, ppo.tis_cap) if ppo.tis_cap is not None else None
    diagnostics.update({f"ratio_bucket_{k}": v for k, v in buckets.items()})
    diagnostics["reward_mean"] = jnp.mean(tb.reward_b)
    diagnostics["old_entropy"] = jnp.sum(entropy_bt * mask_bt) / jnp.maximum(jnp.sum(mask_bt), 1.0)
    policy = _policy_batch(tb, old_logp_bt=old_logp_bt, advantages_bt=advantages_bt, token_weights_bt=weights_bt)
    value = ValueBatch(tokens_bt=tb.tokens_bt, positions_bt=tb.positions_bt, segment_ids_bt=tb.segment_ids_bt,
                       action_mask_bt=mask_bt, returns_bt=returns_bt,
                       old_values_bt=values_bt if ppo.value_clip is not None else None)
    return policy, value, diagnostics


def _rollout_inputs_on_mesh(actor, critic, tb, *, mesh, cfg, objective):
    with mesh_scope(mesh):  # the attention kernels lay themselves over the mesh
        return ppo_rollout_inputs(actor, critic, tb, cfg, objective)


def take_rows(tree: Any, start: int, stop: int) -> Any:
    return jax.tree.map(lambda x: x[start:stop], tree)


@dataclasses.dataclass
class PPOUpdater:
    """PPO's compiled functions for batches of `rows` trajectories, built once and reused by every
    iteration (a new jit wrapper per iteration would compile again each time)."""

    cfg: RunConfig
    mesh: Any
    rows: int
    mini: int
    actor_step: Callable
    critic_step: Callable
    prepare: Callable

    @classmethod
    def build(cls, states: PPOStates, cfg: RunConfig, mesh, rows: int) -> "PPOUpdater":
        mini = min(cfg.ppo.mini_batch_size, rows)
        if rows % mini:
            raise StageError(f"rollout batch of {rows} rows is not a multiple of ppo.mini_batch_size={mini}")
        objective = actor_objective(cfg, "ppo", mini)
        return cls(cfg, mesh, rows, mini, make_actor_step(states.actor, objective, mesh),
                   make_critic_step(states.critic, critic_objective(cfg, mini), mesh),
                   jax.jit(functools.partial(_rollout_inputs_on_mesh, mesh=mesh, cfg=cfg, objective=objective)))

    def update(self, states: PPOStates, host_tb: TrajectoryBatch,
               observe: Callable[[TrainState, PolicyBatch], None] | None = None) -> tuple[PPOStates, dict[str, Any]]:
        """One PPO iteration on one rollout batch: `ppo.epochs` passes of mini-batches, an actor and a
        critic update per mini-batch. -> (states, the metrics of every update averaged).

        observe(actor, mini-batch), when given, sees each mini-batch and the actor about to take it
        (before the step, which donates the actor's arrays)."""
        cfg, mesh, mini = self.cfg, self.mesh, self.mini
        require_agent_tokens(host_tb, "ppo")
        tb = to_device(host_tb, mesh)
        policy, value, diagnostics = self.prepare(states.actor, states.critic, tb)
        record = {"stage": "ppo", **{f"rollout/{k}": v for k, v in _floats(diagnostics).items()}}
        record["rollout/truncated_trajectories"] = int(np.asarray(host_tb.truncated_b).sum())
        actor_updates, critic_updates = [], []
        for _epoch in range(cfg.ppo.epochs):
            for start in range(0, self.rows, mini):
                pb = _constrain(take_rows(policy, start, start + mini), mesh)
                vb = _constrain(take_rows(value, start, start + mini), mesh)
                if observe is not None:
                    observe(states.actor, pb)
                states.actor, actor_metrics = self.actor_step(states.actor, pb)
                states.critic, critic_metrics = self.critic_step(states.critic, vb)
                actor_updates.append(_floats(actor_metrics))
                critic_updates.append(_floats(critic_metrics))
                step = int(jax.device_get(states.actor.step))
                require_finite_loss(actor_updates[-1], "ppo actor", step)
                require_finite_loss(critic_updates[-1], "ppo critic", step)
        record.update({f"actor/{k}": v for k, v in average_metrics(actor_updates).items()})
        record.update({f"critic/{k}": v for k, v in average_metrics(critic_updates).items()})
        record["step"] = int(jax.device_get(states.actor.step))
        return states, record


def run_ppo(states: PPOStates, batches: BatchIterator, cfg: RunConfig, mesh, steps: int,
            checkpointers: tuple[Any, Any] | None = None, log: Log = lambda record: None) -> PPOStates:
    """`steps` PPO iterations over batches of stored trajectories (see PPOUpdater.update)."""
    updater = PPOUpdater.build(states, cfg, mesh, batches.batch_size)
    for index in range(steps):
        if index == 0:
            log(compiling_notice("ppo", int(jax.device_get(states.actor.step))))
        states, record = updater.update(states, next(batches))
        log(record)
        if checkpointers is not None:
            actor_ck, critic_ck = checkpointers
            if actor_ck.should_save(record["step"]):
                position = {"stage": "ppo", **batches.current_position()}
                actor_ck.save(states.actor, position)
                critic_ck.save(states.critic, position)
    return states


def _constrain(tree: Any, mesh) -> Any:
    """Re-place a slice of a batch on the batch sharding (slicing rows can leave it uneven)."""
    return jax.tree.map(lambda x: jax.device_put(x, batch_sharding(mesh, x.ndim)), tree)


