"""The static stage of the filter: a task's source read as a syntax tree, in the parent; nothing runs.

A task is a torch computation, so the screen allows what such a file needs and refuses the
rest before the source reaches a worker process: imports other than torch, torch.nn,
torch.nn.functional, torch.nn.init and math (and a few names of typing); the builtins that
reach files, code or namespaces (`open`, `eval`, `getattr`, ...); attributes that load, save or
hand out memory or compiled code (`torch.load`, `.numpy()`, `torch.ops`, `torch.hub`, ...),
set torch's global state (`set_*`), reach frames or code (`gi_frame`, `f_globals`, ...), or
are private or dunder (but `__init__`); assignments to
attributes of anything but `self` (patching torch for the worker's next tasks); and the
statements that could outlast the worker's time limit or hide a failure (`while`, `try`,
`global`, async code). Rules judge names, however a module was aliased, so they hold for a
rebound `t = torch` too. A syntax error is its own stage.
"""

from __future__ import annotations

import ast

from .execution import Rejected

ALLOWED_IMPORTS = {"torch", "torch.nn", "torch.nn.functional", "torch.nn.init", "math"}
ALLOWED_FROM = {"__future__": None, "typing": {"Optional", "List", "Tuple", "Dict", "Union", "Any", "Sequence"}}
FORBIDDEN_NAMES = {
    "open": "file access", "exec": "runs code", "eval": "runs code", "compile": "runs code",
    "__import__": "imports", "getattr": "reaches attributes by name", "setattr": "patches objects",
    "delattr": "patches objects", "globals": "reaches a namespace", "locals": "reaches a namespace",
    "vars": "reaches a namespace", "dir": "reaches a namespace", "input": "reads the terminal",
    "breakpoint": "debugger", "help": "reads the terminal", "exit": "ends the process", "quit": "ends the process",
    "memoryview": "raw memory",
}
FORBIDDEN_ATTRIBUTES = {
    "load": "file access", "save": "file access", "from_file": "file access", "fromfile": "file access",
    "tofile": "file access", "numpy": "leaves torch", "storage": "raw memory", "untyped_storage": "raw memory",
    "hub": "network", "ops": "compiled code", "library": "compiled code", "classes": "compiled code",
    "cpp_extension": "compiled code", "utils": "torch.utils", "jit": "compiled code", "compile": "compiled code",
    "backends": "global state", "distributed": "processes", "multiprocessing": "processes",
    "serialization": "file access", "package": "file access", "fx": "code generation", "export": "code generation",
    "onnx": "file access", "overrides": "dispatch", "profiler": "global state", "get_type_hints": "runs code",
    "mro": "introspection",
}
INTROSPECTION_PREFIXES = ("f_", "gi_", "cr_", "ag_", "tb_", "co_")  # frames, generators, tracebacks, code
FORBIDDEN_STATEMENTS = {
    ast.While: "while loop", ast.Try: "try/except", ast.Global: "global", ast.Nonlocal: "nonlocal",
    ast.AsyncFunctionDef: "async code", ast.Await: "async code", ast.AsyncFor: "async code",
    ast.AsyncWith: "async code",
}
if hasattr(ast, "TryStar"):
    FORBIDDEN_STATEMENTS[ast.TryStar] = "try/except"
ALLOWED_DUNDERS = {"__init__", "__name__"}


def screen(source: str) -> None:
    """Raises Rejected ("syntax" or "screen") naming the first finding and its line; returns when the source is
    clean."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise Rejected("syntax", f"line {exc.lineno}: {exc.msg}") from None
    found = [(_place(node), finding) for node in ast.walk(tree) if (finding := _finding(node))]
    if found:
        (line, *_), finding = min(found)  # the first in reading order
        raise Rejected("screen", f"line {line}: {finding}")


def _place(node: ast.AST) -> tuple:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0), getattr(node, "end_col_offset", 0))


def _finding(node: ast.AST) -> str | None:
    if type(node) in FORBIDDEN_STATEMENTS:
        return f"{FORBIDDEN_STATEMENTS[type(node)]} is not allowed in a task"
    if isinstance(node, ast.Import):
        return next((f"import of {a.name} (a task imports only {', '.join(sorted(ALLOWED_IMPORTS))})"
                     for a in node.names if a.name not in ALLOWED_IMPORTS), None)
    if isinstance(node, ast.ImportFrom):
        return _import_from(node)
    if isinstance(node, ast.Name):
        return _name(node.id)
    if isinstance(node, ast.Attribute):
        return _attribute(node)
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
        return _patch(node)
    return None


def _import_from(node: ast.ImportFrom) -> str | None:
    module = "." * node.level + (node.module or "")
    if module in ALLOWED_FROM:
        allowed = ALLOWED_FROM[module]
        bad = [a.name for a in node.names if allowed is not None and a.name not in allowed]
        return f"from {module} import {bad[0]} is not allowed" if bad else None
    if module not in ALLOWED_IMPORTS:
        return f"import from {module} (a task imports only {', '.join(sorted(ALLOWED_IMPORTS))})"
    return next((found for found in map(_imported, (a.name for a in node.names)) if found), None)


def _imported(name: str) -> str | None:
    private = f"{name} (a private name)" if name.startswith("_") else None
    return _name(name) or _attribute_name(name) or private


def _name(name: str) -> str | None:
    if name in FORBIDDEN_NAMES:
        return f"{name} ({FORBIDDEN_NAMES[name]})"
    if name.startswith("__") and name not in ALLOWED_DUNDERS:
        return f"{name} (a dunder name)"
    return None


def _attribute_name(attr: str) -> str | None:
    if attr in FORBIDDEN_ATTRIBUTES:
        return f".{attr} ({FORBIDDEN_ATTRIBUTES[attr]})"
    if attr.startswith("set_"):
        return f".{attr} (sets torch's global state)"
    if attr.startswith(INTROSPECTION_PREFIXES):
        return f".{attr} (introspection)"
    return None


def _attribute(node: ast.Attribute) -> str | None:
    found = _attribute_name(node.attr)
    if found:
        return found
    if node.attr in ALLOWED_DUNDERS:
        return None
    if node.attr.startswith("__"):
        return f".{node.attr} (a dunder attribute)"
    if node.attr.startswith("_") and not _on_self(node):
        return f".{node.attr} (a private attribute)"
    return None


def _on_self(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id == "self"


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node


def _patch(node: ast.stmt) -> str | None:
    targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
    for target in (t for top in targets for t in ast.walk(top)):
        if isinstance(target, (ast.Attribute, ast.Subscript)) and isinstance(target.ctx, (ast.Store, ast.Del)):
            root = _root(target)
            if not (isinstance(root, ast.Name) and root.id == "self") and isinstance(target, ast.Attribute):
                return f"assigns to an attribute of {ast.unparse(root)} (only self's own attributes may be set)"
    return None
