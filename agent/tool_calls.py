"""Tool calls in the policy's text, Hermes/Qwen style.

The policy writes, anywhere in its turn, one or more blocks

    <tool_call>
    {"name": "Bash", "arguments": {"command": "ls kernels"}}
    </tool_call>

`parse_tool_calls` returns the well-formed calls in order and, for every malformed block, a
`ToolCallError` whose message goes back to the policy (and counts as a schema violation).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)(" + re.escape(TOOL_CALL_CLOSE) + r"|$)", re.S)


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call: a tool name and its JSON arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def key(self) -> str:
        """A canonical string of the call (used to spot the same call repeated)."""
        return self.name + json.dumps(self.arguments, sort_keys=True)


@dataclass(frozen=True)
class ToolCallError:
    """A block that is not a valid call; `message` is what the policy is told."""

    raw: str
    message: str


def _parse_block(body: str) -> ToolCall | ToolCallError:
    text = body.strip()
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as error:
        return ToolCallError(text, f"tool call is not valid JSON ({error.msg} at line {error.lineno} column {error.colno})")
    if not isinstance(payload, dict):
        return ToolCallError(text, 'tool call must be a JSON object {"name": ..., "arguments": {...}}')
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return ToolCallError(text, 'tool call needs a string "name"')
    arguments = payload.get("arguments", {})
    if not isinstance(arguments, dict):
        return ToolCallError(text, f'"arguments" of {name} must be a JSON object')
    extra = sorted(set(payload) - {"name", "arguments"})
    if extra:
        return ToolCallError(text, f"tool call has unexpected keys: {', '.join(extra)}")
    return ToolCall(name, arguments)


def parse_tool_calls(text: str) -> tuple[list[ToolCall | ToolCallError], int]:
    """All `<tool_call>` blocks of a turn, in order, and how many of them are malformed.

    A block left open at the end of the text (the policy stopped mid-call) is malformed.
    A stray `</tool_call>` with no opening tag is ignored.
    """
    items: list[ToolCall | ToolCallError] = []
    for match in _BLOCK.finditer(text):
        body, close = match.group(1), match.group(2)
        if not close:
            items.append(ToolCallError(body.strip(), "tool call was not closed with </tool_call>"))
            continue
        items.append(_parse_block(body))
    violations = sum(isinstance(item, ToolCallError) for item in items)
    return items, violations


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The text of one call in the format the parser reads (used by scripted policies)."""
    return f"{TOOL_CALL_OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{TOOL_CALL_CLOSE}"
