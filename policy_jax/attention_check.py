"""Each attention kernel of a platform against exact attention, layer by layer, on the same inputs.

The backbone runs once with plain XLA attention; at every layer the queries, keys and values of
that layer's input (rotary positions applied, compute dtype) go to each kernel, and each output is
compared with attention on the same values computed in float32 at the highest precision. All
kernels of a layer therefore see identical inputs, and the error of each is its own: rounding
inside the kernel and of its output, not drift carried from earlier layers.

The measure is max |kernel - exact| over the tokens that are not padding, divided by max |exact|
of that layer (`rel_max`), and the same for the means (`rel_mean`). bf16 keeps 8 significant bits:
rounding the output alone costs up to 2^-9 of a value.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from policy_jax.attention import segment_attention_mask
from policy_jax.blockwise_attention import blockwise_attention
from policy_jax.splash_attention import splash_attention

KERNELS_BY_PLATFORM = {"gpu": ("xla", "cudnn", "blockwise"), "tpu": ("xla", "splash", "blockwise")}
DEFAULT_KERNELS = ("xla", "blockwise")
TOLERANCE = 2.0 ** -6  # rel_max allowed: four bf16 steps at the largest output value


def kernels_for(platform: str) -> tuple[str, ...]:
    """The kernels `attention_impl` can pick on `platform`, plain XLA first."""
    return KERNELS_BY_PLATFORM.get("gpu" if platform in ("cuda", "rocm") else platform, DEFAULT_KERNELS)


def attend(kernel: str, q_btnh, k_btkh, v_btkh, segment_ids_bt, *, block_size: int = 128):
    """Causal attention within segments (0 = padding; right padding only for cudnn) by `kernel`."""
    if kernel == "xla":
        return jax.nn.dot_product_attention(q_btnh, k_btkh, v_btkh, mask=segment_attention_mask(segment_ids_bt),
                                            implementation="xla")
    if kernel == "cudnn":
        lengths_b = jnp.sum(segment_ids_bt != 0, axis=1).astype(jnp.int32)
        return jax.nn.dot_product_attention(q_btnh, k_btkh, v_btkh, is_causal=True, query_seq_lengths=lengths_b,
                                            key_value_seq_lengths=lengths_b, implementation="cudnn")
    if kernel == "blockwise":
        return blockwise_attention(q_btnh, k_btkh, v_btkh, segment_ids_bt, block_size=block_size)
    if kernel == "splash":
        return splash_attention(q_btnh, k_btkh, v_btkh, segment_ids_bt, block_size=block_size,
                                interpret=jax.default_backend() != "tpu")
    raise ValueError(f"unknown attention kernel {kernel!r}: expected xla, cudnn, blockwise or splash")


def exact_attention(q_btnh, k_btkh, v_btkh, segment_ids_bt):
    """The reference: the same values in float32, every product at the highest precision."""
    f32 = [x.astype(jnp.float32) for x in (q_btnh, k_btkh, v_btkh)]
    with jax.default_matmul_precision("highest"):
        return attend("xla", *f32, segment_ids_bt)


@dataclass(frozen=True)
class LayerErrors:
    layer: int
    score_std: float  # spread of the scaled scores q.k/sqrt(h): how peaked this layer's attention is
    rel_max: dict[str, float]
    rel_mean: dict[str, float]

    def worst(self) -> tuple[str, float]:
        name = max(self.rel_max, key=self.rel_max.get)
        return name, self.rel_max[name]


@nnx.jit
def _layer_qkv_and_next(layer, x_btd, positions_bt, mask_b1ts):
    q, k, v = layer.self_attn.project_qkv(layer.input_layernorm(x_btd), positions_bt)
    return (q, k, v), layer(x_btd, positions_bt, mask_b1ts)[0]


def _score_std(q_btnh, k_btkh, valid_bt) -> float:
    """Std of q.k/sqrt(h) between the valid tokens of row 0 (first key head's query group)."""
    n = int(valid_bt[0].sum())
    q, k = np.asarray(q_btnh[0, :n, 0], np.float32), np.asarray(k_btkh[0, :n, 0], np.float32)
    scores = q @ k.T / np.sqrt(q.shape[-1])
    return float(scores[np.tril_indices(n)].std())


def layer_errors(index: int, qkv, segment_ids_bt, kernels, *, block_size: int) -> LayerErrors:
    valid = np.asarray(segment_ids_bt) != 0
    exact = np.asarray(jax.jit(exact_attention)(*qkv, segment_ids_bt))[valid]
    top, mean = float(np.abs(exact).max()), float(np.abs(exact).mean())
    rel_max, rel_mean = {}, {}
    for kernel in kernels:
        # one compilation per kernel for every layer: jit caches by the function and its static arguments
        run = jax.jit(attend, static_argnums=0, static_argnames="block_size")
        diff = np.abs(np.asarray(run(kernel, *qkv, segment_ids_bt, block_size=block_size), np.float32)[valid] - exact)
        rel_max[kernel], rel_mean[kernel] = float(diff.max()) / top, float(diff.mean()) / mean
    return LayerErrors(index, _score_std(qkv[0], qkv[1], valid), rel_max, rel_mean)


def check_layers(lm, tokens_bt, segment_ids_bt, kernels, *, block_size: int = 128, on_layer=None):
    """LayerErrors for every decoder layer of `lm` (a CausalLM), its inputs from a plain-XLA forward."""
    positions_bt = jnp.broadcast_to(jnp.arange(tokens_bt.shape[1], dtype=jnp.int32), tokens_bt.shape)
    mask_b1ts = segment_attention_mask(segment_ids_bt)
    x_btd = lm.backbone.embed_tokens(tokens_bt)
    results = []
    for index, layer in enumerate(lm.backbone.layers):
        qkv, x_btd = _layer_qkv_and_next(layer, x_btd, positions_bt, mask_b1ts)
        results.append(layer_errors(index, qkv, segment_ids_bt, kernels, block_size=block_size))
        if on_layer is not None:
            on_layer(results[-1])
    return results
