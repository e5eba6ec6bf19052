"""The compiled pieces the arms share: PPO updaters per PPO setting, the trainer's log-probs per head
precision, and fresh train states holding given parameters. Built once, reused by every arm and seed."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import numpy as np

from policy_jax.attention_dispatch import mesh_scope
from policy_jax.rl.batch import TrajectoryBatch
from policy_jax.stages import PPOStates, PPOUpdater, actor_objective, critic_objective, to_device
from policy_jax.train_run import new_state
from policy_jax.train_state import TrainState, opt_state_shardings
from policy_jax.train_steps import PolicyBatch, policy_logprobs


def host_params(state: TrainState) -> Any:
    """A host copy of a state's parameters (the training steps donate the arrays they are given)."""
    return jax.tree.map(np.array, state.params)


def _logprobs_on_mesh(actor: TrainState, batch: PolicyBatch, *, mesh, objective):
    with mesh_scope(mesh):
        return policy_logprobs(actor.module(), batch, objective)[0]


@dataclasses.dataclass
class Engines:
    mesh: Any
    total_steps: int
    _templates: dict = dataclasses.field(default_factory=dict)
    _steps: dict = dataclasses.field(default_factory=dict)
    _updaters: dict = dataclasses.field(default_factory=dict)
    _logprobs: dict = dataclasses.field(default_factory=dict)

    def _template(self, kind: str, run) -> tuple[TrainState, Any, Any, Callable]:
        """The starting checkpoint's state (compiled once), its host parameters and rest, and a jitted
        optimiser init."""
        if kind not in self._templates:
            state = new_state(kind, run, self.mesh, None, self.total_steps)
            shape = jax.eval_shape(state.tx.init, state.params)
            init = jax.jit(state.tx.init, out_shardings=opt_state_shardings(shape, state.params, self.mesh))
            self._templates[kind] = (state, host_params(state), jax.tree.map(np.array, state.rest), init)
        return self._templates[kind]

    def state(self, kind: str, run, params: Any) -> TrainState:
        """A fresh train state (new optimiser, step 0) of the actor or critic holding `params` (host arrays;
        None: the starting checkpoint, initialised from `run.train.seed`)."""
        template, start, rest, init = self._template(kind, run)
        place = functools.partial(jax.tree.map, lambda t, p: jax.device_put(p, t.sharding))
        placed = place(template.params, start if params is None else params)
        step = jax.device_put(np.zeros((), np.int32), template.step.sharding)
        return template.replace(step=step, params=placed, opt_state=init(placed), rest=place(template.rest, rest))

    def _step(self, key: Any, build: Callable) -> Callable:
        if key not in self._steps:
            self._steps[key] = build()
        return self._steps[key]

    def updater(self, run, states: PPOStates) -> PPOUpdater:
        """PPO's compiled functions for `run`: the actor step shared by arms of one objective, the critic
        step by every arm, the rollout preparation per PPO setting."""
        key = repr(run.ppo)
        if key not in self._updaters:
            rows = run.train.global_batch_size
            built = PPOUpdater.build(states, run, self.mesh, rows)
            objective = actor_objective(run, "ppo", built.mini)
            actor_step = self._step(("actor", objective), lambda: built.actor_step)
            critic_step = self._step(("critic", critic_objective(run, built.mini)), lambda: built.critic_step)
            self._updaters[key] = dataclasses.replace(built, actor_step=actor_step, critic_step=critic_step)
        return self._updaters[key]

    def logprobs_fn(self, run, precision: str):
        """jitted (actor, PolicyBatch) -> the trainer's log-probs [B, T] with an FP32 or bf16 head."""
        objective = dataclasses.replace(actor_objective(run, "ppo", run.train.global_batch_size),
                                        logprob_precision=precision, num_micro_batches=1)
        if objective not in self._logprobs:
            fn = functools.partial(_logprobs_on_mesh, mesh=self.mesh, objective=objective)
            self._logprobs[objective] = jax.jit(fn)
        return self._logprobs[objective]

    def trainer_logprobs(self, run, actor: TrainState, host_tb: TrajectoryBatch, precision: str = "fp32") -> np.ndarray:
        tb = to_device(host_tb, self.mesh)
        batch = PolicyBatch(tokens_bt=tb.tokens_bt, positions_bt=tb.positions_bt, segment_ids_bt=tb.segment_ids_bt,
                            action_mask_bt=tb.action_mask_bt)
        return np.asarray(self.logprobs_fn(run, precision)(actor, batch))


class UpdateObserver:
    """Collects, for every PPO mini-batch, the agent tokens' current and old log-probs and advantages."""

    def __init__(self, logprobs_fn):
        self.logprobs_fn = logprobs_fn
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def __call__(self, actor: TrainState, batch: PolicyBatch) -> None:
        mask = np.asarray(batch.action_mask_bt) > 0
        logp = np.asarray(self.logprobs_fn(actor, batch))
        self.parts.append((logp[mask], np.asarray(batch.old_logp_bt)[mask], np.asarray(batch.advantages_bt)[mask]))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not self.parts:
            return np.zeros(0), np.zeros(0), np.zeros(0)
        return tuple(np.concatenate(column) for column in zip(*self.parts))
