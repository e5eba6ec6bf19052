"""Read, Write, Edit and MultiEdit: file tools confined to the workspace.

Only regular files are read or written (a FIFO, socket or device is refused without blocking,
see Workspace.open_regular). Read streams the file and keeps bounded amounts: lines longer than
READ_LINE_MAX_BYTES are cut, and it stops after READ_SCAN_MAX_BYTES, saying so. Tools that
need the whole file (Edit, MultiEdit, NotebookEdit) refuse files over WHOLE_FILE_MAX_BYTES.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from agent.tools.base import Tool, ToolContext, ToolFailure, truncate_text

READ_DEFAULT_LINES = 2000
READ_LINE_MAX_BYTES = 2000
READ_SCAN_MAX_BYTES = 16 * 1024 * 1024
_CHUNK = 64 * 1024


@dataclass
class LineSlice:
    """Lines [first, first + count) of a file: (number, text, length in bytes) each, and how the
    scan ended."""

    lines: list[tuple[int, str, int]]
    lines_seen: int  # lines that ended within the bytes scanned
    scanned: int
    at_end: bool  # the whole file was scanned
    last_complete: bool  # the last line kept ended within the scan (False: it goes on)


def read_line_slice(fd: int, first: int, count: int, line_max: int = READ_LINE_MAX_BYTES, scan_max: int = READ_SCAN_MAX_BYTES) -> LineSlice:
    """Stream `fd` for lines first..first+count-1 (1-based, split at '\\n', a trailing '\\r'
    dropped), keeping at most `line_max` bytes of each and reading at most `scan_max` bytes."""
    lines: list[tuple[int, str, int]] = []
    number = 0  # lines completed so far
    kept, length = bytearray(), 0  # the current line: its kept bytes and its true length so far
    scanned, at_end = 0, False

    def finish() -> None:
        text = bytes(kept).decode("utf-8", errors="replace")
        lines.append((number, text[:-1] if text.endswith("\r") else text, length))

    while len(lines) < count and scanned < scan_max:
        chunk = os.read(fd, min(_CHUNK, scan_max - scanned))
        if not chunk:
            at_end = True
            break
        scanned += len(chunk)
        start = 0
        skip = first - 1 - number  # whole lines still to pass over before the first wanted one
        if skip > 0 and chunk.count(b"\n") < skip:
            number += chunk.count(b"\n")
            continue
        while len(lines) < count:
            newline = chunk.find(b"\n", start)
            piece = chunk[start:] if newline < 0 else chunk[start:newline]
            if number + 1 >= first and len(kept) < line_max:
                kept += piece[: line_max - len(kept)]
            length += len(piece)
            if newline < 0:
                break
            number += 1
            if number >= first:
                finish()
            kept, length = bytearray(), 0
            start = newline + 1
    complete = True
    if length and len(lines) < count and number + 1 >= first:
        number += 1
        complete = at_end
        finish()
    return LineSlice(lines=lines, lines_seen=number, scanned=scanned, at_end=at_end, last_complete=complete)


class ReadTool(Tool):
    name = "Read"
    description = (
        "Read a file of the workspace, with line numbers. offset is the first line (1-based), limit the number of lines. "
        f"Lines longer than {READ_LINE_MAX_BYTES} bytes are cut; reading stops after {READ_SCAN_MAX_BYTES // (1024 * 1024)} MiB."
    )
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
        first = max(int(arguments.get("offset") or 1), 1)
        count = max(int(arguments.get("limit") or READ_DEFAULT_LINES), 1)
        fd, size = context.workspace.open_for_reading(arguments["file_path"])
        try:
            found = read_line_slice(fd, first, count)
        finally:
            os.close(fd)
        stopped = found.scanned if not found.at_end and (len(found.lines) < count or not found.last_complete) else None
        stop_note = f"\n[stopped reading at {stopped} of {size} bytes; use Bash (sed -n, tail, head -c) for the rest]" if stopped else ""
        if not found.lines:
            if found.at_end:
                return f"(no lines: the file has {found.lines_seen} lines)"
            return f"(no lines: line {first} is not within the first {found.scanned} bytes){stop_note}"
        rendered = "\n".join(f"{number:6d}\t{text}" for number, text, _ in found.lines)
        cut = [(number, length) for number, _, length in found.lines if length > READ_LINE_MAX_BYTES]
        notes = ""
        if cut:
            described = []
            for number, length in cut[:5]:
                open_ended = number == found.lines[-1][0] and not found.last_complete
                described.append(f"{number} ({'more than ' if open_ended else ''}{length} bytes)")
            more = f" and {len(cut) - 5} more" if len(cut) > 5 else ""
            notes = f"\n[lines cut to their first {READ_LINE_MAX_BYTES} bytes: {', '.join(described)}{more}]"
        return truncate_text(rendered, context.config.tool_output_limit_bytes) + notes + stop_note


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


