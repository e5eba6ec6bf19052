"""Bash, and commands left running in the background: BashOutput and KillBash."""

from __future__ import annotations

import itertools
from typing import Any

from agent.sandbox import BackgroundCommand, run_command
from agent.tools.base import Tool, ToolContext, ToolFailure, truncate_text

_background_ids = itertools.count(1)


class BashTool(Tool):
    name = "Bash"
    description = (
        "Run a bash command in the workspace directory, in a sandbox: it sees the workspace, read-only system "
        "folders and its own processes only; no network; resource-limited. "
        "Output is stdout and stderr merged, truncated in the middle when long. "
        "Set run_in_background to leave it running and read it later with BashOutput."
    )
    parameters = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The command line."},
            "timeout": {"type": "number", "description": "Seconds before the command is killed."},
            "description": {"type": "string", "description": "What the command does, in a few words."},
            "run_in_background": {"type": "boolean", "description": "Start it and return at once."},
        },
        "required": ["command"],
    }

    async def run(self, context: ToolContext, arguments: dict[str, Any]) -> str:
        config = context.config
        workspace = context.workspace
        command = arguments["command"]
        if arguments.get("run_in_background"):
            job = await BackgroundCommand.start(command, str(workspace.root), config.sandbox, workspace.sandbox_uid)
            job_id = f"bash_{next(_background_ids)}"
            context.background[job_id] = job
            return f"Started in the background with id {job_id}. Read its output with BashOutput."
        timeout = float(arguments.get("timeout") or config.bash_timeout_seconds)
        if timeout <= 0:
            raise ToolFailure("timeout must be positive")
        timeout = min(timeout, config.bash_timeout_max_seconds)
        result = await run_command(command, str(workspace.root), config.sandbox, workspace.sandbox_uid, timeout)
        text = truncate_text(result.output, config.tool_output_limit_bytes, result.total_output_bytes)
        if result.timed_out:
            return f"{text}\n[killed after the {timeout:g} s timeout]"
        return f"{text}\n[exit code {result.exit_code}]"


class BashOutputTool(Tool):
    name = "BashOutput"
    description = "New output of a background command started with Bash(run_in_background=true), and whether it still runs."
    parameters = {
        "type": "object",
        "properties": {"bash_id": {"type": "string", "description": "The id Bash returned."}},
        "required": ["bash_id"],
    }

    async def run(self, context: ToolContext, arguments: dict[str, Any]) -> str:
        job = context.background.get(arguments["bash_id"])
        if job is None:
            raise ToolFailure(f"no background command with id {arguments['bash_id']}")
        new = job.take_new_output()
        state = "running" if job.running else f"exited with code {job.process.returncode}"
        return f"{truncate_text(new, context.config.tool_output_limit_bytes)}\n[{state}]"


class KillBashTool(Tool):
    name = "KillBash"
    description = "Kill a background command (and everything it started)."
    parameters = {
        "type": "object",
        "properties": {"bash_id": {"type": "string", "description": "The id Bash returned."}},
        "required": ["bash_id"],
    }

    async def run(self, context: ToolContext, arguments: dict[str, Any]) -> str:
        job = context.background.pop(arguments["bash_id"], None)
        if job is None:
            raise ToolFailure(f"no background command with id {arguments['bash_id']}")
        await job.kill()
        return f"Killed {arguments['bash_id']}."
