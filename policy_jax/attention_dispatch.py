"""Which attention kernel runs the cache-free forward, and how it is laid over the mesh being traced.

`attention_impl: auto` resolves by platform: the Pallas splash kernel on TPU, cuDNN's fused
kernel on GPUs (bf16/fp16 compute), blockwise XLA attention elsewhere. The segment kernels
("blockwise", "splash") take segment ids instead of a [t, t] mask.

A step traced inside `mesh_scope(mesh)` sees the mesh: the splash kernel is then run per device
under shard_map (rows split over the batch axes, heads over the tensor axis), and a "sequence"
axis larger than one splits the tokens of each row over its devices (context parallelism: keys
and values all-gathered, blockwise attention at the queries' global positions). Outside a mesh
scope everything runs as one program and XLA places it.
"""

from __future__ import annotations

import functools
import math

import jax
from jax.sharding import NamedSharding, PartitionSpec

from policy_jax.blockwise_attention import blockwise_attention, context_parallel_attention
from policy_jax.sharding import BATCH_AXES, HEAD_AXIS, SEQUENCE_AXIS
from policy_jax.splash_attention import splash_attention

SEGMENT_IMPLEMENTATIONS = ("blockwise", "splash")
_GPU_PLATFORMS = ("gpu", "cuda", "rocm")


def mesh_scope(mesh):
    """Context manager: steps traced inside it see `mesh` (see traced_mesh)."""
    return jax.sharding.use_abstract_mesh(mesh.abstract_mesh)


def traced_mesh():
    """The abstract mesh of the computation being traced, or None outside a mesh scope."""
    mesh = jax.sharding.get_abstract_mesh()
    return None if mesh.empty else mesh


def platform_of(mesh) -> str:
    """The platform a computation on `mesh` compiles for (the default backend without a mesh)."""
    device = getattr(mesh, "abstract_device", None) if mesh is not None else None
    return getattr(device, "platform", None) or jax.default_backend()


def sequence_parallel(mesh) -> bool:
    return mesh is not None and mesh.shape.get(SEQUENCE_AXIS, 1) > 1


def resolve_attention_impl(impl: str, platform: str, compute_dtype: str) -> str:
    """The implementation "auto" stands for on `platform`; any other name is returned as it is."""
    if impl != "auto":
        return impl
    if platform == "tpu":
        return "splash"
    if platform in _GPU_PLATFORMS and compute_dtype in ("bfloat16", "float16"):
        return "cudnn"
    return "blockwise"


def forward_attention_impl(impl: str, compute_dtype: str) -> str:
    """The implementation of the forward being traced: blockwise when the sequence is split over
    the mesh, otherwise `impl` resolved for the mesh's platform."""
    mesh = traced_mesh()
    if sequence_parallel(mesh):
        return "blockwise"
    return resolve_attention_impl(impl, platform_of(mesh), compute_dtype)


def batch_axes_for(mesh, rows: int):
    """The batch mesh axes that split `rows` rows evenly (a name, a tuple of names, or None)."""
    axes = tuple(a for a in BATCH_AXES if mesh.shape.get(a, 1) > 1)
    if not axes or rows % math.prod(mesh.shape[a] for a in axes):
        return None
    return axes[0] if len(axes) == 1 else axes


def head_axis_for(mesh, query_heads: int, kv_heads: int):
    """The tensor axis when it splits both the query and the key/value heads evenly, else None."""
    size = mesh.shape.get(HEAD_AXIS, 1)
    return HEAD_AXIS if size > 1 and query_heads % size == 0 and kv_heads % size == 0 else None


def segment_attention(q_btnh, k_btkh, v_btkh, segment_ids_bt, *, impl: str, block_size: int):
    """Causal attention within segments (0 = padding) by `impl` ("blockwise" or "splash"), laid
    over the traced mesh. -> [b, t, n, h]."""
    mesh = traced_mesh()
    if mesh is None:
        if impl == "splash":
            return splash_attention(q_btnh, k_btkh, v_btkh, segment_ids_bt, block_size=block_size)
        return blockwise_attention(q_btnh, k_btkh, v_btkh, segment_ids_bt, block_size=block_size)
    rows = batch_axes_for(mesh, q_btnh.shape[0])
    heads = head_axis_for(mesh, q_btnh.shape[2], k_btkh.shape[2])
    if sequence_parallel(mesh):
        return context_parallel_attention(q_btnh, k_btkh, v_btkh, segment_ids_bt, mesh, SEQUENCE_AXIS,
                                          block_size=block_size, batch_axes=rows, head_axis=heads)
    if impl != "splash":
        return blockwise_attention(q_btnh, k_btkh, v_btkh, segment_ids_bt, block_size=block_size)
    kernel = functools.partial(splash_attention, block_size=block_size, interpret=platform_of(mesh) != "tpu")
    tokens, ids = PartitionSpec(rows, None, heads, None), PartitionSpec(rows, None)
    return jax.shard_map(kernel, mesh=mesh, in_specs=(tokens, tokens, tokens, ids), out_specs=tokens,
                         check_vma=False)(q_btnh, k_btkh, v_btkh, segment_ids_bt)


def constrain_activations(x_btd: jax.Array) -> jax.Array:
    """With the sequence split over the traced mesh, keep hidden states [b, t, d] split the same way."""
    mesh = traced_mesh()
    if not sequence_parallel(mesh) or x_btd.shape[1] % mesh.shape[SEQUENCE_AXIS]:
        return x_btd
    spec = PartitionSpec(batch_axes_for(mesh, x_btd.shape[0]), SEQUENCE_AXIS, None)
    return jax.lax.with_sharding_constraint(x_btd, NamedSharding(mesh, spec))
