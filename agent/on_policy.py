"""The on-policy loop: the actor plays episodes with its current weights, then PPO updates it.

One iteration:
1. a sampler over the actor's weights, handed over in memory (no checkpoint file between them),
   plays `train.global_batch_size` episodes through the agent loop, with evaluations through
   the bridge;
2. each trajectory records the version of the actor that produced it (the number of PPO
   updates behind it);
3. the critic and the actor take one PPO step on those trajectories (`ppo.epochs` passes of
   `ppo.mini_batch_size` rows), scoring them at the sampler's temperature (`sampling`).
Rollout and training alternate: every trajectory of an iteration comes from the current actor,
so nothing is stale. Overlapping them is not done yet.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from agent.config import AgentConfig
from agent.episode import Task, run_episodes
from agent.loop_metrics import iteration_metrics
from agent.policy_jax_backend import model_sampler_policy
from agent.trajectory import episode_row


@dataclasses.dataclass
class Iteration:
    """What one iteration did: its episodes' rows (each with `actor_version`) and its timings."""

    index: int
    rows: list[dict[str, Any]]
    rollout_s: float
    train_s: float
    record: dict[str, Any]


def _episode_tasks(tasks: Sequence[Task], count: int) -> list[Task]:
    return [tasks[i % len(tasks)] for i in range(count)]


def run_on_policy(cfg, agent_cfg: AgentConfig, tasks: Sequence[Task], tokenizer, gateway, iterations: int,
                  episodes_dir: str | Path, *, init_from: str | None = None, concurrency: int = 8,
                  log: Callable[[dict[str, Any]], None] = lambda record: None,
                  before_rollout: Callable[[int, Any], None] | None = None, devices: list | None = None):
    """`iterations` on-policy PPO iterations from a fresh (or `init_from`) actor and critic.

    cfg: a policy_jax RunConfig; gateway: the evaluator (a bridge client); before_rollout(index,
    actor state) is called as each iteration starts; devices: the trainer's (default: all).
    Returns the final (actor, critic) states and the Iteration of each round.
    """
    from policy_jax.sharding import make_mesh
    from policy_jax.stages import BatchIterator, PPOStates, PPOUpdater, compiling_notice, trainable_rows
    from policy_jax.train_run import new_state

    if not tasks:
        raise ValueError("no tasks to play")
    mesh = make_mesh(cfg.mesh, devices)
    states = PPOStates(actor=new_state("actor", cfg, mesh, init_from, iterations),
                       critic=new_state("critic", cfg, mesh, init_from, iterations))
    episodes = cfg.train.global_batch_size
    updater = PPOUpdater.build(states, cfg, mesh, episodes)  # compiled once, for every iteration
    done: list[Iteration] = []
    for index in range(iterations):
        version = int(states.actor.step)
        if before_rollout is not None:
            before_rollout(index, states.actor)
        policy = model_sampler_policy(states.actor.module(), tokenizer, seed=cfg.train.seed + index, **dataclasses.asdict(cfg.sampling))
        log({"event": "rollout", "iteration": index, "actor_version": version, "episodes": episodes})
        begin = time.perf_counter()
        results = asyncio.run(run_episodes(_episode_tasks(tasks, episodes), lambda task, i: policy, tokenizer, agent_cfg, gateway,
                                           Path(episodes_dir) / f"iteration-{index:04d}", concurrency=concurrency,
                                           salt_per_episode=True))
        rollout_s = time.perf_counter() - begin
        rows = [{**episode_row(r), "actor_version": version} for r in results]
        usable = trainable_rows(rows)
        if not usable:
            raise RuntimeError(f"iteration {index}: every episode was an infrastructure failure; nothing to train on")
        if index == 0:
            log({**compiling_notice("ppo", version), "iteration": index})
        begin = time.perf_counter()
        batch = next(BatchIterator(usable, batch_size=episodes, seq_len=cfg.train.seq_len, seed=cfg.train.seed + index))
        states, ppo_record = updater.update(states, batch)
        train_s = time.perf_counter() - begin
        trained_tokens = int(np.count_nonzero(np.asarray(batch.segment_ids_bt)))
        record = {**ppo_record, **iteration_metrics(results, rows, rollout_s, train_s, trained_tokens),
                  "iteration": index, "actor_version": version, "rollout_s": round(rollout_s, 2),
                  "train_s": round(train_s, 2), "episodes": len(rows), "infrastructure_failures": len(rows) - len(usable)}
        log(record)
        done.append(Iteration(index, rows, rollout_s, train_s, record))
    return states, done
