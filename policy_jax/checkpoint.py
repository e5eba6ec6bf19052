"""Orbax checkpoints of a TrainState (parameters, optimiser state, step) plus the data position.

Layout under the run's checkpoint directory: one folder per step with an item `state` (the
arrays, restored straight into the shardings of a template state) and an item `data` (JSON: where
the data iterator stands, and anything else the driver wants back on resume).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from policy_jax.train_state import TrainState


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be restored (one clear line for the user)."""


def _arrays_of(state: TrainState) -> dict[str, Any]:
    return {"step": state.step, "params": state.params, "opt_state": state.opt_state, "rest": state.rest}


def non_finite_leaves(tree: Any) -> list[str]:
    """The paths of the floating-point leaves of `tree` that hold a NaN or an infinity."""
    bad = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        if jnp.issubdtype(jnp.result_type(leaf), jnp.floating) and not bool(jnp.all(jnp.isfinite(leaf))):
            bad.append(jax.tree_util.keystr(path))
    return bad


def _abstract_arrays_of(state: TrainState) -> dict[str, Any]:
    """Shapes, dtypes and shardings of `state`'s arrays: the target a restore fills."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), _arrays_of(state)
    )


def _first_few(paths: list[str], n: int = 3) -> str:
    return ", ".join(paths[:n]) + (f" and {len(paths) - n} more" if len(paths) > n else "")


def _leaf_name(entry) -> str:
    """A path entry's name: dict keys, sequence indices and attribute names alike (Orbax saves all
    three as dict keys)."""
    for field in ("key", "idx", "name"):
        if hasattr(entry, field):
            return str(getattr(entry, field))
    return str(entry)


def _flat(tree) -> dict[str, Any]:
    return {"/".join(_leaf_name(e) for e in path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def shape_mismatches(wanted: Any, saved: Any) -> list[str]:
    """The leaves both trees name whose saved shape or dtype differs from the wanted one.

    Leaves only one side names are left to Orbax, which refuses a different structure before it
    reads anything; a different shape it finds only while reading, and leaves the other reads
    pending when it fails."""
    need, have = _flat(wanted), _flat(saved)
    problems = []
    for key in sorted(need.keys() & have.keys()):
        a, b = need[key], have[key]
        if tuple(a.shape) != tuple(b.shape) or jnp.dtype(a.dtype) != jnp.dtype(b.dtype):
            problems.append(f"{key}: saved {tuple(b.shape)} {jnp.dtype(b.dtype)}, wanted {tuple(a.shape)} {jnp.dtype(a.dtype)}")
    return problems


class TrainCheckpointer:
    """Save and restore TrainStates under `directory` (local path or gs://), keeping the last `max_to_keep`."""

    def __init__(self, directory: str | Path, max_to_keep: int = 3, save_every: int = 1):
        directory = str(directory)
        if "://" not in directory:
            directory = str(Path(directory).expanduser().resolve())
        self.directory = directory
        self.save_every = save_every
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
        self._manager = ocp.CheckpointManager(directory, options=options, item_names=("state", "data"))

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def should_save(self, step: int) -> bool:
        return self.save_every > 0 and step % self.save_every == 0

    def save(self, state: TrainState, data_position: dict[str, Any] | None = None, *, wait: bool = True) -> int:
        """Write `state` under its step number; returns the step. `data_position` must be JSON-serialisable.
        Raises CheckpointError, writing nothing, when a parameter is NaN or infinite."""
        step = int(jax.device_get(state.step))
        bad = non_finite_leaves(state.params)
        if bad:
            raise CheckpointError(f"step {step}: not saved, non-finite parameters in {_first_few(bad)}")
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(_arrays_of(state)),
            data=ocp.args.JsonSave(dict(data_position or {})),
        )
        self._manager.save(step, args=args, force=True)
        if wait:
            self._manager.wait_until_finished()
        return step

    def restore(self, template: TrainState, step: int | None = None) -> tuple[TrainState, dict[str, Any]]:
        """Restore into the shapes and shardings of `template` (a freshly created state of the same model
        and optimiser); `step` defaults to the latest. Returns the state and the saved data position."""
        if step is None:
            step = self.latest_step()
            if step is None:
                raise CheckpointError(f"no checkpoint in {self.directory}")
        elif step not in self.all_steps():
            raise CheckpointError(f"no checkpoint for step {step} in {self.directory} (have {self.all_steps()})")
        wanted = _abstract_arrays_of(template)
        mismatches = shape_mismatches(wanted, self._manager.item_metadata(step)["state"])
        if mismatches:
            raise CheckpointError(f"checkpoint step {step} in {self.directory} does not fit this model/optimiser: "
                                  f"{_first_few(mismatches)}")
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(wanted),
            data=ocp.args.JsonRestore(),
        )
        try:
            restored = self._manager.restore(step, args=args)
        except (ValueError, KeyError, TypeError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CheckpointError(f"checkpoint step {step} in {self.directory} does not fit this model/optimiser: {first}") from None
        arrays = restored["state"]
        bad = non_finite_leaves(arrays["params"])
        if bad:
            raise CheckpointError(f"checkpoint step {step} in {self.directory} holds non-finite parameters "
                                  f"({_first_few(bad)}); delete it or resume from an earlier step")
        state = template.replace(
            step=arrays["step"], params=arrays["params"], opt_state=arrays["opt_state"], rest=arrays["rest"]
        )
        return state, dict(restored["data"] or {})

    def data(self, step: int) -> dict[str, Any]:
        """The data position saved with `step`, without reading its arrays."""
        restored = self._manager.restore(step, args=ocp.args.Composite(data=ocp.args.JsonRestore()))
        return dict(restored["data"] or {})

    def delete(self, step: int) -> None:
        self._manager.delete(step)

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> "TrainCheckpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
