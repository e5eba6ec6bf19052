"""Structured compiler diagnostics: file, line, message, from gcc/clang, nvcc and the linker.

    gcc/clang:  /abs/src/kernels/op.cpp:12:5: error: expected ';' before '}' token
    nvcc:       /abs/src/kernels/op.cu(12): error: identifier "x" is undefined
    linker:     undefined reference to `op_launcher'      (no file/line)
Paths inside the build tree are mapped back to the workspace's relative paths. A name missing
from torch's namespaces (`'emptyy' is not a member of 'torch'`) is reported as an unknown name,
with the torch name it most likely meant. shown_to_agent() keeps what reaches the agent to
workspace files and bounded in size.
"""

from __future__ import annotations

import re

_GCC = re.compile(r"^(?P<file>[^\s:][^:]*?):(?P<line>\d+):(?:(?P<col>\d+):)?\s*(?:fatal )?error:\s*(?P<msg>.*)$")
_NVCC = re.compile(r"^(?P<file>[^\s(][^(]*?)\((?P<line>\d+)\):\s*(?:catastrophic )?error:?\s*(?P<msg>.*)$")
_OTHER = re.compile(
    r"(undefined reference to .*|undefined symbol: .*|multiple definition of .*|ld returned .*|error: .*)")


def _relative(path: str, roots: list[str]) -> str:
    for root in roots:
        root = root.rstrip("/") + "/"
        if path.startswith(root):
            return path[len(root):]
    return path


def parse_compiler_output(text: str, roots: list[str] | None = None, limit: int = 50) -> list[dict]:
    """Errors found in compiler/linker output as [{"file", "line", "message"}], first error first.

    `roots`: build-tree prefixes to strip so files read as `kernels/op.cu`. Text with no
    recognisable error gives one diagnostic with file and line None and the last non-empty line.
    """
    roots = roots or []
    found: list[dict] = []
    seen = set()
    for raw in text.splitlines():
        line = raw.strip()
        match = _GCC.match(line) or _NVCC.match(line)
        if match:
            item = {"file": _relative(match["file"], roots), "line": int(match["line"]),
                    "message": explain_unknown_name(match["msg"].strip())}
        else:
            other = _OTHER.search(line)
            if not other or line.startswith(("FAILED:", "ninja:")):
                continue
            item = {"file": None, "line": None, "message": other.group(1).strip()}
        key = (item["file"], item["line"], item["message"])
        if key not in seen:
            seen.add(key)
            found.append(item)
        if len(found) >= limit:
            break
    if not found:
        lines = [l.strip() for l in text.splitlines() if l.strip()]
        found.append({"file": None, "line": None,
                      "message": lines[-1][:500] if lines else "build failed without output"})
    return found


MESSAGE_CHARS = 500
SHOWN_DIAGNOSTICS = 50
OUTSIDE = "an error in a file outside the workspace (its name and text are not shown)"


def shown_to_agent(diagnostics: list[dict], workspace_files, own_roots: tuple[str, ...] = ()) -> list[dict]:
    """Diagnostics as the agent may see them: a file is named only when it is one of the
    workspace's (or a harness placeholder such as `<slim-torch>/...`); an error located in any
    other file (an `#include "/abs/path"`, a system header) says so without its name or text,
    since its message can quote that file. A file under one of `own_roots` (where a KernelBench
    file's load_inline writes its own sources) is shown relative to it. Messages and the list are
    bounded."""
    known = set(workspace_files)
    shown: list[dict] = []
    for item in diagnostics[:SHOWN_DIAGNOSTICS]:
        file = item.get("file")
        message = str(item.get("message") or "")
        root = next((r for r in own_roots if file is not None and str(file).startswith(r)), None)
        if root is not None:
            file = str(file)[len(root):]
            known.add(file)
        if file is not None and not (file in known or str(file).startswith("<")):
            if shown and shown[-1]["message"] == OUTSIDE:
                continue
            shown.append({"file": None, "line": None, "message": OUTSIDE})
            continue
        if len(message) > MESSAGE_CHARS:
            message = message[:MESSAGE_CHARS] + " [...]"
        shown.append({"file": file, "line": item.get("line"), "message": message})
    return shown


_LOCATED = re.compile(r"^(?P<file>[^\s:][^:]*?):(?P<line>\d+): (?P<msg>.*)$", re.S)
_NOT_A_MEMBER = [
    re.compile(r"^[‘'`](?P<name>\w+)[’'] is not a member of [‘'`](?P<ns>(?:\w+::)*\w+)[’']"),  # gcc
    re.compile(r"^no member named '(?P<name>\w+)' in namespace '(?P<ns>(?:\w+::)*\w+)'"),  # clang
    re.compile(r'^namespace "(?P<ns>(?:\w+::)*\w+)" has no member "(?P<name>\w+)"'),  # nvcc
]
_TORCH_NAMESPACES = ("torch", "at", "c10")
UNKNOWN_NAME = "unknown name "  # how a rewritten message begins


def located(message: str) -> dict:
    """A `file:line: text` message (the static checks' form) as a diagnostic with its file and line."""
    match = _LOCATED.match(message)
    if not match:
        return {"file": None, "line": None, "message": message}
    return {"file": match["file"], "line": int(match["line"]), "message": match["msg"]}


def unknown_torch_name(message: str) -> str | None:
    """`torch::emptyy` when the compiler says a name is missing from torch's namespaces and torch has no such name."""
    from ..isolation.torch_names import is_unknown

    for pattern in _NOT_A_MEMBER:
        match = pattern.match(message)
        if match and match["ns"] in _TORCH_NAMESPACES and is_unknown(match["name"]):
            return f"{match['ns']}::{match['name']}"
    return None


def explain_unknown_name(message: str) -> str:
    """The compiler's message, said as an unknown name with the torch name it most likely meant."""
    from ..isolation.torch_names import closest

    name = unknown_torch_name(message)
    if name is None:
        return message
    namespace, short = name.split("::")
    guess = closest(short)
    hint = f"; did you mean {namespace}::{guess}?" if guess else ""
    return f"{UNKNOWN_NAME}{name}: not a torch function{hint} (compiler: {message})"
