"""A training run's configuration, loaded from `configs/*.yaml` with validation.

Sections (each a frozen dataclass below; unknown keys are an error, named in one line):
`model` (policy_jax.model_config.ModelConfig), `mesh` (policy_jax.sharding.MeshConfig),
`actor_optimizer` / `critic_optimizer`, `ppo`, `rft`, `sampling`, `train`, `checkpoint`, `distributed`.
Defaults are the paper's values where it gives one (docs/paper.md §7).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Mapping

import yaml

from policy_jax.rl.advantages import DEFAULT_GAMMA, DEFAULT_LAMBDA
from policy_jax.rl.losses import DEFAULT_CLIP_HIGH, DEFAULT_CLIP_LOW, DEFAULT_DUAL_CLIP, DEFAULT_TIS_CAP
from policy_jax.rl.masked import LOSS_AGGREGATIONS

LR_SCHEDULES = ("constant", "warmup_constant", "warmup_cosine")
LOGPROB_PRECISIONS = ("fp32", "bf16")
OLD_LOGPROB_SOURCES = ("recompute", "rollout")
PIPELINE_STAGES = ("rft", "value", "ppo")


class RunConfigError(ValueError):
    """A config file the trainer cannot use (one clear line for the user)."""


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with global-norm gradient clipping and a learning-rate schedule.

    Paper: actor lr 3e-6, critic lr 6e-6 (docs/paper.md §7). Betas, weight decay and clipping are verl's defaults.
    `decay_steps` is the length of the cosine (default: the run's `train.steps`).
    """

    learning_rate: float
    schedule: str = "constant"
    warmup_steps: int = 0
    decay_steps: int | None = None
    end_learning_rate_ratio: float = 0.0
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    grad_clip_norm: float | None = 1.0

    def __post_init__(self):
        if self.schedule not in LR_SCHEDULES:
            raise RunConfigError(f"optimizer schedule {self.schedule!r}: expected one of {LR_SCHEDULES}")
        if self.learning_rate <= 0:
            raise RunConfigError(f"learning_rate must be positive, got {self.learning_rate}")


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """PPO actor/critic settings. Paper: eps_low 0.2, eps_high 0.28, gamma 1, lambda 0.95, batch = mini-batch = 1024."""

    clip_low: float = DEFAULT_CLIP_LOW
    clip_high: float = DEFAULT_CLIP_HIGH
    dual_clip: float | None = DEFAULT_DUAL_CLIP
    value_clip: float | None = None
    gamma: float = DEFAULT_GAMMA
    lam: float = DEFAULT_LAMBDA
    whiten_advantages: bool = True
    loss_aggregation: str = "token-mean"
    tis_cap: float | None = DEFAULT_TIS_CAP
    entropy_coeff: float = 0.0
    epochs: int = 1
    mini_batch_size: int = 1024
    logprob_precision: str = "fp32"
    # "recompute": pi_old is the trainer's own recomputation (the paper's fix, §8); "rollout": pi_old is
    # the sampler's log-probs (the ablation arm that shows "phantom clipping"; TIS weights are then 1).
    old_logprobs: str = "recompute"

    def __post_init__(self):
        if self.old_logprobs not in OLD_LOGPROB_SOURCES:
            raise RunConfigError(f"ppo.old_logprobs {self.old_logprobs!r}: expected one of {OLD_LOGPROB_SOURCES}")
        if self.loss_aggregation not in LOSS_AGGREGATIONS:
            raise RunConfigError(f"ppo.loss_aggregation {self.loss_aggregation!r}: expected one of {LOSS_AGGREGATIONS}")
        if self.logprob_precision not in LOGPROB_PRECISIONS:
            raise RunConfigError(f"ppo.logprob_precision {self.logprob_precision!r}: expected one of {LOGPROB_PRECISIONS}")
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise RunConfigError(f"ppo.dual_clip must be > 1, got {self.dual_clip}")


@dataclasses.dataclass(frozen=True)
class RFTConfig:
    """Rejection Fine-Tuning filter: keep reward > min_reward, no schema violations, no redundant loops."""

    min_reward: float = 0.0
    drop_schema_violations: bool = True
    drop_redundant_loops: bool = True


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How the rollout sampler draws tokens, and therefore the distribution the trainer scores:
    one setting for both, so that the trainer's recomputed log-probs use the sampler's
    temperature. temperature 0 is greedy; top_k 0 and top_p 1.0 are off. The trainer scores the
    full tempered distribution (no top-k/top-p truncation)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if self.temperature < 0:
            raise RunConfigError(f"sampling.temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0 or not 0.0 < self.top_p <= 1.0:
            raise RunConfigError(f"sampling: top_k must be >= 0 and top_p in (0, 1], got {self.top_k} and {self.top_p}")

    @property
    def scoring_temperature(self) -> float:
        """The temperature the trainer divides logits by (greedy sampling is scored at 1)."""
        return self.temperature if self.temperature > 0 else 1.0


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Batching and length. `global_batch_size` trajectories per step, split into micro-batches of
    `micro_batch_size` for gradient accumulation (None = no accumulation)."""

    seq_len: int
    global_batch_size: int
    micro_batch_size: int | None = None
    steps: int = 150
    logprob_chunk_size: int = 1024
    seed: int = 0

    def __post_init__(self):
        if self.micro_batch_size is not None and self.global_batch_size % self.micro_batch_size:
            raise RunConfigError(
                f"train.global_batch_size={self.global_batch_size} is not a multiple of micro_batch_size={self.micro_batch_size}"
            )


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    directory: str = "~/.cache/cuda-agent/checkpoints/run"
    save_every: int = 10
    max_to_keep: int = 3


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """Multi-host start-up. `initialize`: "auto" (when the environment names a coordinator or a TPU pod),
    true (always), false (never). The address/count/id may come from the environment instead."""

    initialize: bool | str = "auto"
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """One stage of the pipeline `cuda-agent train --config` runs: `stage` (rft | value | ppo) on the
    trajectory parquet `data`, `steps` updates (PPO: iterations; default train.steps). Its actor and
    critic start from the latest earlier stage that trained them (random or --init-from otherwise)."""

    stage: str
    data: str
    steps: int | None = None

    def __post_init__(self):
        if self.stage not in PIPELINE_STAGES:
            raise RunConfigError(f"stages: unknown stage {self.stage!r}: expected one of {PIPELINE_STAGES}")
        if self.steps is not None and self.steps < 1:
            raise RunConfigError(f"stages: {self.stage} steps must be >= 1, got {self.steps}")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    name: str
    model: Any  # policy_jax.model_config.ModelConfig
    mesh: Any  # policy_jax.sharding.MeshConfig
    train: TrainConfig
    actor_optimizer: OptimizerConfig
    critic_optimizer: OptimizerConfig
    ppo: PPOConfig = PPOConfig()
    rft: RFTConfig = RFTConfig()
    sampling: SamplingConfig = SamplingConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    distributed: DistributedConfig = DistributedConfig()
    stages: tuple[StageSpec, ...] = ()


_SECTIONS = {
    "train": TrainConfig,
    "actor_optimizer": OptimizerConfig,
    "critic_optimizer": OptimizerConfig,
    "ppo": PPOConfig,
    "rft": RFTConfig,
    "sampling": SamplingConfig,
    "checkpoint": CheckpointConfig,
    "distributed": DistributedConfig,
}


def _check_type(section: str, key: str, value: Any, annotation: Any) -> Any:
    """Coerce ints to floats where a float is declared; reject other mismatches with one line."""
    hint = annotation
    allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union else (hint,)
    if value is None:
        if type(None) in allowed:
            return None
        raise RunConfigError(f"{section}.{key} may not be null")
    for kind in allowed:
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind in (bool, str) and isinstance(value, kind):
            return value
        if kind is Any:
            return value
    names = "/".join(getattr(k, "__name__", str(k)) for k in allowed)
    raise RunConfigError(f"{section}.{key}={value!r}: expected {names}")


def _build_section(section: str, cls: type, raw: Any) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise RunConfigError(f"section {section!r} must be a mapping, got {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise RunConfigError(f"unknown keys in {section}: {', '.join(map(str, unknown))} (known: {', '.join(fields)})")
    hints = typing.get_type_hints(cls)
    values = {k: _check_type(section, k, v, hints[k]) for k, v in raw.items()}
    missing = [n for n, f in fields.items() if n not in values and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise RunConfigError(f"section {section} is missing: {', '.join(missing)}")
    try:
        return cls(**values)
    except RunConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise RunConfigError(f"{section}: {e}") from None


def run_config_from_dict(raw: Mapping[str, Any]) -> RunConfig:
    """Validate and build a RunConfig from a parsed YAML mapping."""
    from policy_jax.model_config import ModelConfig
    from policy_jax.sharding import MeshConfig

    if not isinstance(raw, Mapping):
        raise RunConfigError("a run config must be a YAML mapping")
    known = {"name", "model", "mesh", "stages", *_SECTIONS}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise RunConfigError(f"unknown top-level keys: {', '.join(map(str, unknown))} (known: {', '.join(sorted(known))})")
    for required in ("model", "train", "actor_optimizer", "critic_optimizer"):
        if required not in raw:
            raise RunConfigError(f"missing section {required!r}")
    try:
        model = ModelConfig.from_yaml_dict(raw["model"] or {})
    except ValueError as e:
        raise RunConfigError(f"model: {e}") from None
    try:
        mesh = MeshConfig.from_dict(raw.get("mesh"))
    except (ValueError, TypeError) as e:
        raise RunConfigError(f"mesh: {e}") from None
    sections = {name: _build_section(name, cls, raw.get(name)) for name, cls in _SECTIONS.items()}
    return RunConfig(name=str(raw.get("name", "run")), model=model, mesh=mesh, stages=_stages(raw.get("stages")),
                     **sections)


def _stages(raw: Any) -> tuple[StageSpec, ...]:
    """The `stages` list: mappings {stage, data, steps}; each stage at most once."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise RunConfigError(f"stages must be a list of mappings, got {type(raw).__name__}")
    specs = tuple(_build_section("stages", StageSpec, item) for item in raw)
    names = [s.stage for s in specs]
    if len(set(names)) != len(names):
        raise RunConfigError(f"stages: each stage may appear once, got {names}")
    return specs


def load_run_config(path: str | Path, overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """Read a YAML run config. `overrides` maps dotted keys ("train.steps") to values applied before validation."""
    path = Path(path)
    if not path.is_file():
        raise RunConfigError(f"no config file at {path}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise RunConfigError(f"{path} is not valid YAML: {str(e).splitlines()[0]}") from None
    for dotted, value in (overrides or {}).items():
        section, _, key = dotted.partition(".")
        if not key:
            raise RunConfigError(f"override {dotted!r} must look like section.key")
        raw.setdefault(section, {})
        if not isinstance(raw[section], dict):
            raise RunConfigError(f"override {dotted!r}: {section} is not a section")
        raw[section][key] = value
    return run_config_from_dict(raw)
