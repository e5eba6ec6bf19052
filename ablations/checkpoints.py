"""The checkpoints that make a run resumable, written with policy_jax's TrainCheckpointer (Orbax):

    <out>/checkpoints/start/<start>/{actor,critic}         the starting points (step 0), saved after the warm start
    <out>/checkpoints/arms/<arm>/seed-<seed>/{actor,critic}  an arm's states after each of its iterations

An arm's checkpoint carries, as its data, the number of iterations done and the last one's record. The
actor is saved before the critic, and a resume restores the latest step both hold, so the two always
come from one iteration. An iteration's randomness (its problems, the sampler's seed, the mini-batch
order) follows from the seed and the iteration's index: the states (parameters, optimiser state, step,
RNG variables) and that number are all a resume needs.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ablations.config import Arm
from ablations.engines import Engines, host_params
from ablations.warm_start import StartingPoint
from policy_jax.checkpoint import TrainCheckpointer
from policy_jax.stages import PPOStates

ROLES = ("actor", "critic")
KEEP = 2  # the step before the last survives a stop between the actor's save and the critic's


def arm_dir(root: Path, arm: Arm, seed: int) -> Path:
    return root / "arms" / arm.name / f"seed-{seed}"


class ArmCheckpoints:
    """The actor's and the critic's checkpoints of one arm and seed."""

    def __init__(self, directory: Path):
        self.roles = {role: TrainCheckpointer(directory / role, max_to_keep=KEEP) for role in ROLES}

    def _common_step(self) -> int | None:
        steps = set.intersection(*(set(ck.all_steps()) for ck in self.roles.values()))
        return max(steps, default=None)

    def progress(self) -> tuple[int, dict[str, Any] | None]:
        """(iterations done, the last one's record) at the latest step both roles hold; (0, None) for none."""
        step = self._common_step()
        if step is None:
            return 0, None
        data = self.roles["critic"].data(step)
        return int(data["iterations"]), data["record"]

    def restore(self, fresh: PPOStates) -> tuple[PPOStates, int]:
        """The states at the latest step both roles hold, and the iterations done (`fresh` and 0 for none).
        A step only one role reached is deleted: that iteration runs again."""
        step = self._common_step()
        for ck in self.roles.values():
            for later in [s for s in ck.all_steps() if step is None or s > step]:
                ck.delete(later)
        if step is None:
            return fresh, 0
        (actor, data), (critic, _) = (self.roles[r].restore(getattr(fresh, r), step) for r in ROLES)
        return PPOStates(actor, critic), int(data["iterations"])

    def save(self, states: PPOStates, iterations: int, record: dict[str, Any]) -> None:
        """Raises policy_jax's CheckpointError, saving nothing more, when a state has non-finite parameters."""
        for role in ROLES:
            self.roles[role].save(getattr(states, role), {"iterations": iterations, "record": record})

    def keep_last(self) -> None:
        for ck in self.roles.values():
            for step in ck.all_steps()[:-1]:
                ck.delete(step)

    def close(self) -> None:
        for ck in self.roles.values():
            ck.close()

    def __enter__(self) -> "ArmCheckpoints":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def arm_progress(root: Path, arm: Arm, seed: int) -> tuple[int, dict[str, Any] | None]:
    directory = arm_dir(root, arm, seed)
    if not directory.is_dir():
        return 0, None
    with ArmCheckpoints(directory) as saved:
        return saved.progress()


def _start_dir(root: Path, key: tuple[bool, bool]) -> Path:
    rft, value = key
    return root / "start" / f"{'rft' if rft else 'no-rft'}.{'value' if value else 'no-value'}"


def save_starting_points(root: Path, points: dict[tuple[bool, bool], StartingPoint], engines: Engines, run) -> None:
    shutil.rmtree(root / "start", ignore_errors=True)
    for key, point in points.items():
        for role in ROLES:
            with TrainCheckpointer(_start_dir(root, key) / role, max_to_keep=1) as ck:
                ck.save(engines.state(role, run, getattr(point, role)))


def load_starting_points(root: Path, keys, engines: Engines, run) -> dict[tuple[bool, bool], StartingPoint] | None:
    """The saved starting points for `keys`; None unless every one of them was saved."""
    if not all((_start_dir(root, key) / role).is_dir() for key in keys for role in ROLES):
        return None
    points = {}
    for key in keys:
        params = {}
        for role in ROLES:
            with TrainCheckpointer(_start_dir(root, key) / role, max_to_keep=1) as ck:
                if ck.latest_step() is None:
                    return None
                params[role] = host_params(ck.restore(engines.state(role, run, None))[0])
        points[key] = StartingPoint(**params)
    return points
