"""Run every arm for every seed from the shared starting points; one JSON line per arm, seed and iteration.

Output folder: `ablation.json` (the config as given), `iterations.jsonl` (appended as the run goes),
`report.md` and its plots (ablations.report).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ablations import record as rec
from ablations.config import AblationConfig, AblationConfigError, Arm
from ablations.engines import Engines, UpdateObserver
from ablations.rollout import sample_episodes
from ablations.report_data import CONFIG_FILE, DATA_FILE
from ablations.statistics import length_clip_ratio

Say = Callable[[str], None]


def prepare_output(cfg: AblationConfig, out_dir: str | Path, overwrite: bool) -> Path:
    out = Path(out_dir)
    data = out / DATA_FILE
    if data.exists() and not overwrite:
        raise AblationConfigError(f"{data} exists; pass --overwrite or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    data.write_text("")
    (out / CONFIG_FILE).write_text(json.dumps(cfg.raw, indent=2, sort_keys=True, default=str) + "\n")
    return out


def _progress(arm: Arm, seed: int, record: dict[str, Any], iterations: int) -> str:
    def fmt(x):
        return "n/a" if x is None else f"{x:.3g}"

    m, u = record["mismatch"], record["update"]
    return (f"[{arm.name} seed {seed}] iteration {record['iteration'] + 1}/{iterations}  "
            f"reward {fmt(record['reward_mean'])}  mismatch outside clip {fmt(m['outside']['outside'])}  "
            f"ratio std {fmt(u['ratio']['std'])}  clipped low/high {fmt(u['clip']['low'])}/{fmt(u['clip']['high'])}  "
            f"explained var {fmt(record['explained_variance'])}  ({record['rollout_s'] + record['train_s']:.1f} s)")


def run_iteration(cfg: AblationConfig, arm: Arm, run, seed: int, index: int, states, engines: Engines):
    """Sample, measure the mismatch, update. -> (states, the iteration's record)."""
    from policy_jax.stages import BatchIterator

    episodes = run.train.global_batch_size
    begin = time.perf_counter()
    problems = cfg.task.problems(np.random.default_rng([seed, index]), episodes)
    s = run.sampling
    rollout = sample_episodes(states.actor.module(), problems, cfg.task, arm.sampler_logits_precision,
                              seed * 1_000_003 + index + 1, s.temperature, s.top_k, s.top_p)
    rollout_s = time.perf_counter() - begin
    begin = time.perf_counter()
    tb = next(BatchIterator(rollout.rows, batch_size=episodes, seq_len=run.train.seq_len, seed=seed * 7919 + index))
    mask = np.asarray(tb.action_mask_bt) > 0
    train_logp = engines.trainer_logprobs(run, states.actor, tb)[mask]
    rollout_logp = np.asarray(tb.rollout_action_logprobs_bt)[mask]
    observer = UpdateObserver(engines.logprobs_fn(run, run.ppo.logprob_precision))
    version = int(states.actor.step)
    states, ppo_record = engines.updater(run, states).update(states, tb, observe=observer)
    low, high = run.ppo.clip_low, run.ppo.clip_high
    record = {"arm": arm.name, "seed": seed, "iteration": index, "actor_version": version,
              "reward_mean": rollout.reward_mean, "exact_match": rollout.exact_match,
              "length_clip_ratio": length_clip_ratio(rollout.stopped),
              "mismatch": rec.mismatch_stats(train_logp, rollout_logp, low, high),
              "update": rec.update_stats(*observer.arrays(), low, high), **rec.from_ppo_record(ppo_record),
              "rollout_s": round(rollout_s, 3), "train_s": round(time.perf_counter() - begin, 3)}
    return states, record


def run_arm(cfg: AblationConfig, arm: Arm, seed: int, start, engines: Engines, write: Callable[[dict], None], say: Say):
    from policy_jax.stages import PPOStates, StageError

    run = cfg.arm_run_config(arm)
    states = PPOStates(actor=engines.state("actor", run, start.actor),
                       critic=engines.state("critic", run, start.critic))
    for index in range(cfg.iterations):
        try:
            states, record = run_iteration(cfg, arm, run, seed, index, states, engines)
        except StageError as e:
            if "non-finite" not in str(e):
                raise
            write({"arm": arm.name, "seed": seed, "iteration": index, "stopped": str(e)})
            say(f"[{arm.name} seed {seed}] stopped at iteration {index + 1}: {e}")
            return
        write(rec.json_ready(record))
        say(_progress(arm, seed, record, cfg.iterations))


def run_ablation(cfg: AblationConfig, out_dir: str | Path, say: Say = print, devices: list | None = None,
                 overwrite: bool = False, report: bool = True) -> Path:
    """Every arm x seed for cfg.iterations iterations; returns the output folder."""
    from ablations.warm_start import starting_points
    from policy_jax.sharding import make_mesh

    out = prepare_output(cfg, out_dir, overwrite)
    data = out / DATA_FILE

    def write(record: dict) -> None:
        with data.open("a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")

    updates = cfg.run.ppo.epochs * cfg.run.train.global_batch_size // min(cfg.run.ppo.mini_batch_size,
                                                                          cfg.run.train.global_batch_size)
    engines = Engines(make_mesh(cfg.run.mesh, devices), total_steps=max(1, cfg.iterations * updates))
    say(f"ablation {cfg.name}: {len(cfg.arms)} arms x {len(cfg.seeds)} seeds x {cfg.iterations} iterations -> {out}")
    points = starting_points(cfg, engines, say)
    for number, arm in enumerate(cfg.arms, 1):
        for seed in cfg.seeds:
            say(f"arm {number}/{len(cfg.arms)} {arm.name} seed {seed}: {arm.settings()}")
            run_arm(cfg, arm, seed, points[(arm.rft_init, arm.value_pretraining)], engines, write, say)
    if report:
        from ablations.report import write_report

        say(f"report: {write_report(out)}")
    return out
