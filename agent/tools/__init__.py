"""The agent's tools, one family per file, and `default_tools()` (the full set, in order)."""

from __future__ import annotations

from agent.tools.base import Tool, ToolContext, ToolFailure, schema_errors, truncate_text
from agent.tools.evaluator import CompileTool, ProfileTool, VerifyTool
from agent.tools.files import EditTool, MultiEditTool, ReadTool, WriteTool
from agent.tools.notebook import NotebookEditTool
from agent.tools.search import GlobTool, GrepTool
from agent.tools.shell import BashOutputTool, BashTool, KillBashTool


def default_tools() -> list[Tool]:
    """Bash, Read, Write, Edit, MultiEdit, Glob, Grep, BashOutput, KillBash, NotebookEdit, compile, verify, profile."""
    return [
        BashTool(),
        ReadTool(),
        WriteTool(),
        EditTool(),
        MultiEditTool(),
        GlobTool(),
        GrepTool(),
        BashOutputTool(),
        KillBashTool(),
        NotebookEditTool(),
        CompileTool(),
        VerifyTool(),
        ProfileTool(),
    ]


__all__ = ["Tool", "ToolContext", "ToolFailure", "default_tools", "schema_errors", "truncate_text"]
