"""Load Hugging Face safetensors checkpoints (one file, or shards with an index) into our modules.

Every parameter is built with `jax.make_array_from_callback`: each device reads only its own slice
of the tensor from the memory-mapped file, so no host or device ever holds the whole model at once.
HF stores projections as [out, in]; ours are [in, ...] with heads split out, so each tensor has a
layout kind that says how an index into our array maps to a slice of the file.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Callable

import jax
import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy, so safetensors' NumPy API can read bf16)
import numpy as np
from flax import nnx
from jax.sharding import Mesh, SingleDeviceSharding

from policy_jax.model_config import DTYPES, ModelConfig
from policy_jax.sharding import LOGICAL_RULES, iter_variables, variable_sharding
from policy_jax.transformer import CausalLM, Critic

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded (one clear line for the user)."""


# ---- where each of our parameters comes from -----------------------------------------------------
# layout kinds: "same" (identical layout), "transpose" ([out, in] -> [in, out]),
# "in_heads" ([n*h, d] -> [d, n, h]), "heads_in" ([d, n*h] -> [n, h, d]), "heads" ([n*h] -> [n, h])
_LAYER_PARAMS = {
    ("input_layernorm", "scale_d"): ("input_layernorm.weight", "same"),
    ("post_attention_layernorm", "scale_d"): ("post_attention_layernorm.weight", "same"),
    ("self_attn", "q_dnh"): ("self_attn.q_proj.weight", "in_heads"),
    ("self_attn", "k_dkh"): ("self_attn.k_proj.weight", "in_heads"),
    ("self_attn", "v_dkh"): ("self_attn.v_proj.weight", "in_heads"),
    ("self_attn", "o_nhd"): ("self_attn.o_proj.weight", "heads_in"),
    ("self_attn", "q_bias_nh"): ("self_attn.q_proj.bias", "heads"),
    ("self_attn", "k_bias_kh"): ("self_attn.k_proj.bias", "heads"),
    ("self_attn", "v_bias_kh"): ("self_attn.v_proj.bias", "heads"),
    ("self_attn", "o_bias_d"): ("self_attn.o_proj.bias", "same"),
    ("mlp", "gate_df"): ("mlp.gate_proj.weight", "transpose"),
    ("mlp", "up_df"): ("mlp.up_proj.weight", "transpose"),
    ("mlp", "down_fd"): ("mlp.down_proj.weight", "transpose"),
}


def hf_source(path: tuple) -> tuple[str, str] | None:
    """(HF tensor name without the "model." prefix, layout kind) for one of our parameter paths,
    "lm_head.weight" for the untied head, None for parameters that HF checkpoints lack (value head)."""
    path = tuple(p for p in path)
    if path[:1] == ("lm_head_dv",):
        return "lm_head.weight", "transpose"
    if path[:1] != ("backbone",):
        return None
    rest = path[1:]
    if rest == ("embed_tokens", "embedding_vd"):
        return "embed_tokens.weight", "same"
    if rest == ("norm", "scale_d"):
        return "norm.weight", "same"
    if rest[0] == "layers" and len(rest) == 4:
        name, kind = _LAYER_PARAMS[(rest[2], rest[3])]
        return f"layers.{rest[1]}.{name}", kind
    raise CheckpointError(f"no Hugging Face name known for parameter {'.'.join(map(str, path))}")


def _range(s: slice, size: int) -> tuple[int, int]:
    start, stop, step = s.indices(size)
    if step != 1:
        raise ValueError("strided shards are not supported")
    return start, stop


def read_block(read: Callable[[tuple[slice, ...]], np.ndarray], kind: str, shape: tuple[int, ...],
               index: tuple[slice, ...]) -> np.ndarray:
    """Our array's block `index` (slices into `shape`, our layout) read from the HF tensor via `read`."""
    index = tuple(index) + (slice(None),) * (len(shape) - len(index))
    ranges = [_range(s, n) for s, n in zip(index, shape)]
    if kind == "same":
        return read(tuple(slice(a, b) for a, b in ranges))
    if kind == "transpose":
        (a0, a1), (b0, b1) = ranges
        return read((slice(b0, b1), slice(a0, a1))).T
    if kind == "in_heads":  # ours [d, n, h] <- hf [n*h, d]
        (d0, d1), (n0, n1), (h0, h1) = ranges
        h = shape[2]
        rows = read((slice(n0 * h, n1 * h), slice(d0, d1)))
        return rows.reshape(n1 - n0, h, d1 - d0)[:, h0:h1].transpose(2, 0, 1)
    if kind == "heads_in":  # ours [n, h, d] <- hf [d, n*h]
        (n0, n1), (h0, h1), (d0, d1) = ranges
        h = shape[1]
        cols = read((slice(d0, d1), slice(n0 * h, n1 * h)))
        return cols.reshape(d1 - d0, n1 - n0, h)[:, :, h0:h1].transpose(1, 2, 0)
    if kind == "heads":  # ours [n, h] <- hf [n*h]
        (n0, n1), (h0, h1) = ranges
        h = shape[1]
        return read((slice(n0 * h, n1 * h),)).reshape(n1 - n0, h)[:, h0:h1]
    raise ValueError(f"unknown layout kind {kind!r}")


def hf_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The HF tensor shape that maps onto our `shape` under layout `kind`."""
    if kind == "same":
        return shape
    if kind == "transpose":
        return (shape[1], shape[0])
    if kind == "in_heads":
        return (shape[1] * shape[2], shape[0])
    if kind == "heads_in":
        return (shape[2], shape[0] * shape[1])
    if kind == "heads":
        return (shape[0] * shape[1],)
    raise ValueError(kind)


# ---- the files -----------------------------------------------------------------------------------
def checkpoint_files(directory: str | Path) -> dict[str, Path]:
    """HF tensor name -> the safetensors file holding it (sharded index, single file, or any *.safetensors)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory {directory} does not exist")
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index} is not a valid safetensors index: {e}") from None
        return {name: directory / file for name, file in weight_map.items()}
    files = [directory / SINGLE_FILE] if (directory / SINGLE_FILE).is_file() else sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no safetensors files in {directory}")
    from safetensors import safe_open

    names: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="np") as f:
            names.update({k: file for k in f.keys()})
    return names


def _load_into(model: nnx.Module, directory: Path, mesh: Mesh | None, dtype, skip: Callable[[tuple], bool]) -> None:
    """Fill every variable of an abstract `model` from the checkpoint (or zeros where `skip(path)`)."""
    from safetensors import safe_open

    files = checkpoint_files(directory)
    prefix = "model." if any(n.startswith("model.") for n in files) else ""
    with contextlib.ExitStack() as stack:
        handles: dict[Path, Any] = {}

        def handle(file: Path):
            if file not in handles:
                if not file.is_file():
                    raise CheckpointError(f"checkpoint shard {file} is missing")
                handles[file] = stack.enter_context(safe_open(str(file), framework="np"))
            return handles[file]

        for path, var in iter_variables(model):
            shape, target_dtype = tuple(var.get_value().shape), dtype or var.get_value().dtype
            sharding = variable_sharding(var, mesh, LOGICAL_RULES) if mesh is not None else SingleDeviceSharding(jax.devices()[0])
            source = None if skip(path) else hf_source(path)
            if source is None:
                var.set_value(jax.device_put(np.zeros(shape, target_dtype), sharding))
                continue
            short, kind = source
            name = short if short == "lm_head.weight" else prefix + short
            if name not in files:
                raise CheckpointError(f"tensor {name} is not in the checkpoint at {directory}")
            tensor = handle(files[name]).get_slice(name)
            expected = hf_shape(kind, shape)
            if tuple(tensor.get_shape()) != expected:
                raise CheckpointError(f"tensor {name} has shape {tuple(tensor.get_shape())}, the config expects {expected}")
            read = lambda idx, t=tensor: np.asarray(t[idx])  # noqa: E731
            var.set_value(jax.make_array_from_callback(
                shape, sharding,
                lambda idx, kind=kind, read=read, shape=shape, dt=target_dtype: read_block(read, kind, shape, idx).astype(dt)))


def _config_for(directory: Path, cfg: ModelConfig | None, dtype) -> ModelConfig:
    cfg = cfg or ModelConfig.from_hf_config(directory)
    if dtype is not None:
        cfg = cfg.replace(param_dtype=np.dtype(dtype).name if not isinstance(dtype, str) else dtype)
        if cfg.param_dtype not in DTYPES:
            raise CheckpointError(f"param dtype {cfg.param_dtype} is not supported")
    return cfg


def load_hf_checkpoint(path: str | Path, cfg: ModelConfig | None = None, mesh: Mesh | None = None,
                       dtype: Any = None) -> CausalLM:
    """A CausalLM with its weights from the HF checkpoint in directory `path`.

    cfg: defaults to the directory's config.json; dtype (e.g. "bfloat16") overrides cfg.param_dtype;
    mesh: parameters are placed by their logical axes (else on the first device).
    """
    directory = Path(path)
    cfg = _config_for(directory, cfg, dtype)
    model = nnx.eval_shape(lambda: CausalLM(cfg, rngs=nnx.Rngs(0)))
    _load_into(model, directory, mesh, None, skip=lambda p: False)
    return model


def load_critic_from_hf(path: str | Path, cfg: ModelConfig | None = None, mesh: Mesh | None = None,
                        dtype: Any = None) -> Critic:
    """A Critic whose backbone comes from the HF checkpoint and whose value head starts at zero."""
    directory = Path(path)
    cfg = _config_for(directory, cfg, dtype)
    model = nnx.eval_shape(lambda: Critic(cfg, rngs=nnx.Rngs(0)))
    _load_into(model, directory, mesh, None, skip=lambda p: p[:1] != ("backbone",))
    return model
