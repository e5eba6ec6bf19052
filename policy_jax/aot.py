"""Ahead-of-time compilation of the training and sampling steps for a TPU topology, without a TPU.

With the `libtpu` package beside the CPU JAX, `get_topology_desc` describes a TPU slice, and a
step whose arguments are abstract (shapes, dtypes, shardings on a mesh of that slice's devices)
is lowered and compiled for it here. XLA then reports what one device would hold (arguments,
temporaries, outputs), the step's flops and its own estimate of the step's time. Nothing is
allocated: the states below are `jax.ShapeDtypeStruct`s.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from policy_jax.attention_dispatch import batch_axes_for, head_axis_for, mesh_scope, resolve_attention_impl
from policy_jax.sharding import MESH_AXES, MeshConfig, batch_sharding, make_mesh, variable_sharding, iter_variables
from policy_jax.train_state import TrainState, make_optimizer, opt_state_shardings

GIB = 2 ** 30
#: HBM per chip, by the device kind libtpu reports
HBM_PER_CHIP = {"TPU v4": 32 * GIB, "TPU v5 lite": 16 * GIB, "TPU v5": 95 * GIB, "TPU v6 lite": 32 * GIB}
# libtpu reads these on start-up; on a machine without a TPU they keep it from probing for one, and let
# several compiling processes load it at once (its lock file guards a TPU that is not there)
_QUIET_TPU_ENV = {"TPU_SKIP_MDS_QUERY": "1", "TPU_ACCELERATOR_TYPE": "v5p-8", "TPU_WORKER_HOSTNAMES": "localhost",
                  "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


def libtpu_missing_reason() -> str | None:
    """None when libtpu can be imported, else why not (one line)."""
    try:
        import libtpu  # noqa: F401
    except ImportError as e:
        return f"the libtpu package is not installed ({e}); pip install -e '.[tpu-aot]'"
    return None


@dataclasses.dataclass(frozen=True)
class Topology:
    name: str
    devices: tuple
    chips: int
    hbm_per_device: int


def tpu_topology(name: str) -> Topology:
    """The devices of a TPU slice named like "v5p:2x2x1" and the HBM each one has."""
    for key, value in _QUIET_TPU_ENV.items():
        os.environ.setdefault(key, value)
    from jax.experimental import topologies

    devices = tuple(topologies.get_topology_desc(platform="tpu", topology_name=name).devices)
    chips = math.prod(int(x) for x in name.split(":", 1)[1].split("x"))
    kind = devices[0].device_kind
    if kind not in HBM_PER_CHIP:
        raise ValueError(f"unknown HBM size of {kind!r} (known: {', '.join(HBM_PER_CHIP)})")
    return Topology(name, devices, chips, HBM_PER_CHIP[kind] * chips // len(devices))


def layouts_for(devices: int, configured: MeshConfig | None) -> list[MeshConfig]:
    """Mesh layouts to try: the configured one when it fits the devices, then FSDP over all of them,
    4-way tensor parallelism, and 4-way sequence parallelism beside it."""
    candidates = [configured] if configured is not None else []
    candidates += [MeshConfig(fsdp=-1), MeshConfig(fsdp=-1, tensor=4), MeshConfig(fsdp=-1, tensor=4, sequence=4)]
    out = []
    for mesh in candidates:
        try:
            resolved = MeshConfig(**mesh.sizes(devices))
        except ValueError:
            continue
        if resolved not in out:
            out.append(resolved)
    return out


def abstract_module(cls, model_cfg, mesh) -> nnx.Module:
    """`cls(model_cfg)` with every parameter a ShapeDtypeStruct placed by its logical axes."""
    model = nnx.eval_shape(lambda: cls(model_cfg, rngs=nnx.Rngs(0)))
    for _, var in iter_variables(model):
        value = var.get_value()
        var.set_value(jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=variable_sharding(var, mesh)))
    return model


def abstract_train_state(model: nnx.Module, optimizer_cfg, total_steps: int, mesh) -> TrainState:
    """A TrainState of ShapeDtypeStructs: parameters as placed, optimiser moments beside them."""
    graphdef, params_state, rest_state = nnx.split(model, nnx.Param, ...)
    params = nnx.to_pure_dict(params_state)
    optimizer = make_optimizer(optimizer_cfg, total_steps)
    shape = jax.eval_shape(optimizer.tx.init, params)
    shardings = opt_state_shardings(shape, params, mesh)
    opt_state = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shape, shardings)
    step = jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, PartitionSpec()))
    return TrainState(step=step, params=params, opt_state=opt_state, rest=nnx.to_pure_dict(rest_state),
                      graphdef=graphdef, optimizer=optimizer)


def token_array(mesh, rows: int, length: int, dtype=jnp.int32) -> jax.ShapeDtypeStruct:
    """[rows, length] split over the batch axes."""
    return jax.ShapeDtypeStruct((rows, length), dtype, sharding=batch_sharding(mesh, 2))


@dataclasses.dataclass(frozen=True)
class CompiledStep:
    """What XLA reports for one step on one device. XLA's cost analysis counts the body of a loop
    once, so a step that scans over `repeats` micro-batches has its flops and time estimate
    multiplied by `repeats` here (flops inside other loops, such as the chunked LM head or the
    blockwise attention's block loops, and inside Pallas kernels, are still counted once or not
    at all: the figures are lower bounds)."""

    name: str
    rows: int
    compile_s: float
    argument_bytes: int
    temp_bytes: int
    output_bytes: int
    alias_bytes: int
    code_bytes: int
    flops: float
    optimal_s: float
    repeats: int = 1

    @property
    def peak_bytes(self) -> int:
        """Arguments, temporaries, outputs and code; outputs written in place of donated arguments counted once."""
        return self.argument_bytes + self.temp_bytes + self.output_bytes - self.alias_bytes + self.code_bytes


def compile_step(name: str, rows: int, fn: Callable, *args: Any, repeats: int = 1) -> CompiledStep:
    """Lower and compile `fn(*args)` (a jitted function of abstract arguments) and read XLA's figures."""
    begin = time.perf_counter()
    compiled = fn.lower(*args).compile()
    seconds = time.perf_counter() - begin
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis() or {}
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return CompiledStep(name, rows, seconds, int(memory.argument_size_in_bytes), int(memory.temp_size_in_bytes),
                        int(memory.output_size_in_bytes), int(memory.alias_size_in_bytes),
                        int(memory.generated_code_size_in_bytes), repeats * float(cost.get("flops", 0.0)),
                        _times(repeats, float(cost.get("optimal_seconds", -1.0))), repeats)


def _times(repeats: int, estimate: float) -> float:
    return estimate * repeats if estimate >= 0 else estimate  # -1: XLA has no estimate


def cache_sharding(mesh, rows: int, model_cfg) -> NamedSharding:
    """A KV cache layer [b, s, k, h]: rows over the batch axes, slots over the sequence axis, heads over tensor."""
    slots = "sequence" if mesh.shape.get("sequence", 1) > 1 else None
    heads = head_axis_for(mesh, model_cfg.num_attention_heads, model_cfg.num_key_value_heads)
    return NamedSharding(mesh, PartitionSpec(batch_axes_for(mesh, rows), slots, heads, None))


def for_platform(model_cfg, platform: str = "tpu"):
    """The model config with attention_impl "auto" resolved for `platform` (the host's backend is CPU);
    a GPU-only "cudnn" is taken as "auto" off GPUs, so that a GPU config compiles for a TPU."""
    impl = "auto" if model_cfg.attention_impl == "cudnn" and platform != "gpu" else model_cfg.attention_impl
    impl = resolve_attention_impl(impl, platform, model_cfg.compute_dtype)
    return model_cfg.replace(attention_impl=impl)


def with_mesh(fn: Callable, mesh) -> Callable:
    """`fn` traced in the mesh scope (the attention kernels lay themselves over the mesh)."""

    def scoped(*args):
        with mesh_scope(mesh):
            return fn(*args)

    return scoped


def mesh_label(mesh_cfg: MeshConfig) -> str:
    return " ".join(f"{axis}={getattr(mesh_cfg, axis)}" for axis in MESH_AXES)


def build_mesh(mesh_cfg: MeshConfig, topology: Topology):
    return make_mesh(mesh_cfg, list(topology.devices))
