"""The ablation config: a run config for the models and PPO, the arms, seeds, task, warm start and collapse rule.

    name: ablation_tiny
    iterations: 2               # on-policy PPO iterations per arm and seed
    checkpoint_every: 1         # iterations between an arm's checkpoints (and after its last); a stop
                                # loses at most the iterations since the last one
    seeds: [0, 1]               # rollout and mini-batch seeds; every seed starts from the same checkpoint
    output_dir: runs/ablations/tiny
    task: {max_operand: 4, max_new_tokens: 4}
    warm_start: {episodes: 64, rft_steps: 4, value_steps: 4, sampler_head: bf16}
    collapse: {rule: reward_drop_with_ratio_std, reward_fraction: 0.5, ratio_std: 0.1, ratio_of: update}
    arm_defaults: {sampler_head: bf16, old_logprobs: fp32, tis: true, rft_init: true, value_pretraining: true}
    arms:
      - {name: paper}
      - {name: rollout-old, old_logprobs: rollout}
    run: {model: ..., train: ..., ppo: ..., ...}   # a run config (policy_jax/run_config.py)

Each arm's PPO settings are the run config's, with `ppo.logprob_precision`, `ppo.old_logprobs` and
`ppo.tis_cap` set from the arm. One error line (AblationConfigError) for anything unusable.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

import yaml

from ablations.collapse import CollapseRule
from ablations.task import TASK_VOCAB, AdditionTask

SAMPLER_HEADS = ("bf16", "fp32")
OLD_LOGPROBS = ("fp32", "bf16", "rollout")


class AblationConfigError(ValueError):
    """An ablation config that cannot be run (one clear line for the user)."""


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm: the sampler's head precision, where pi_old comes from, TIS, and the starting point.

    old_logprobs: "fp32" / "bf16" = the trainer recomputes them with an FP32 / bf16 head (the trainer's
    current log-probs use the same head); "rollout" = the sampler's own (trainer FP32 head).
    """

    name: str
    sampler_head: str = "bf16"
    old_logprobs: str = "fp32"
    tis: bool = True
    rft_init: bool = True
    value_pretraining: bool = True

    def __post_init__(self):
        if self.sampler_head not in SAMPLER_HEADS:
            raise AblationConfigError(f"arm {self.name}: sampler_head {self.sampler_head!r}: "
                                      f"expected one of {SAMPLER_HEADS}")
        if self.old_logprobs not in OLD_LOGPROBS:
            raise AblationConfigError(f"arm {self.name}: old_logprobs {self.old_logprobs!r}: "
                                      f"expected one of {OLD_LOGPROBS}")

    @property
    def sampler_logits_precision(self) -> str:
        """The sampler's `logits_precision`: "compute" is the model's compute dtype (bf16)."""
        return "fp32" if self.sampler_head == "fp32" else "compute"

    def ppo_overrides(self, tis_cap: float | None) -> dict[str, Any]:
        return {"logprob_precision": "bf16" if self.old_logprobs == "bf16" else "fp32",
                "old_logprobs": "rollout" if self.old_logprobs == "rollout" else "recompute",
                "tis_cap": tis_cap if self.tis else None}

    def settings(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "name"}


@dataclasses.dataclass(frozen=True)
class WarmStart:
    """RFT initialisation and value pretraining, shared by the arms that use them: `episodes` rollouts from
    the starting checkpoint (RFT keeps the rewarded ones), `rft_steps` actor updates, then `episodes`
    rollouts from the RFT actor for `value_steps` critic updates."""

    episodes: int = 64
    rft_steps: int = 4
    value_steps: int = 4
    sampler_head: str = "bf16"


@dataclasses.dataclass(frozen=True)
class AblationConfig:
    name: str
    iterations: int
    seeds: tuple[int, ...]
    output_dir: str
    task: AdditionTask
    warm_start: WarmStart
    collapse: CollapseRule
    arms: tuple[Arm, ...]
    run: Any  # policy_jax.run_config.RunConfig (the arms' PPO settings replace three of its keys)
    raw: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)
    checkpoint_every: int = 1

    def arm_run_config(self, arm: Arm):
        ppo = dataclasses.replace(self.run.ppo, **arm.ppo_overrides(self.run.ppo.tis_cap))
        return dataclasses.replace(self.run, name=f"{self.name}/{arm.name}", ppo=ppo)


_KEYS = {"name", "iterations", "checkpoint_every", "seeds", "output_dir", "task", "warm_start", "collapse",
         "arm_defaults", "arms", "run"}


def _section(name: str, cls: type, raw: Any, **extra) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise AblationConfigError(f"{name} must be a mapping, got {type(raw).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise AblationConfigError(f"unknown keys in {name}: {', '.join(map(str, unknown))} "
                                  f"(known: {', '.join(sorted(known))})")
    try:
        return cls(**{**raw, **extra})
    except AblationConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise AblationConfigError(f"{name}: {e}") from None


def _arms(raw: Any, defaults: Any) -> tuple[Arm, ...]:
    if not isinstance(raw, list) or not raw:
        raise AblationConfigError("arms must be a non-empty list of mappings, each with a name")
    if not isinstance(defaults or {}, Mapping) or "name" in (defaults or {}):
        raise AblationConfigError("arm_defaults must be a mapping without a name")
    arms = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str) or not item["name"]:
            raise AblationConfigError(f"arms[{i}] must be a mapping with a non-empty name")
        if "/" in item["name"] or item["name"] in (".", ".."):
            raise AblationConfigError(f"arm name {item['name']!r} cannot name its checkpoint folder")
        arms.append(_section(f"arm {item['name']}", Arm, {**(defaults or {}), **item}))
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise AblationConfigError(f"arm names must be unique, got {names}")
    return tuple(arms)


def _positive_int(raw: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise AblationConfigError(f"{key} must be a positive integer, got {value!r}")
    return value


def seeds_from(raw: Any) -> tuple[int, ...]:
    if not isinstance(raw, list) or not raw or not all(isinstance(s, int) and not isinstance(s, bool) for s in raw):
        raise AblationConfigError(f"seeds must be a non-empty list of integers, got {raw!r}")
    if len(set(raw)) != len(raw):
        raise AblationConfigError(f"seeds must be distinct, got {raw}")
    return tuple(raw)


def _run(raw: Any):
    from policy_jax.run_config import RunConfigError, run_config_from_dict

    try:
        return run_config_from_dict(raw if raw is not None else {})
    except RunConfigError as e:
        raise AblationConfigError(f"run: {e}") from None


def _check_consistent(cfg: AblationConfig) -> None:
    model, train = cfg.run.model, cfg.run.train
    if any(a.sampler_head == "bf16" for a in cfg.arms + (Arm("warm_start", cfg.warm_start.sampler_head),)) \
            and model.compute_dtype != "bfloat16":
        raise AblationConfigError(f"a bf16 sampler head needs run.model.compute_dtype: bfloat16, "
                                  f"got {model.compute_dtype}")
    if model.vocab_size < TASK_VOCAB:
        raise AblationConfigError(f"run.model.vocab_size={model.vocab_size} is smaller than the task's "
                                  f"{TASK_VOCAB} tokens")
    if train.seq_len < cfg.task.longest_row:
        raise AblationConfigError(f"run.train.seq_len={train.seq_len} is shorter than the task's longest row "
                                  f"({cfg.task.longest_row} tokens)")
    if model.max_position_embeddings <= cfg.task.longest_row + 8:
        raise AblationConfigError("run.model.max_position_embeddings must exceed the task's longest row by more than 8")
    if train.global_batch_size % min(cfg.run.ppo.mini_batch_size, train.global_batch_size):
        raise AblationConfigError(f"run.train.global_batch_size={train.global_batch_size} (episodes per iteration) "
                                  f"is not a multiple of run.ppo.mini_batch_size={cfg.run.ppo.mini_batch_size}")
    if any(a.tis for a in cfg.arms) and cfg.run.ppo.tis_cap is None:
        raise AblationConfigError("an arm with tis: true needs run.ppo.tis_cap (the cap)")


def ablation_config_from_dict(raw: Any) -> AblationConfig:
    if not isinstance(raw, Mapping):
        raise AblationConfigError("an ablation config must be a YAML mapping")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise AblationConfigError(f"unknown top-level keys: {', '.join(map(str, unknown))} "
                                  f"(known: {', '.join(sorted(_KEYS))})")
    name = str(raw.get("name", "ablation"))
    cfg = AblationConfig(
        name=name, iterations=_positive_int(raw, "iterations"), seeds=seeds_from(raw.get("seeds", [0])),
        output_dir=str(raw.get("output_dir", f"runs/ablations/{name}")),
        task=_section("task", AdditionTask, raw.get("task")),
        warm_start=_section("warm_start", WarmStart, raw.get("warm_start")),
        collapse=_section("collapse", CollapseRule, raw.get("collapse")),
        arms=_arms(raw.get("arms"), raw.get("arm_defaults")), run=_run(raw.get("run")), raw=dict(raw),
        checkpoint_every=_positive_int(raw, "checkpoint_every", 1))
    if cfg.warm_start.sampler_head not in SAMPLER_HEADS:
        raise AblationConfigError(f"warm_start.sampler_head {cfg.warm_start.sampler_head!r}: "
                                  f"expected one of {SAMPLER_HEADS}")
    _check_consistent(cfg)
    return cfg


def load_ablation_config(path: str | Path) -> AblationConfig:
    path = Path(path)
    if not path.is_file():
        raise AblationConfigError(f"no config file at {path}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise AblationConfigError(f"{path} is not valid YAML: {str(e).splitlines()[0]}") from None
    return ablation_config_from_dict(raw)
