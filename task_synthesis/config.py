"""Settings of a synthesis run, with the paper's values as documented defaults.

The target composition is the paper's Table 3 (CUDA-Agent-Ops-6K): one operator 3.40 %, two
83.77 %, three 7.62 %, four 2.80 %, five 1.23 %, transformers modules 1.18 %. Decontamination
drops a task whose normalised-AST similarity to any evaluation program is at least 0.9. The
paper keeps tasks whose eager forward takes 1-100 ms on the target GPU; on the host backend the
window is a separate setting (small CPU runs are far faster than a GPU task of record).

The run's workers share one GPU: a candidate that runs out of GPU memory is tried again later,
`oom_retries` times at most, then rejected at stage `gpu_memory`. A programmatic candidate whose
eager forward runs below the window's low end is drawn again with its batch multiplied by
ceil(1.5 x low / measured), at most `batch_scale_max` (1: never) and only as far as its planned
memory stays within `memory_bytes`.

The evaluator's self-check of a candidate times it with less than a grading does (`evaluation`, per
backend): on cuda two check sets, the paper's 10 timed calls after 3 warm-ups, 128 MiB of distinct timed
inputs and a second of baseline rounds. Its eager and compile times are the data set's metadata, not a reward, and
each evaluation's CPU time and host memory are what bound a run's tasks per hour (docs/task-synthesis.md).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

PAPER_COMPOSITION = {"1": 3.40, "2": 83.77, "3": 7.62, "4": 2.80, "5": 1.23, "transformers": 1.18}
PAPER_SIMILARITY_THRESHOLD = 0.9
# Near-duplicates among the kept tasks: the same operators in the same order, up to sizes. At the
# paper's 0.9 two tasks that differ in one operator of two are already "near": 6,000 two-operator
# drafts at the paper scale kept 329 tasks at 0.9 and 2,921 at 0.98 (3,035 distinct operator pairs).
DUPLICATE_THRESHOLD = 0.98
PAPER_WINDOW_MS = (1.0, 100.0)
HOST_WINDOW_MS = (0.001, 50.0)
CATEGORIES = tuple(PAPER_COMPOSITION)
# The evaluator settings a synthesis run may lighten for its self-checks (the rest are the run's own).
EVALUATION_KEYS = ("checks", "warmup", "repeats", "timed_checks", "fresh_input_bytes", "baseline_budget_s")
# Two check sets, not a grading's five: the in-process stages have already shown the task deterministic and
# input-dependent, and each set's inputs and outputs are held by the worker and both of the evaluator's children
# (at the 2 GiB bound, five sets overran the worker's 16 GiB memory group on the H200).
CUDA_EVALUATION = {"checks": 2, "warmup": 3, "repeats": 10, "timed_checks": 2, "fresh_input_bytes": 128 * 1024**2,
                   "baseline_budget_s": 1.0}
SCALES = ("small", "medium", "paper")


class ConfigError(ValueError):
    """A bad setting; str() is one line."""


@dataclasses.dataclass(frozen=True)
class SynthesisConfig:
    composition: dict = dataclasses.field(default_factory=lambda: dict(PAPER_COMPOSITION))
    similarity_threshold: float = PAPER_SIMILARITY_THRESHOLD  # decontamination against the evaluation programs
    duplicate_threshold: float = DUPLICATE_THRESHOLD  # a candidate this similar to a kept task is its near-duplicate
    scale: str = "small"
    window_ms: dict = dataclasses.field(default_factory=lambda: {"cuda": PAPER_WINDOW_MS, "host": HOST_WINDOW_MS})
    memory_bytes: int = 2 * 1024**3  # inputs + parameters + every intermediate tensor of one forward
    compile: bool = True  # the evaluator's torch.compile baseline must run (it also times eager and compile)
    evaluator: bool = True  # the evaluator's reference self-check must come out `correct`
    attempts_per_task: int = 20  # candidates tried per requested task before the run gives up
    oom_retries: int = 2  # further tries of a candidate that ran out of GPU memory, then a `gpu_memory` rejection
    batch_scale_max: int = 64  # the largest batch factor for a candidate below the window (1: no scale-up)
    # evaluator settings of the self-check per backend (EVALUATION_KEYS only, the evaluator's defaults for the rest);
    # a backend named in a config file replaces that backend's whole default
    evaluation: dict = dataclasses.field(default_factory=lambda: {"cuda": dict(CUDA_EVALUATION), "host": {}})

    def __post_init__(self):
        unknown = sorted(set(self.composition) - set(CATEGORIES))
        if unknown:
            raise ConfigError(f"unknown composition categories: {', '.join(unknown)} (known: {', '.join(CATEGORIES)})")
        if any(float(v) < 0 for v in self.composition.values()) or sum(self.composition.values()) <= 0:
            raise ConfigError("composition shares must be non-negative and not all zero")
        if not (0.0 < self.similarity_threshold <= 1.0 and 0.0 < self.duplicate_threshold <= 1.0):
            raise ConfigError("similarity_threshold and duplicate_threshold must be in (0, 1]")
        if self.scale not in SCALES:
            raise ConfigError(f"unknown scale {self.scale!r} (expected one of {', '.join(SCALES)})")
        for backend, window in self.window_ms.items():
            if len(window) != 2 or not 0 <= float(window[0]) < float(window[1]):
                raise ConfigError(f"window_ms.{backend} must be [low, high] with 0 <= low < high")
        if self.attempts_per_task < 1 or self.memory_bytes < 1 or self.batch_scale_max < 1:
            raise ConfigError("attempts_per_task, memory_bytes and batch_scale_max must be positive")
        if self.oom_retries < 0:
            raise ConfigError("oom_retries must be zero or more")
        for backend, values in self.evaluation.items():
            unknown = sorted(set(values) - set(EVALUATION_KEYS))
            if unknown:
                raise ConfigError(f"evaluation.{backend}: {', '.join(unknown)} cannot be set here "
                                  f"(only {', '.join(EVALUATION_KEYS)})")
            if any(isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 for v in values.values()):
                raise ConfigError(f"evaluation.{backend}: values must be non-negative numbers")

    def window(self, backend: str) -> tuple[float, float]:
        low, high = self.window_ms.get(backend, HOST_WINDOW_MS)
        return float(low), float(high)

    def evaluation_for(self, backend: str) -> dict:
        return dict(self.evaluation.get(backend) or {})

    def to_dict(self) -> dict:
        values = dataclasses.asdict(self)
        values["window_ms"] = {k: list(v) for k, v in self.window_ms.items()}
        return values

    @classmethod
    def from_dict(cls, values: dict) -> "SynthesisConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown settings: {', '.join(unknown)}")
        values = dict(values)
        if "composition" in values:
            values["composition"] = {str(k): float(v) for k, v in values["composition"].items()}
        if "window_ms" in values:
            values["window_ms"] = {**cls().window_ms, **{k: tuple(v) for k, v in values["window_ms"].items()}}
        if "evaluation" in values:
            values["evaluation"] = {**cls().evaluation, **{k: dict(v or {}) for k, v in values["evaluation"].items()}}
        return cls(**values)

    @classmethod
    def load(cls, path: str | Path | None, **overrides) -> "SynthesisConfig":
        """The yaml file's settings (None: the defaults), then the overrides that are not None."""
        import yaml

        values = {}
        if path is not None:
            path = Path(path)
            if not path.is_file():
                raise ConfigError(f"no such config file: {path}")
            try:
                values = yaml.safe_load(path.read_text()) or {}
            except yaml.YAMLError as exc:
                raise ConfigError(f"{path}: not valid yaml ({str(exc).splitlines()[0]})") from None
            if not isinstance(values, dict):
                raise ConfigError(f"{path}: expected a mapping of settings")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_dict(values)
