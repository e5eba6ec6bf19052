"""Dispatching parsed tool calls to tools, with the schema checks and statistics of an episode."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from agent.tool_calls import ToolCall, ToolCallError
from agent.tools.base import Tool, ToolContext, ToolFailure, schema_errors
from agent.workspace import WorkspaceError


@dataclass
class ToolStatistics:
    calls: int = 0
    schema_violations: int = 0
    failures: int = 0  # well-formed calls the tool refused or could not do
    seconds: float = 0.0
    per_tool: Counter = field(default_factory=Counter)


class Toolbox:
    """The tools of an episode by name; `execute` turns one parsed call into its response text."""

    def __init__(self, tools: list[Tool]):
        self.tools = {tool.name: tool for tool in tools}
        self.stats = ToolStatistics()

    async def execute(self, item: ToolCall | ToolCallError, context: ToolContext) -> str:
        """Run a call; malformed calls, unknown tools and bad arguments are schema violations."""
        if isinstance(item, ToolCallError):
            self.stats.schema_violations += 1
            return f"Error: {item.message}. Write calls as <tool_call>{{\"name\": ..., \"arguments\": {{...}}}}</tool_call>."
        self.stats.calls += 1
        self.stats.per_tool[item.name] += 1
        tool = self.tools.get(item.name)
        if tool is None:
            self.stats.schema_violations += 1
            return f"Error: unknown tool {item.name!r}; available tools: {', '.join(self.tools)}."
        problems = schema_errors(tool.parameters, item.arguments)
        if problems:
            self.stats.schema_violations += 1
            return f"Error: invalid arguments for {item.name}: " + "; ".join(problems) + "."
        start = time.monotonic()
        try:
            return await tool.run(context, item.arguments)
        except (ToolFailure, WorkspaceError) as failure:
            self.stats.failures += 1
            return f"Error: {failure}"
        except Exception as error:  # a tool's own bug must not end the episode
            self.stats.failures += 1
            return f"Error: {item.name} failed: {type(error).__name__}: {error}"
        finally:
            self.stats.seconds += time.monotonic() - start
