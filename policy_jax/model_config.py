"""The shape of a Qwen2/Llama-family decoder, read from a Hugging Face `config.json` or a YAML `model:` section."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping

import jax.numpy as jnp

from policy_jax.blockwise_attention import DEFAULT_BLOCK_SIZE

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
ATTENTION_IMPLEMENTATIONS = ("xla", "cudnn", "blockwise", "splash", "auto")
SUPPORTED_MODEL_TYPES = ("qwen2", "llama")
REMAT_POLICIES = ("nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable", "everything_saveable")


class ModelConfigError(ValueError):
    """A config that this decoder cannot represent (one clear line for the user)."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of the decoder; hashable, so it can sit on a module as static data.

    `attention_bias` is the q/k/v projection bias (Qwen2 always has it; Llama's `attention_bias`
    also adds an output-projection bias, kept in `attention_out_bias`).
    `attention_impl` picks `jax.nn.dot_product_attention`'s backend for the cache-free forward:
    "xla" (any mask, packed segments; builds a [t, t] mask), "cudnn" (fused flash attention on NVIDIA
    GPUs; assumes one right-padded segment per row, as in a padded training batch), "blockwise"
    (packed segments, memory linear in t on every backend: the long-context path), "splash" (the
    Pallas splash kernel on TPU, packed segments, memory linear in t; interpreted elsewhere) or
    "auto" (splash on TPU, cudnn on GPU, blockwise elsewhere: policy_jax/attention_dispatch.py).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    attention_out_bias: bool = False
    max_position_embeddings: int = 32768
    initializer_range: float = 0.02
    # Llama-3 style frequency scaling ("llama3"), None for plain RoPE.
    rope_scaling_type: str | None = None
    rope_scaling_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position_embeddings: int = 8192
    param_dtype: str = "float32"
    compute_dtype: str = "bfloat16"
    remat: bool = False
    # what a rematerialised layer keeps for the backward pass: a name in jax.checkpoint_policies
    remat_policy: str = "nothing_saveable"
    attention_impl: str = "xla"
    attention_block_size: int = DEFAULT_BLOCK_SIZE  # queries and keys per block ("blockwise", "splash")

    def __post_init__(self):
        for name in ("param_dtype", "compute_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ModelConfigError(f"{name}={getattr(self, name)!r}: expected one of {sorted(DTYPES)}")
        if self.attention_impl not in ATTENTION_IMPLEMENTATIONS:
            raise ModelConfigError(f"attention_impl={self.attention_impl!r}: expected one of {ATTENTION_IMPLEMENTATIONS}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ModelConfigError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if self.remat_policy not in REMAT_POLICIES:
            raise ModelConfigError(f"remat_policy={self.remat_policy!r}: expected one of {REMAT_POLICIES}")
        if self.rope_scaling_type not in (None, "llama3"):
            raise ModelConfigError(f"rope scaling {self.rope_scaling_type!r} is not supported (only 'llama3')")

    # ---- dtypes -------------------------------------------------------------------------------
    @property
    def param_jnp_dtype(self):
        return DTYPES[self.param_dtype]

    @property
    def compute_jnp_dtype(self):
        return DTYPES[self.compute_dtype]

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    # ---- sizes used for throughput figures ------------------------------------------------------
    def param_count(self) -> int:
        """Number of parameters (embedding counted once when tied)."""
        d, f, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        attn = d * q + 2 * d * kv + q * d
        if self.attention_bias:
            attn += q + 2 * kv
        if self.attention_out_bias:
            attn += d
        layer = attn + 3 * d * f + 2 * d
        head = 0 if self.tie_word_embeddings else d * v
        return v * d + self.num_hidden_layers * layer + d + head

    def forward_flops_per_token(self, seq_len: int, lm_head: bool = True) -> float:
        """Matmul FLOPs of one forward pass per token (2 per multiply-add), causal attention at `seq_len`.

        Counts the projections, the MLP, the head and the attention scores/values with the causal
        half (the convention of the PaLM/MaxText MFU formulas); a training step is 3x this. The head is
        the LM head, or with `lm_head=False` the critic's value head (one output).
        """
        d, f = self.hidden_size, self.intermediate_size
        v = self.vocab_size if lm_head else 1
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        per_layer = 2 * (d * q + 2 * d * kv + q * d + 3 * d * f)
        attention = 2 * 2 * q * seq_len / 2  # scores + weighted values, causal half
        return self.num_hidden_layers * (per_layer + attention) + 2 * d * v

    # ---- constructors -------------------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, path_or_dict: str | Path | Mapping[str, Any], **overrides: Any) -> "ModelConfig":
        """Build from a Hugging Face `config.json` (a dict, the file, or the directory holding it).

        `overrides` set our own fields (param_dtype, compute_dtype, remat, attention_impl, ...).
        """
        hf = _read_hf_config(path_or_dict)
        model_type = hf.get("model_type", "llama")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelConfigError(f"model_type {model_type!r} is not supported (expected one of {SUPPORTED_MODEL_TYPES})")
        if hf.get("mlp_bias"):
            raise ModelConfigError("mlp_bias=true is not supported")
        if hf.get("use_sliding_window"):
            raise ModelConfigError("use_sliding_window=true is not supported")
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise ModelConfigError(f"hidden_act={act!r} is not supported (SwiGLU with silu only)")
        heads = int(hf["num_attention_heads"])
        head_dim = hf.get("head_dim") or int(hf["hidden_size"]) // heads
        rope = _rope_settings(hf)
        if model_type == "qwen2":
            qkv_bias, out_bias = True, False
        else:
            qkv_bias = out_bias = bool(hf.get("attention_bias", False))
        fields = dict(
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_hidden_layers=int(hf["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=qkv_bias,
            attention_out_bias=out_bias,
            max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
            initializer_range=float(hf.get("initializer_range", 0.02)),
            **rope,
        )
        fields.update(overrides)
        return cls(**fields)

    @classmethod
    def from_yaml_dict(cls, d: Mapping[str, Any]) -> "ModelConfig":
        """Build from a YAML `model:` section: our field names, plus optionally `hf_config: <path>`
        (a Hugging Face config to start from, which the other keys then override)."""
        d = dict(d)
        names = {f.name for f in dataclasses.fields(cls)}
        hf_path = d.pop("hf_config", None)
        unknown = sorted(set(d) - names)
        if unknown:
            raise ModelConfigError(f"unknown model config keys: {', '.join(unknown)}")
        if hf_path is not None:
            return cls.from_hf_config(hf_path, **d)
        if "head_dim" not in d and "hidden_size" in d and "num_attention_heads" in d:
            d["head_dim"] = int(d["hidden_size"]) // int(d["num_attention_heads"])
        if "num_key_value_heads" not in d and "num_attention_heads" in d:
            d["num_key_value_heads"] = d["num_attention_heads"]
        missing = sorted(f.name for f in dataclasses.fields(cls)
                         if f.default is dataclasses.MISSING and f.name not in d)
        if missing:
            raise ModelConfigError(f"model config is missing: {', '.join(missing)}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _read_hf_config(path_or_dict: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(path_or_dict, Mapping):
        return dict(path_or_dict)
    path = Path(path_or_dict)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ModelConfigError(f"no Hugging Face config at {path}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{path} is not valid JSON: {e}") from None


def _rope_settings(hf: Mapping[str, Any]) -> dict[str, Any]:
    """RoPE theta and scaling from either `rope_theta`/`rope_scaling` (transformers 4)
    or `rope_parameters` (transformers 5)."""
    params = dict(hf.get("rope_parameters") or {})
    scaling = dict(hf.get("rope_scaling") or {})
    theta = hf.get("rope_theta", params.get("rope_theta", 10000.0))
    kind = scaling.get("rope_type") or scaling.get("type") or params.get("rope_type") or "default"
    source = scaling or params
    out: dict[str, Any] = {"rope_theta": float(theta)}
    if kind == "default":
        return out
    if kind != "llama3":
        raise ModelConfigError(f"rope scaling type {kind!r} is not supported (only 'llama3')")
    out.update(
        rope_scaling_type="llama3",
        rope_scaling_factor=float(source["factor"]),
        rope_low_freq_factor=float(source.get("low_freq_factor", 1.0)),
        rope_high_freq_factor=float(source.get("high_freq_factor", 4.0)),
        rope_original_max_position_embeddings=int(source.get("original_max_position_embeddings", 8192)),
    )
    return out
