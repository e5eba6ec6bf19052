"""Read, Write, Edit and MultiEdit: file tools confined to the workspace."""

from __future__ import annotations

from typing import Any

from agent.tools.base import Tool, ToolContext, ToolFailure, truncate_text

READ_DEFAULT_LINES = 2000


class ReadTool(Tool):
    name = "Read"
    description = "Read a file of the workspace, with line numbers. offset is the first line (1-based), limit the number of lines."
    parameters = {
        "type": "object",
        "properties": {
            "file_path": {"type": "string"},
            "offset": {"type": "integer"},
            "limit": {"type": "integer"},
        },
        "required": ["file_path"],
    }

    async def run(self, context: ToolContext, arguments: dict[str, Any]) -> str:
        text = context.workspace.read_text(arguments["file_path"])
        lines = text.splitlines()
        first = max(int(arguments.get("offset") or 1), 1)
        count = max(int(arguments.get("limit") or READ_DEFAULT_LINES), 1)
        chosen = lines[first - 1 : first - 1 + count]
        if not chosen:
            return f"(no lines: the file has {len(lines)} lines)"
        numbered = "\n".join(f"{first + i:6d}\t{line}" for i, line in enumerate(chosen))
        return truncate_text(numbered, context.config.tool_output_limit_bytes)


class WriteTool(Tool):
    name = "Write"
    description = "Create or overwrite a file of the workspace with the given content."
    parameters = {
        "type": "object",
        "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["file_path", "content"],
    }

    async def run(self, context: ToolContext, arguments: dict[str, Any]) -> str:
        real = context.workspace.write_text(arguments["file_path"], arguments["content"])
        return f"Wrote {len(arguments['content'].encode())} bytes to {context.workspace.relative(real)}."


def apply_edit(text: str, old: str, new: str, replace_all: bool) -> str:
    """Replace `old` by `new` in `text`; `old` must occur exactly once unless `replace_all`."""
    if old == new:
        raise ToolFailure("old_string and new_string are the same")
    if old == "":
        raise ToolFailure("old_string must not be empty")
    count = text.count(old)
    if count == 0:
        raise ToolFailure("old_string was not found in the file")
    if count > 1 and not replace_all:
        raise ToolFailure(f"old_string occurs {count} times; give more context or set replace_all")
    return text.replace(old, new) if replace_all else text.replace(old, new, 1)


_EDIT_PROPERTIES = {
    "old_string": {"type": "string"},
    "new_string": {"type": "string"},
    "replace_all": {"type": "boolean"},
}


class EditTool(Tool):
    name = "Edit"
    description = "Replace old_string by new_string in a file (old_string must be unique unless replace_all)."
    parameters = {
        "type": "object",
        "properties": {"file_path": {"type": "string"}, **_EDIT_PROPERTIES},
        "required": ["file_path", "old_string", "new_string"],
    }

    async def run(self, context: ToolContext, arguments: dict[str, Any]) -> str:
        workspace = context.workspace
        workspace.resolve(arguments["file_path"], for_write=True)
        text = workspace.read_text(arguments["file_path"])
        edited = apply_edit(text, arguments["old_string"], arguments["new_string"], bool(arguments.get("replace_all")))
        real = workspace.write_text(arguments["file_path"], edited)
        return f"Edited {workspace.relative(real)}."


class MultiEditTool(Tool):
    name = "MultiEdit"
    description = "Apply several edits to one file in order; if any edit fails, the file is left unchanged."
    parameters = {
        "type": "object",
        "properties": {
            "file_path": {"type": "string"},
            "edits": {
                "type": "array",
                "items": {"type": "object", "properties": _EDIT_PROPERTIES, "required": ["old_string", "new_string"]},
            },
        },
        "required": ["file_path", "edits"],
    }

    async def run(self, context: ToolContext, arguments: dict[str, Any]) -> str:
        workspace = context.workspace
        workspace.resolve(arguments["file_path"], for_write=True)
        text = workspace.read_text(arguments["file_path"])
        if not arguments["edits"]:
            raise ToolFailure("edits is empty")
        for index, edit in enumerate(arguments["edits"], 1):
            try:
                text = apply_edit(text, edit["old_string"], edit["new_string"], bool(edit.get("replace_all")))
            except ToolFailure as failure:
                raise ToolFailure(f"edit {index}: {failure}; no edit was applied") from None
        real = workspace.write_text(arguments["file_path"], text)
        return f"Applied {len(arguments['edits'])} edits to {workspace.relative(real)}."


