"""Glob and Grep over the workspace (symlinks are never followed out of it)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from agent.tools.base import Tool, ToolContext, ToolFailure, truncate_text
from agent.workspace import Workspace, WorkspaceError

GREP_MAX_MATCHES = 200
GREP_MAX_FILE_BYTES = 2 * 1024 * 1024


def glob_to_regex(pattern: str) -> re.Pattern[str]:
    """A regex for a glob over '/'-separated relative paths: `**/` spans directories, `*` and `?` stay in one."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]*/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def workspace_files(workspace: Workspace, base: Path) -> list[Path]:
    """Regular files under `base` (a real directory inside the workspace), symlinks skipped."""
    found = []
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                found.append(path)
    return found


def _base_directory(workspace: Workspace, path: str | None) -> Path:
    base = workspace.resolve(path or ".")
    if not base.exists():
        raise ToolFailure(f"{path} does not exist")
    return base


class GlobTool(Tool):
    name = "Glob"
    description = "List workspace files matching a glob pattern such as 'kernels/*.cu' or '**/*.py'."
    parameters = {
        "type": "object",
        "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
        "required": ["pattern"],
    }

    async def run(self, context: ToolContext, arguments: dict[str, Any]) -> str:
        pattern = arguments["pattern"]
        if pattern.startswith("/") or ".." in Path(pattern).parts:
            raise WorkspaceError("glob pattern must be relative to the workspace and must not contain '..'")
        base = _base_directory(context.workspace, arguments.get("path"))
        if not base.is_dir():
            raise ToolFailure(f"{arguments.get('path')} is not a directory")
        regex = glob_to_regex(pattern)
        matches = [
            context.workspace.relative(p) for p in workspace_files(context.workspace, base) if regex.match(p.relative_to(base).as_posix())
        ]
        if not matches:
            return "No files matched."
        return truncate_text("\n".join(matches), context.config.tool_output_limit_bytes)


class GrepTool(Tool):
    name = "Grep"
    description = "Search workspace files for a regular expression; prints file:line:text for each match."
    parameters = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string"},
            "path": {"type": "string"},
            "glob": {"type": "string"},
            "ignore_case": {"type": "boolean"},
        },
        "required": ["pattern"],
    }

    async def run(self, context: ToolContext, arguments: dict[str, Any]) -> str:
        try:
            regex = re.compile(arguments["pattern"], re.IGNORECASE if arguments.get("ignore_case") else 0)
        except re.error as error:
            raise ToolFailure(f"invalid regular expression: {error}") from None
        base = _base_directory(context.workspace, arguments.get("path"))
        files = [base] if base.is_file() else workspace_files(context.workspace, base)
        name_filter = glob_to_regex(arguments["glob"]) if arguments.get("glob") else None
        lines: list[str] = []
        for path in files:
            if name_filter and not (name_filter.match(path.name) or name_filter.match(context.workspace.relative(path))):
                continue
            try:
                fd = context.workspace.open_regular(path, context.workspace.relative(path))
            except WorkspaceError:
                continue  # swapped for a link, a FIFO or removed since the walk
            with os.fdopen(fd, "rb") as handle:
                data = handle.read(GREP_MAX_FILE_BYTES + 1)
            if len(data) > GREP_MAX_FILE_BYTES:
                continue
            if b"\x00" in data:
                continue
            for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
                if regex.search(line):
                    lines.append(f"{context.workspace.relative(path)}:{number}:{line}")
                    if len(lines) >= GREP_MAX_MATCHES:
                        lines.append(f"[stopped at {GREP_MAX_MATCHES} matches]")
                        return truncate_text("\n".join(lines), context.config.tool_output_limit_bytes)
        return truncate_text("\n".join(lines), context.config.tool_output_limit_bytes) if lines else "No matches."
