"""What crosses a package boundary, defined once: standard library only.

The evaluator, the bridge, the agent and the trainer import this module and never each other
for these things:

- `Status`: the six outcomes of an evaluation, and which of them are scored;
- `milestone_reward`: the paper's reward rule;
- backends: `auto` (the default of every command) and how it resolves on this machine;
- the evaluation job: its parts, the solution formats and backends, and `JOB_SETTINGS`, the
  only evaluation settings a job may carry (the rest is the worker's own configuration:
  caches, sandbox limits, tolerances);
- the result record: the fields other packages read, and accessors for them;
- `Timeouts`: every time limit of one evaluation, derived from two inputs;
- `EVALUATOR_HANDLERS`: the names the bridge's workers load the evaluator's services by.
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import functools
import os
from pathlib import Path
from typing import Any


class Status(str, enum.Enum):
    """The outcome of one evaluation. Its value is the string in the result record."""

    COMPILE_ERROR = "compile_error"  # the candidate does not build
    RUNTIME_ERROR = "runtime_error"  # it builds but raises, crashes or hangs
    INCORRECT = "incorrect"  # it runs but an output is wrong, or it broke a rule
    CORRECT = "correct"  # every check passed
    INFRA_ERROR = "infra_error"  # the harness failed: says nothing about the candidate
    TASK_ERROR = "task_error"  # the task is unusable: says nothing about the candidate


SCORED = frozenset({Status.COMPILE_ERROR, Status.RUNTIME_ERROR, Status.INCORRECT, Status.CORRECT})
UNSCORED = frozenset({Status.INFRA_ERROR, Status.TASK_ERROR})
BUILD_STATUSES = ("built", "compile_error", "infra_error")  # the outcome of a compile job


def is_scored(status: str | None) -> bool:
    """Whether a status is a verdict on the candidate (then it carries a reward)."""
    return status in SCORED  # Status is a str enum: plain strings match its members


# The paper's reward (CUDA Agent, section 3.4): -1 when wrong, 1 when correct, 2 when more than
# MARGIN faster than eager PyTorch, 3 when also more than MARGIN faster than torch.compile.
PAPER_MARGIN = 0.05


def beats(t: float, t_baseline: float, margin: float = PAPER_MARGIN) -> bool:
    """True when time t is more than `margin` (a fraction) below the baseline's time."""
    if not (t_baseline > 0):
        return False
    return (t_baseline - t) / t_baseline > margin


def milestone_reward(correct: bool, t: float | None, t_eager: float | None, t_compile: float | None, margin: float = PAPER_MARGIN) -> int:
    """The reward in {-1, 1, 2, 3}. A correct candidate without times (verify only) earns 1.

    The raw speed-up is deliberately not the reward (the paper's ablation). Unscored statuses
    get no reward at all (None in the record), never -1.
    """
    if not correct:
        return -1
    if t is None or t_eager is None:
        return 1
    faster_than_eager = beats(t, t_eager, margin)
    faster_than_compile = t_compile is not None and beats(t, t_compile, margin)
    if faster_than_eager and faster_than_compile:
        return 3
    return 2 if faster_than_eager else 1


# --- the evaluation job ---------------------------------------------------------------------
#
# job = {"task": {"name": str, "source": str},
#        "solution": {"format": one of SOLUTION_FORMATS, "files": {relative path: bytes}, "entry"?: str},
#        "settings": {key: value for key in JOB_SETTINGS},
#        "artifact"?: bytes}          # evaluate only: the extension a compile job built

SOLUTION_FORMATS = ("workspace", "kernelbench", "reference")
BACKENDS = ("cuda", "host")
# `auto` is every command's default: cuda when this machine shows a GPU, else host. A job may
# carry `auto` too; the worker that runs it resolves it on its own machine.
AUTO_BACKEND = "auto"
BACKEND_CHOICES = (AUTO_BACKEND, *BACKENDS)
# What a client may choose per job. Everything else (caches, sandbox limits, tolerances, the
# static checks, the torch guard) belongs to the worker: a job cannot weaken its own grading.
JOB_SETTINGS = frozenset({"backend", "profile", "repeats", "warmup", "compile_mode"})


class BackendError(ValueError):
    """A backend this machine cannot run; str() is one line saying what to do instead."""


@functools.lru_cache(maxsize=1)
def visible_gpu_count() -> int:
    """GPUs the CUDA driver shows this process (0 without a driver or with CUDA_VISIBLE_DEVICES empty)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        return 0
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def visible_gpu_names() -> list[str]:
    """The model name of each GPU the CUDA driver shows this process, in its order (empty without one)."""
    count = visible_gpu_count()
    if not count:
        return []
    driver = ctypes.CDLL("libcuda.so.1")  # loaded and initialised by visible_gpu_count
    names = []
    for ordinal in range(count):
        device, name = ctypes.c_int(0), ctypes.create_string_buffer(256)
        if driver.cuDeviceGet(ctypes.byref(device), ordinal) != 0 or driver.cuDeviceGetName(name, 256, device) != 0:
            names.append("unknown GPU")
        else:
            names.append(name.value.decode(errors="replace"))
    return names


def resolve_backend(backend: str | None, gpu_count=visible_gpu_count) -> str:
    """`auto` (or None) -> cuda when a GPU is visible, else host; cuda without a GPU is a BackendError."""
    backend = backend or AUTO_BACKEND
    if backend not in BACKEND_CHOICES:
        raise BackendError(f"unknown backend {backend!r} (expected one of {', '.join(BACKEND_CHOICES)})")
    if backend == AUTO_BACKEND:
        return "cuda" if gpu_count() > 0 else "host"
    if backend == "cuda" and gpu_count() == 0:
        raise BackendError("backend cuda needs an NVIDIA GPU and this machine shows none; "
                           "use --backend host or auto")
    return backend


class JobError(ValueError):
    """A job that does not have the shape above; str() is one line."""


def check_job_settings(settings: dict | None) -> dict:
    """The job's settings, or JobError naming the keys a job may not set."""
    settings = dict(settings or {})
    refused = sorted(set(settings) - JOB_SETTINGS)
    if refused:
        raise JobError(f"not settable per job: {', '.join(refused)} (a job may set {', '.join(sorted(JOB_SETTINGS))})")
    if "backend" in settings and settings["backend"] not in BACKEND_CHOICES:
        raise JobError(f"unknown backend {settings['backend']!r} (expected one of {', '.join(BACKEND_CHOICES)})")
    return settings


def evaluation_job(task_name: str, task_source: str, files: dict[str, bytes], settings: dict[str, Any], artifact: bytes | None = None, solution_format: str = "workspace") -> dict:
    """A job in the shape above (settings checked against JOB_SETTINGS)."""
    job = {
        "task": {"name": task_name, "source": task_source},
        "solution": {"format": solution_format, "files": dict(files)},
        "settings": check_job_settings(settings),
    }
    if artifact is not None:
        job["artifact"] = artifact
    return job


WORKSPACE_ENTRY = "model_new.py"  # the file of a workspace that defines ModelNew
MAX_SOLUTION_BYTES = 16 * 2**20
_SKIPPED_PARTS = {"__pycache__", "build", ".git"}


def read_solution_job(path: str | Path) -> dict:
    """The job's `solution` part from a workspace folder or a KernelBench .py file on disk.

    A workspace contributes model_new.py, its other .py files and everything under kernels/
    (hidden files, __pycache__, build/ and .git/ left out). JobError says what is wrong.
    """
    path = Path(path)
    if path.is_file():
        if path.suffix != ".py":
            raise JobError(f"solution {path}: expected a .py file defining ModelNew or a workspace folder")
        return {"format": "kernelbench", "files": {path.name: path.read_bytes()}, "entry": path.name}
    if not path.is_dir():
        raise JobError(f"solution {path}: no such file or folder")
    if not (path / WORKSPACE_ENTRY).is_file():
        raise JobError(f"solution {path}: workspace has no {WORKSPACE_ENTRY}")
    files, total = {}, 0
    for file in sorted(path.rglob("*")):
        rel = file.relative_to(path)
        if not file.is_file() or _SKIPPED_PARTS & set(rel.parts) or rel.name.startswith("."):
            continue
        if rel.parts[0] != "kernels" and rel.suffix != ".py":
            continue
        data = file.read_bytes()
        total += len(data)
        if total > MAX_SOLUTION_BYTES:
            raise JobError(f"solution {path}: more than {MAX_SOLUTION_BYTES // 2**20} MiB of sources")
        files[rel.as_posix()] = data
    return {"format": "workspace", "files": files, "entry": WORKSPACE_ENTRY}


# --- the result record ----------------------------------------------------------------------
#
# A JSON-able dict; the fields other packages read:
#   status      one Status value          reward      -1/1/2/3, or None when unscored
#   message     one line                  diagnostics [{"file", "line", "message"}]
#   times_us    {"candidate"|"eager"|"compile": {"median_us", ...} or None}
#   speedup     {"eager"|"compile": float or None}


def _number(value: Any) -> float | None:
    if isinstance(value, dict):
        value = value.get("median_us")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def record_time_us(record: dict, which: str) -> float | None:
    """The median time (µs) of "candidate", "eager" or "compile"; None when not timed."""
    times = record.get("times_us")
    return _number(times.get(which)) if isinstance(times, dict) else None


def record_speedup(record: dict, baseline: str) -> float | None:
    """The candidate's speed-up over "eager" or "compile"; None when not timed."""
    speedups = record.get("speedup")
    return _number(speedups.get(baseline)) if isinstance(speedups, dict) else None


def record_reward(record: dict) -> float | None:
    """The record's reward; None for unscored statuses and records without one."""
    if not is_scored(record.get("status")):
        return None
    return _number(record.get("reward"))


# --- time limits ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Timeouts:
    """Every time limit of one evaluation, derived from the two that are chosen.

    compile_s: one build; child_s: one request to an evaluation child (torch.compile of the
    baseline is the slowest). An evaluation makes at most CHILD_REQUESTS sequential requests
    after its build; the worker, and above it the agent, wait a margin longer than what they
    wait for, so that the inner limit always fires first and says what ran out.
    """

    compile_s: float = 300.0
    child_s: float = 300.0

    CHILD_REQUESTS = 2  # the longest chain: the candidate's load, then the baselines
    MARGIN_S = 30.0

    @property
    def evaluation_s(self) -> float:
        """The longest one evaluation can take: its build, then its child requests."""
        return self.compile_s + self.CHILD_REQUESTS * self.child_s

    @property
    def worker_job_s(self) -> float:
        """How long a bridge worker lets one evaluation run before it kills it."""
        return self.evaluation_s + self.MARGIN_S

    @property
    def agent_wait_s(self) -> float:
        """How long the agent waits for a result from the bridge."""
        return self.worker_job_s + self.MARGIN_S


# --- the evaluator's services on the bridge --------------------------------------------------

EVALUATOR_HANDLERS = {
    "compile": "evaluator_cuda.bridge_handlers:compile",
    "evaluate": "evaluator_cuda.bridge_handlers:evaluate",
}
