"""What every tool has: a name, a description, a JSON schema for its arguments, and `run`.

`ToolContext` is the episode's state the tools share: the workspace, the config, the
evaluator gateway, background commands and the evaluator records seen so far.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.config import AgentConfig
from agent.workspace import Workspace


class EvaluatorGateway(Protocol):
    """Anything that submits a job to an evaluator service and returns its reply (the bridge client)."""

    async def submit(self, service: str, job: dict, timeout: float | None = None) -> dict: ...


@dataclass
class EvaluationRecord:
    """One evaluator reply seen in the episode, with the solution files it graded."""

    tool: str
    files: dict[str, bytes]
    record: dict[str, Any]
    seconds: float


@dataclass
class ToolContext:
    workspace: Workspace
    config: AgentConfig
    evaluator: EvaluatorGateway | None = None
    background: dict[str, Any] = field(default_factory=dict)
    evaluations: list[EvaluationRecord] = field(default_factory=list)
    artifacts: dict[str, bytes] = field(default_factory=dict)  # files hash -> built extension
    # Passed to the bridge with every job: identical jobs with the same salt share one
    # evaluation (the broker deduplicates); a per-episode salt gives each episode its own.
    evaluator_salt: str | None = None
    evaluator_seconds: float = 0.0  # agent-side wall time of evaluator calls (bridge included)
    evaluator_worker_seconds: float = 0.0  # the evaluator's own wall time, as its records report


class ToolFailure(Exception):
    """A tool could not do what was asked; the message goes back to the policy."""


class Tool:
    """Base class; subclasses set `name`, `description`, `parameters` and implement `run`."""

    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}, "required": []}

    def schema(self) -> dict[str, Any]:
        """The OpenAI/Hermes function schema of this tool."""
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    async def run(self, context: ToolContext, arguments: dict[str, Any]) -> str:
        raise NotImplementedError


_JSON_TYPES = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


def schema_errors(schema: dict[str, Any], value: Any, where: str = "arguments") -> list[str]:
    """Violations of a (small subset of) JSON schema: type, required, properties, items, enum.

    Unknown properties are violations (`additionalProperties` is treated as false).
    """
    kind = schema.get("type")
    if kind:
        types = _JSON_TYPES[kind]
        ok = isinstance(value, types) and not (kind in ("integer", "number") and isinstance(value, bool))
        if not ok:
            return [f"{where} must be of type {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{where} must be one of {schema['enum']}"]
    errors: list[str] = []
    if kind == "object":
        properties = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                errors.append(f"{where} is missing required '{name}'")
        for name, item in value.items():
            if name not in properties:
                errors.append(f"{where} has unknown property '{name}'")
            else:
                errors += schema_errors(properties[name], item, f"{where}.{name}")
    if kind == "array" and "items" in schema:
        for index, item in enumerate(value):
            errors += schema_errors(schema["items"], item, f"{where}[{index}]")
    return errors


def truncate_text(data: bytes | str, limit_bytes: int, total_bytes: int | None = None) -> str:
    """Keep the head and tail of an output, with a note of how many bytes were cut in between.

    `total_bytes` is the true size when `data` is itself only a prefix of the output.
    """
    raw = data.encode("utf-8", errors="replace") if isinstance(data, str) else data
    total = max(total_bytes or 0, len(raw))
    if total <= limit_bytes:
        return raw.decode("utf-8", errors="replace")
    half = limit_bytes // 2
    head = raw[:half]
    tail = raw[-half:] if len(raw) == total else b""
    cut = total - len(head) - len(tail)
    return head.decode("utf-8", errors="replace") + f"\n[... {cut} bytes cut ...]\n" + tail.decode("utf-8", errors="replace")
