"""Run every arm for every seed from the shared starting points; one JSON line per arm, seed and iteration.

Output folder: `ablation.json` (the config as given), `iterations.jsonl` (appended as the run goes),
`checkpoints/` (ablations.checkpoints), `report.md` and its plots (ablations.report). Running again on
the folder resumes: finished arms are skipped, the one in progress continues from its last checkpoint.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ablations import record as rec
from ablations.checkpoints import ArmCheckpoints, arm_dir, load_starting_points, save_starting_points
from ablations.config import AblationConfig, Arm
from ablations.engines import Engines, UpdateObserver
from ablations.resume import Records, finished, records_in_line
from ablations.rollout import sample_episodes
from ablations.run_folder import RunFolder, locked, open_folder
from ablations.statistics import length_clip_ratio
from ablations.stopping import StopSignals, Stopped

Say = Callable[[str], None]


@dataclasses.dataclass
class Position:
    """Where the run stands, for the line a stop prints."""

    text: str = "before the first arm"

    def arm(self, arm: Arm, seed: int, saved: int, iterations: int) -> None:
        self.text = f"in arm {arm.name} seed {seed} with {saved}/{iterations} iterations saved"


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


def _commit(folder: RunFolder, saved: ArmCheckpoints | None, states, record: dict) -> str | None:
    """The iteration's checkpoint (none when `saved` is None), then its record. Non-finite parameters cannot
    be saved: the record is appended with a `stopped` line for the next iteration. -> that line's reason,
    or None."""
    from policy_jax.checkpoint import CheckpointError

    index = record["iteration"]
    try:
        if saved is not None:
            saved.save(states, index + 1, record)
    except CheckpointError as e:
        reason = f"non-finite parameters after iteration {index + 1} ({e})"
        folder.append(record, {"arm": record["arm"], "seed": record["seed"], "iteration": index + 1, "stopped": reason})
        return reason
    folder.append(record)
    return None


@dataclasses.dataclass
class ArmRun:
    """One arm and seed: its iterations from its last checkpoint (none: from the starting point), each
    record appended as it ends; the states saved every `checkpoint_every` iterations and after the last."""

    cfg: AblationConfig
    arm: Arm
    seed: int
    engines: Engines
    folder: RunFolder
    signals: StopSignals
    position: Position
    say: Say
    saved_iterations: int = 0  # what the arm's latest checkpoint holds

    def __call__(self, start) -> None:
        from policy_jax.stages import PPOStates

        cfg, arm, seed, run = self.cfg, self.arm, self.seed, self.cfg.arm_run_config(self.arm)
        fresh = PPOStates(actor=self.engines.state("actor", run, start.actor),
                          critic=self.engines.state("critic", run, start.critic))
        with ArmCheckpoints(arm_dir(self.folder.checkpoints, arm, seed)) as saved:
            with self.signals.held():
                states, done = saved.restore(fresh)
            self.saved_iterations = done
            if done:
                self.say(f"resuming: arm {arm.name} seed {seed} from iteration {done + 1}/{cfg.iterations}")
            for index in range(done, cfg.iterations):
                self.position.arm(arm, seed, self.saved_iterations, cfg.iterations)
                states, stopped = self._iteration(run, index, states, saved)
                if stopped:
                    self.say(f"[{arm.name} seed {seed}] {stopped}")
                    return

    def _iteration(self, run, index: int, states, saved: ArmCheckpoints):
        """-> (states, why the arm stopped or None)."""
        from policy_jax.stages import StageError

        cfg, arm, seed = self.cfg, self.arm, self.seed
        try:
            states, record = run_iteration(cfg, arm, run, seed, index, states, self.engines)
        except StageError as e:
            if "non-finite" not in str(e):
                raise
            with self.signals.held():
                self.folder.append({"arm": arm.name, "seed": seed, "iteration": index, "stopped": str(e)})
            return states, f"stopped at iteration {index + 1}: {e}"
        with self.signals.held():
            last = index + 1 == cfg.iterations
            due = last or (index + 1) % cfg.checkpoint_every == 0
            reason = _commit(self.folder, saved if due else None, states, rec.json_ready(record))
            if last:
                saved.keep_last()
            if due and reason is None:
                self.saved_iterations = index + 1
            self.position.arm(arm, seed, self.saved_iterations, cfg.iterations)
        self.say(_progress(arm, seed, record, cfg.iterations))
        return states, reason and f"stopped after iteration {index + 1}: {reason}"


_ENGINES: dict[tuple, Engines] = {}  # the latest run's compiled pieces, kept for the next run in this process


def _shared_engines(run, devices, total_steps: int) -> Engines:
    """The compiled pieces for `run` on `devices`. The latest are kept: running again in the same process
    with the same run settings (a resume, another seed list, a test) traces and compiles nothing again."""
    import jax

    from policy_jax.sharding import make_mesh

    devices = list(devices if devices is not None else jax.devices())
    key = (repr(run), tuple((d.platform, d.id) for d in devices), total_steps)
    if key not in _ENGINES:
        _ENGINES.clear()  # one set at a time: their states hold a copy of the model
        _ENGINES[key] = Engines(make_mesh(run.mesh, devices), total_steps=total_steps)
    return _ENGINES[key]


def _engines_and_points(cfg: AblationConfig, folder: RunFolder, devices, signals: StopSignals, position: Position,
                        say: Say):
    """The compiled pieces, and the starting points: read back when saved, else computed and saved."""
    from ablations.warm_start import starting_points

    updates = cfg.run.ppo.epochs * cfg.run.train.global_batch_size // min(cfg.run.ppo.mini_batch_size,
                                                                          cfg.run.train.global_batch_size)
    engines = _shared_engines(cfg.run, devices, max(1, cfg.iterations * updates))
    keys = sorted({(a.rft_init, a.value_pretraining) for a in cfg.arms})
    with signals.held():
        points = load_starting_points(folder.checkpoints, keys, engines, cfg.run)
    if points is not None:
        say(f"warm start: the starting points saved in {folder.checkpoints / 'start'}")
        return engines, points
    position.text = "during the warm start"
    points = starting_points(cfg, engines, say)
    with signals.held():
        save_starting_points(folder.checkpoints, points, engines, cfg.run)
    return engines, points


def _run_arms(cfg: AblationConfig, folder: RunFolder, records: Records, devices, signals: StopSignals,
              position: Position, say: Say) -> None:
    setup = None
    for number, arm in enumerate(cfg.arms, 1):
        for seed in cfg.seeds:
            label = f"arm {number}/{len(cfg.arms)} {arm.name} seed {seed}"
            if finished(records.get((arm.name, seed), []), cfg.iterations):
                say(f"{label}: finished, skipped")
                continue
            position.text = f"before {label}"
            engines, points = setup = setup or _engines_and_points(cfg, folder, devices, signals, position, say)
            say(f"{label}: {arm.settings()}")
            start = points[(arm.rft_init, arm.value_pretraining)]
            ArmRun(cfg, arm, seed, engines, folder, signals, position, say)(start)


def _open(cfg: AblationConfig, out_dir: str | Path, resume: bool, say: Say) -> tuple[RunFolder, Records]:
    folder, resuming = open_folder(cfg, out_dir, resume)
    records = records_in_line(folder, cfg, say) if resuming else {}
    say(f"ablation {cfg.name}: {len(cfg.arms)} arms x {len(cfg.seeds)} seeds x {cfg.iterations} iterations "
        f"-> {folder.path}")
    if resuming:
        done = sum(finished(r, cfg.iterations) for r in records.values())
        say(f"resuming the run in {folder.path}: {done} of {len(records)} arm runs finished")
    return folder, records


def run_ablation(cfg: AblationConfig, out_dir: str | Path, say: Say = print, devices: list | None = None,
                 resume: bool = True, report: bool = True) -> Path:
    """Every arm x seed for cfg.iterations iterations; returns the output folder. A run the folder holds
    continues (`resume`; a run of another config is refused), else a new one starts. SIGTERM or Ctrl-C
    raises Stopped, saying where the run stopped; what it saved stays."""
    position = Position()
    with locked(out_dir), StopSignals() as signals:
        try:
            with signals.held():
                folder, records = _open(cfg, out_dir, resume, say)
            _run_arms(cfg, folder, records, devices, signals, position, say)
            if report:
                from ablations.report import write_report

                position.text = "while writing the report"
                say(f"report: {write_report(folder.path)}")
        except Stopped as stop:
            raise Stopped(f"{stop} {position.text}; run the same command again to resume") from None
    return folder.path
