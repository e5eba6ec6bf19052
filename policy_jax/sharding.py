"""Device mesh and the placement of parameters and batches on it.

Parameters carry logical axis names in their `logical_axes` metadata ("vocab", "embed", "mlp",
"q_heads", "kv_heads", "head_dim", "norm"); `LOGICAL_RULES` maps those names to the mesh axes
("data", "fsdp", "sequence", "tensor"). A dimension that the mesh axes do not divide evenly stays
replicated, so a model with 2 KV heads still places on a tensor axis of 4. No parameter uses the
"sequence" axis: it splits the tokens of each row for attention (context parallelism, see
policy_jax/attention_dispatch.py), and parameters are replicated over it.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Iterator, Mapping

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "sequence", "tensor")
BATCH_AXES = ("data", "fsdp")
SEQUENCE_AXIS = "sequence"
HEAD_AXIS = "tensor"

# logical axis -> mesh axis (or tuple of mesh axes, or None = replicated)
LOGICAL_RULES: dict[str, Any] = {
    "vocab": "tensor",
    "embed": "fsdp",
    "mlp": "tensor",
    "q_heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "norm": None,
    "batch": BATCH_AXES,
    "length": None,
}


class MeshConfigError(ValueError):
    """A mesh shape that does not fit the devices (one clear line for the user)."""


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh axis sizes; one of them may be -1, meaning "all remaining devices"."""

    data: int = 1
    fsdp: int = -1
    tensor: int = 1
    sequence: int = 1

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "MeshConfig":
        d = dict(d or {})
        unknown = sorted(set(d) - set(MESH_AXES))
        if unknown:
            raise MeshConfigError(f"unknown mesh axes: {', '.join(unknown)} (expected {MESH_AXES})")
        return cls(**{k: int(v) for k, v in d.items()})

    def resolve(self, num_devices: int) -> tuple[int, int, int]:
        """The (data, fsdp, tensor) sizes with -1 filled in (the sequence axis too: see `sizes`)."""
        sizes = self.sizes(num_devices)
        return sizes["data"], sizes["fsdp"], sizes["tensor"]

    def sizes(self, num_devices: int) -> dict[str, int]:
        """Every axis's size, in MESH_AXES order, with -1 filled in so that their product is `num_devices`."""
        sizes = [getattr(self, axis) for axis in MESH_AXES]
        if sum(s == -1 for s in sizes) > 1:
            raise MeshConfigError("at most one mesh axis may be -1")
        if any(s == 0 or s < -1 for s in sizes):
            raise MeshConfigError(f"mesh axis sizes must be positive or -1, got {sizes}")
        known = math.prod(s for s in sizes if s != -1)
        if -1 in sizes:
            if num_devices % known:
                raise MeshConfigError(f"{num_devices} devices cannot be split into mesh {sizes}")
            sizes[sizes.index(-1)] = num_devices // known
        if math.prod(sizes) != num_devices:
            raise MeshConfigError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices, have {num_devices}")
        return dict(zip(MESH_AXES, sizes))


def first_devices(count: int | None) -> list | None:
    """The first `count` devices, for a run that should not take all of them (None: None, every device)."""
    if count is None:
        return None
    available = jax.devices()
    if not 1 <= count <= len(available):
        raise MeshConfigError(f"--devices must be between 1 and {len(available)} (the devices there are), got {count}")
    return available[:count]


def make_mesh(config: MeshConfig | None = None, devices: list | None = None) -> Mesh:
    """A mesh with axes MESH_AXES over `devices` (default: all, every host)."""
    config = config or MeshConfig()
    devices = list(devices if devices is not None else jax.devices())
    shape = tuple(config.sizes(len(devices)).values())
    try:
        from jax.experimental import mesh_utils

        grid = mesh_utils.create_device_mesh(shape, devices=devices)
    except Exception:  # fake CPU devices or an odd topology: plain row-major order is fine
        grid = np.asarray(devices, dtype=object).reshape(shape)
    return Mesh(grid, MESH_AXES)


def logical_to_pspec(logical_axes: tuple[str | None, ...] | None, shape: tuple[int, ...], mesh: Mesh,
                     rules: Mapping[str, Any] = LOGICAL_RULES) -> PartitionSpec:
    """PartitionSpec for an array of `shape` whose dimensions are named `logical_axes`.

    A mesh axis is used at most once; a dimension not divisible by its mesh axes' size is replicated.
    """
    if not logical_axes:
        return PartitionSpec()
    if len(logical_axes) != len(shape):
        raise ValueError(f"logical axes {logical_axes} do not match shape {shape}")
    used: set[str] = set()
    spec = []
    for name, size in zip(logical_axes, shape):
        target = rules.get(name) if name is not None else None
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        axes = tuple(a for a in axes if a in mesh.shape and a not in used and mesh.shape[a] > 1)
        if axes and size % math.prod(mesh.shape[a] for a in axes) == 0:
            used.update(axes)
            spec.append(axes[0] if len(axes) == 1 else axes)
        else:
            spec.append(None)
    return PartitionSpec(*spec)


def variable_sharding(var: nnx.Variable, mesh: Mesh, rules: Mapping[str, Any] = LOGICAL_RULES) -> NamedSharding:
    """Where one parameter lives, from its `logical_axes` metadata (replicated when it has none)."""
    axes = var.get_metadata().get("logical_axes")
    return NamedSharding(mesh, logical_to_pspec(axes, tuple(var.get_value().shape), mesh, rules))


def iter_variables(model: nnx.Module) -> Iterator[tuple[tuple, nnx.Variable]]:
    """(path, variable) for every nnx.Variable in the module graph."""
    for path, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Variable):
            yield path, node


def shard_module(model: nnx.Module, mesh: Mesh, rules: Mapping[str, Any] = LOGICAL_RULES) -> nnx.Module:
    """Move every variable of `model` (in place) to the sharding its logical axes ask for; returns `model`."""
    for _, var in iter_variables(model):
        var.set_value(jax.device_put(var.get_value(), variable_sharding(var, mesh, rules)))
    return model


def state_shardings(model: nnx.Module, mesh: Mesh, rules: Mapping[str, Any] = LOGICAL_RULES,
                    filter: Any = nnx.Param) -> nnx.State:
    """A State shaped like `nnx.state(model, filter)` whose values are NamedShardings (for jit out_shardings)."""
    state = nnx.state(model, filter)
    return jax.tree.map(
        lambda v: v.replace(variable_sharding(v, mesh, rules)),
        state,
        is_leaf=lambda x: isinstance(x, nnx.Variable),
    )


def init_sharded(factory: Callable[[], nnx.Module], mesh: Mesh, rules: Mapping[str, Any] = LOGICAL_RULES,
                 whole_fraction: float = 0.25) -> nnx.Module:
    """Create `factory()` with each parameter placed in its shards.

    When one process drives the mesh and the whole model takes at most `whole_fraction` of its first
    device's memory, the model is made eagerly on that device and each parameter then moved to its
    shards: seconds, where compiling the constructor as one program took minutes for a 0.5B model on
    a GPU. Otherwise each parameter is made directly in its shards (one jitted constructor), so no
    device ever holds the whole model.
    """
    if _fits_on_one_device(factory, mesh, whole_fraction):
        with jax.default_device(mesh.devices.flat[0]):
            model = factory()
        return shard_module(model, mesh, rules)
    return _create_in_shards(factory, mesh, rules)


def _create_in_shards(factory: Callable[[], nnx.Module], mesh: Mesh, rules: Mapping[str, Any]) -> nnx.Module:
    @nnx.jit
    def create():
        model = factory()
        for _, var in iter_variables(model):
            var.set_value(jax.lax.with_sharding_constraint(var.get_value(), variable_sharding(var, mesh, rules)))
        return model

    return create()


def _fits_on_one_device(factory: Callable[[], nnx.Module], mesh: Mesh, fraction: float) -> bool:
    if jax.process_count() > 1:
        return False
    leaves = jax.tree.leaves(nnx.state(nnx.eval_shape(factory)))
    needed = sum(math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize for leaf in leaves)
    return needed <= fraction * device_memory_bytes(mesh.devices.flat[0])


def device_memory_bytes(device) -> int:
    """What `device` can hold: its allocator's limit, or the host's memory for a CPU device."""
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Sharding of a [batch, ...] array: batch split over ("data", "fsdp"), the rest replicated."""
    axes = tuple(a for a in BATCH_AXES if mesh.shape.get(a, 1) > 1) or None
    if axes is not None and len(axes) == 1:
        axes = axes[0]
    return NamedSharding(mesh, PartitionSpec(axes, *([None] * (ndim - 1))))
