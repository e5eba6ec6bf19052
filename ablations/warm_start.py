"""The starting points of the arms: the starting checkpoint (random, from `run.train.seed`), and from it
the RFT actor and the value-pretrained critics, each computed once and shared by every arm and seed."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from ablations.config import AblationConfig, AblationConfigError, Arm
from ablations.engines import Engines, host_params
from ablations.rollout import sample_episodes
from policy_jax.stages import BatchIterator, rft_filter, run_rft, run_value_pretraining, trainable_rows

WARM_START_SEED = 10**6  # the warm start's rollouts never share a seed with an arm's


@dataclasses.dataclass
class StartingPoint:
    actor: Any  # host parameters
    critic: Any


def _pool(cfg: AblationConfig, engines: Engines, actor_params, salt: int):
    actor = engines.state("actor", cfg.run, actor_params)
    problems = cfg.task.problems(np.random.default_rng([WARM_START_SEED, salt]), cfg.warm_start.episodes)
    precision = Arm("warm_start", cfg.warm_start.sampler_head).sampler_logits_precision
    s = cfg.run.sampling
    return sample_episodes(actor.module(), problems, cfg.task, precision, WARM_START_SEED + salt,
                           s.temperature, s.top_k, s.top_p)


def _batches(cfg: AblationConfig, rows) -> BatchIterator:
    size = min(cfg.run.ppo.mini_batch_size, cfg.run.train.global_batch_size)
    return BatchIterator(rows, batch_size=size, seq_len=cfg.run.train.seq_len, seed=WARM_START_SEED)


def _rft(cfg: AblationConfig, engines: Engines, base_actor, say: Callable[[str], None]):
    pool = _pool(cfg, engines, base_actor, 0)
    kept, rejected = rft_filter(pool.rows, cfg.run.rft)
    say(f"warm start: {len(pool.rows)} episodes from the starting checkpoint, reward mean {pool.reward_mean:.3f}, "
        f"RFT keeps {len(kept)}")
    if not kept:
        raise AblationConfigError(f"warm start: no episode of {len(pool.rows)} has reward > {cfg.run.rft.min_reward}; "
                                  f"raise warm_start.episodes or drop the rft_init arms")
    state = run_rft(engines.state("actor", cfg.run, base_actor), _batches(cfg, kept), cfg.run, engines.mesh,
                    cfg.warm_start.rft_steps)
    return host_params(state)


def _value(cfg: AblationConfig, engines: Engines, actor, base_critic, say: Callable[[str], None], salt: int):
    pool = _pool(cfg, engines, actor, salt)
    say(f"warm start: value pretraining on {len(pool.rows)} episodes (reward mean {pool.reward_mean:.3f})")
    state = run_value_pretraining(engines.state("critic", cfg.run, base_critic),
                                  _batches(cfg, trainable_rows(pool.rows)), cfg.run, engines.mesh,
                                  cfg.warm_start.value_steps)
    return host_params(state)


def starting_points(cfg: AblationConfig, engines: Engines,
                    say: Callable[[str], None]) -> dict[tuple[bool, bool], StartingPoint]:
    """{(rft_init, value_pretraining): StartingPoint} for the combinations the arms use."""
    base = {kind: host_params(engines.state(kind, cfg.run, None)) for kind in ("actor", "critic")}
    needed = sorted({(a.rft_init, a.value_pretraining) for a in cfg.arms})
    actors = {False: base["actor"]}
    if any(rft for rft, _ in needed):
        actors[True] = _rft(cfg, engines, base["actor"], say)
    points = {}
    for rft, value in needed:
        critic = _value(cfg, engines, actors[rft], base["critic"], say, 1 + int(rft)) if value else base["critic"]
        points[(rft, value)] = StartingPoint(actors[rft], critic)
    return points
