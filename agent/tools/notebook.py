"""NotebookEdit: replace, insert or delete one cell of a Jupyter notebook in the workspace.

A notebook is nbformat 4 JSON, read and written with the json module (no nbformat
dependency). The path is confined like every file tool's: it is resolved for writing before
anything is read, so traversal, absolute paths outside, links out and the harness files are
refused with the same messages Write and Edit give.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from agent.tools.base import Tool, ToolContext, ToolFailure

NOTEBOOK_SUFFIX = ".ipynb"
CELL_TYPES = ("code", "markdown")
EDIT_MODES = ("replace", "insert", "delete")
# nbformat 4.5 gives every cell an id; cells of older notebooks have none and are named by position.
_POSITIONAL_ID = re.compile(r"cell-(\d+)")
_LISTED_IDS = 20


def load_notebook(text: str, path: str) -> dict[str, Any]:
    """The notebook in `text`, checked to be an nbformat 4 document with a list of cells."""
    try:
        notebook = json.loads(text)
    except json.JSONDecodeError as error:
        raise ToolFailure(
            f"{path} is not a Jupyter notebook: invalid JSON ({error.msg} at line {error.lineno}, column {error.colno})"
        ) from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise ToolFailure(f"{path} is not a Jupyter notebook: expected a JSON object with a 'cells' list")
    if notebook.get("nbformat") != 4:
        raise ToolFailure(f"{path} is nbformat {notebook.get('nbformat')!r}; only nbformat 4 notebooks can be edited")
    for index, cell in enumerate(notebook["cells"]):
        if not isinstance(cell, dict) or not isinstance(cell.get("cell_type"), str):
            raise ToolFailure(f"{path} is not a valid notebook: cell {index} is not an object with a cell_type")
    return notebook


def source_lines(text: str) -> list[str]:
    """`text` as nbformat stores a multi-line string: lines that keep their newline."""
    parts = text.split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def find_cell(cells: list[dict[str, Any]], cell_id: str, path: str) -> int:
    """The index of the cell whose id is `cell_id`; a cell without an id is `cell-N` (its position)."""
    for index, cell in enumerate(cells):
        if cell.get("id") == cell_id:
            return index
    match = _POSITIONAL_ID.fullmatch(cell_id)
    if match and int(match.group(1)) < len(cells) and "id" not in cells[int(match.group(1))]:
        return int(match.group(1))
    known = [str(cell["id"]) for cell in cells if "id" in cell]
    if known:
        listing = ", ".join(known[:_LISTED_IDS]) + (f" (and {len(known) - _LISTED_IDS} more)" if len(known) > _LISTED_IDS else "")
    else:
        listing = "none (cells without an id are named cell-0, cell-1, ... by position)"
    raise ToolFailure(f"cell id {cell_id!r} was not found in {path}; its cell ids: {listing}")


def fresh_cell_id(cells: list[dict[str, Any]]) -> str:
    """A new nbformat 4.5 cell id (8 hex digits) no cell of the notebook has."""
    taken = {cell.get("id") for cell in cells}
    while True:
        candidate = uuid.uuid4().hex[:8]
        if candidate not in taken:
            return candidate


def new_cell(cell_type: str, source: str, cell_id: str) -> dict[str, Any]:
    cell: dict[str, Any] = {"cell_type": cell_type, "id": cell_id, "metadata": {}, "source": source_lines(source)}
    if cell_type == "code":
        cell["execution_count"] = None
        cell["outputs"] = []
    return cell


def set_cell_type(cell: dict[str, Any], cell_type: str) -> None:
    """Make `cell` a `cell_type` cell: a code cell has outputs and an execution count, others none."""
    if cell_type == "code":
        cell.pop("attachments", None)  # only markdown and raw cells carry attachments
        cell["execution_count"] = None
        cell["outputs"] = []
    else:
        cell.pop("execution_count", None)
        cell.pop("outputs", None)
    cell["cell_type"] = cell_type


class NotebookEditTool(Tool):
    name = "NotebookEdit"
    description = (
        "Edit one cell of a Jupyter notebook (.ipynb, nbformat 4) in the workspace. edit_mode replace (default): "
        "set the source of cell cell_id (a code cell's outputs and execution count are cleared; cell_type converts "
        "the cell). insert: add a new cell of cell_type (required) after cell cell_id, or at the start without "
        "cell_id; it gets a fresh id. delete: remove cell cell_id. Cells without an id are named cell-N (0-based position)."
    )
    parameters = {
        "type": "object",
        "properties": {
            "notebook_path": {"type": "string"},
            "cell_id": {"type": "string"},
            "new_source": {"type": "string"},
            "cell_type": {"type": "string", "enum": list(CELL_TYPES)},
            "edit_mode": {"type": "string", "enum": list(EDIT_MODES)},
        },
        "required": ["notebook_path"],
    }

    async def run(self, context: ToolContext, arguments: dict[str, Any]) -> str:
        workspace = context.workspace
        path = arguments["notebook_path"]
        mode = arguments.get("edit_mode", "replace")
        cell_type = arguments.get("cell_type")
        cell_id = arguments.get("cell_id")
        source = arguments.get("new_source")
        if mode not in EDIT_MODES:
            raise ToolFailure(f"edit_mode must be one of {', '.join(EDIT_MODES)}, not {mode!r}")
        if cell_type is not None and cell_type not in CELL_TYPES:
            raise ToolFailure(f"cell_type must be one of {', '.join(CELL_TYPES)}, not {cell_type!r}")
        if mode == "insert" and cell_type is None:
            raise ToolFailure("cell_type (code or markdown) is required to insert a cell")
        if mode != "insert" and cell_id is None:
            raise ToolFailure(f"cell_id is required to {mode} a cell")
        if mode != "delete" and source is None:
            raise ToolFailure(f"new_source is required to {mode} a cell")

        real = workspace.resolve(path, for_write=True)  # confinement and harness files first
        if real.suffix != NOTEBOOK_SUFFIX:
            raise ToolFailure(f"{path} is not a Jupyter notebook (a {NOTEBOOK_SUFFIX} file); use Edit or Write for other files")
        notebook = load_notebook(workspace.read_text(path), path)
        cells = notebook["cells"]
        note = ""
        if mode == "replace":
            index = find_cell(cells, cell_id, path)
            cell = cells[index]
            cell["source"] = source_lines(source)
            set_cell_type(cell, cell_type or cell["cell_type"])
            done = f"Replaced the source of {cell['cell_type']} cell {cell_id}"
            if cell["cell_type"] == "code":
                done += " (its outputs were cleared)"
        elif mode == "insert":
            position = find_cell(cells, cell_id, path) + 1 if cell_id is not None else 0
            minor = notebook.get("nbformat_minor")
            if not isinstance(minor, int) or minor < 5:
                # Cell ids exist from nbformat 4.5 on, where every cell must have one.
                for cell in cells:
                    if "id" not in cell:
                        cell["id"] = fresh_cell_id(cells)
                notebook["nbformat_minor"] = 5
                note = " The notebook was upgraded to nbformat 4.5: every cell now has an id (Read it to see them)."
            fresh = fresh_cell_id(cells)
            cells.insert(position, new_cell(cell_type, source, fresh))
            where = f"after cell {cell_id}" if cell_id is not None else "at the start"
            done = f"Inserted {cell_type} cell {fresh} {where}"
        else:
            index = find_cell(cells, cell_id, path)
            del cells[index]
            done = f"Deleted cell {cell_id}"
        workspace.write_text(path, json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
        return f"{done} of {workspace.relative(real)}; it has {len(cells)} cells.{note}"
