"""Write a CausalLM as a Hugging Face checkpoint: config.json, model.safetensors, tokenizer files.

The inverse of `params_import`: each of our parameters goes back to its HF name and layout
([out, in] projections, heads merged). The arrays are gathered to this host, so the model must
fit in its memory (on a pod: export from one host after a restore there).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jax
import ml_dtypes  # noqa: F401  (bfloat16 for NumPy, which safetensors' NumPy API writes)
import numpy as np

from policy_jax.model_config import DTYPES, ModelConfig
from policy_jax.params_import import SINGLE_FILE, CheckpointError, hf_source
from policy_jax.sharding import iter_variables

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "generation_config.json")


def to_hf_layout(array: np.ndarray, kind: str) -> np.ndarray:
    """Our layout -> the HF tensor (the inverse of params_import.read_block on the whole array)."""
    if kind == "same":
        return array
    if kind == "transpose":
        return array.T
    if kind == "in_heads":  # ours [d, n, h] -> hf [n*h, d]
        d, n, h = array.shape
        return array.transpose(1, 2, 0).reshape(n * h, d)
    if kind == "heads_in":  # ours [n, h, d] -> hf [d, n*h]
        n, h, d = array.shape
        return array.transpose(2, 0, 1).reshape(d, n * h)
    if kind == "heads":  # ours [n, h] -> hf [n*h]
        return array.reshape(-1)
    raise ValueError(f"unknown layout kind {kind!r}")


def hf_config_dict(cfg: ModelConfig, dtype: str) -> dict[str, Any]:
    """A config.json that transformers reads back as the same architecture."""
    qwen2 = cfg.attention_bias and not cfg.attention_out_bias
    hf: dict[str, Any] = {
        "architectures": ["Qwen2ForCausalLM" if qwen2 else "LlamaForCausalLM"],
        "model_type": "qwen2" if qwen2 else "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings,
        "initializer_range": cfg.initializer_range,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "torch_dtype": dtype,
    }
    if not qwen2:
        hf["attention_bias"] = cfg.attention_bias
        hf["mlp_bias"] = False
    else:
        hf["use_sliding_window"] = False
    if cfg.rope_scaling_type == "llama3":
        hf["rope_scaling"] = {
            "rope_type": "llama3", "factor": cfg.rope_scaling_factor, "low_freq_factor": cfg.rope_low_freq_factor,
            "high_freq_factor": cfg.rope_high_freq_factor,
            "original_max_position_embeddings": cfg.rope_original_max_position_embeddings,
        }
    elif cfg.rope_scaling_type is not None:
        raise CheckpointError(f"rope scaling {cfg.rope_scaling_type!r} cannot be written to a Hugging Face config")
    return hf


def export_hf_checkpoint(model, directory: str | Path, dtype: str | None = None, tokenizer_dir: str | Path | None = None) -> Path:
    """Write `model` (a CausalLM) to `directory` as a Hugging Face checkpoint; returns the directory.

    dtype: the stored dtype ("float32", "bfloat16", ...; default the parameters' own).
    tokenizer_dir: a folder whose tokenizer files are copied along, so the result loads as is.
    """
    directory = Path(directory)
    if directory.exists() and any(directory.iterdir()):
        raise CheckpointError(f"export directory {directory} exists and is not empty")
    dtype = dtype or model.config.param_dtype
    if dtype not in DTYPES:
        raise CheckpointError(f"dtype {dtype!r} is not supported (expected one of {', '.join(DTYPES)})")
    copied = []
    if tokenizer_dir is not None:
        copied = [name for name in TOKENIZER_FILES if (Path(tokenizer_dir) / name).is_file()]
        if not copied:
            raise CheckpointError(f"no tokenizer files in {tokenizer_dir}")
    tensors: dict[str, np.ndarray] = {}
    for path, var in iter_variables(model):
        source = hf_source(path)
        if source is None:
            raise CheckpointError(f"parameter {'.'.join(map(str, path))} has no Hugging Face name (is this a Critic?)")
        short, kind = source
        name = short if short == "lm_head.weight" else f"model.{short}"
        array = np.asarray(jax.device_get(var.get_value())).astype(np.dtype(DTYPES[dtype]))
        tensors[name] = np.ascontiguousarray(to_hf_layout(array, kind))
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / SINGLE_FILE), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(hf_config_dict(model.config, dtype), indent=2) + "\n")
    for name in copied:
        shutil.copy(Path(tokenizer_dir) / name, directory / name)
    return directory
