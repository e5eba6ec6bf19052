"""Settings of one agent episode, with the paper's values as named defaults.

A YAML file under `configs/agent*.yaml` overrides any field; `load_agent_config` reads one by
path or by name (`agent`, `agent_eval`, `agent_tiny`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuda_agent.contracts import JobError, Timeouts, check_job_settings

# Paper (arXiv 2602.24286, docs/paper.md §7): up to 150 agent turns in training, 200 in evaluation,
# agentic context of 131,072 tokens.
PAPER_MAX_TURNS_TRAINING = 150
PAPER_MAX_TURNS_EVALUATION = 200
PAPER_AGENTIC_CONTEXT_TOKENS = 131_072


@dataclass(frozen=True)
class SandboxLimits:
    """The jail and resource limits of every command the agent runs (agent/sandbox.py)."""

    cpu_seconds: int = 600
    memory_bytes: int = 8 * 1024**3
    max_processes: int = 256
    max_file_bytes: int = 512 * 1024**2
    no_network: bool = True
    # When the agent process is root, commands run as an unprivileged uid of their own
    # (uid_base + slot): they cannot write the harness files, other workspaces or the host.
    uid_base: int = 200_000
    # Host folders shown read-only in the jail besides the system folders (/usr, which holds
    # /usr/local/cuda), the agent's Python installation and the workspace: e.g. a Python with torch.
    read_only_paths: tuple[str, ...] = ()
    # Show the NVIDIA device nodes (and the driver's libraries) in the jail when the machine has them.
    gpu: bool = True
    # Refuse to run commands when the machine cannot build the whole jail (instead of running
    # them with the missing layers named in sandbox_report()).
    require_jail: bool = False


@dataclass(frozen=True)
class AgentConfig:
    """Everything an episode needs to know besides the task and the policy."""

    max_turns: int = PAPER_MAX_TURNS_TRAINING
    context_budget_tokens: int = PAPER_AGENTIC_CONTEXT_TOKENS
    max_new_tokens_per_turn: int = 8192
    bash_timeout_seconds: float = 120.0
    bash_timeout_max_seconds: float = 600.0
    tool_output_limit_bytes: int = 16_384
    # An episode is flagged as a redundant loop (RFT's pattern filter) when the same tool call
    # (name and arguments) is repeated this many times in a row.
    redundant_repeat_limit: int = 3
    backend: str = "auto"  # auto | cuda | host; auto is resolved on this machine when a command starts
    # How long a tool waits for the bridge: longer than the worker lets an evaluation run.
    evaluator_timeout_seconds: float = Timeouts().agent_wait_s
    # Per-job evaluation settings (only cuda_agent.contracts.JOB_SETTINGS; the rest is the worker's).
    evaluator_settings: dict[str, Any] = field(default_factory=dict)
    episodes_root: str = "/tmp/cuda-agent-episodes"
    sandbox: SandboxLimits = field(default_factory=SandboxLimits)

    def with_overrides(self, **changes: Any) -> "AgentConfig":
        """A copy with some fields replaced (None values are ignored)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


def _configs_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "configs"


def agent_config_from_dict(data: dict[str, Any]) -> AgentConfig:
    """Build a config from a mapping, refusing unknown keys with one clear message."""
    data = dict(data or {})
    known = {f.name for f in dataclasses.fields(AgentConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown agent config keys: {', '.join(unknown)}")
    sandbox = data.pop("sandbox", None) or {}
    known_sb = {f.name for f in dataclasses.fields(SandboxLimits)}
    unknown_sb = sorted(set(sandbox) - known_sb)
    if unknown_sb:
        raise ValueError(f"unknown agent sandbox keys: {', '.join(unknown_sb)}")
    try:
        check_job_settings(data.get("evaluator_settings"))
    except JobError as error:
        raise ValueError(f"agent config evaluator_settings: {error}") from None
    if "read_only_paths" in sandbox:
        sandbox["read_only_paths"] = tuple(sandbox["read_only_paths"] or ())
    return AgentConfig(**data, sandbox=SandboxLimits(**sandbox))


def load_agent_config(name_or_path: str | Path | None = None) -> AgentConfig:
    """Read `configs/<name>.yaml` or a YAML path; None gives the paper's training defaults."""
    import yaml

    if name_or_path is None:
        return AgentConfig()
    path = Path(name_or_path)
    if not path.suffix:
        path = _configs_dir() / f"{name_or_path}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"agent config not found: {path}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"agent config {path} must be a mapping")
    return agent_config_from_dict(data.get("agent", data))
