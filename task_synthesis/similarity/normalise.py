"""A program as a sequence of normalised AST tokens.

What the normaliser removes: docstrings, comments and layout (the AST has none), the names a
program chooses itself (variables, parameters, functions, classes, attributes it assigns on
`self`), which become `v0, v1, ...` in order of first appearance, and literal values, which
become their kind (`<num>`, `<str>`). What it keeps: the syntax (node types, in source order),
operators, and the names of library APIs: an import alias becomes the module it names
(`F.gelu` -> `torch.nn.functional.gelu`), and attribute names the program did not define
(`x.reshape`, `torch.tanh`) stay as they are. Two programs that differ only by renaming or by
their sizes give the same sequence.
"""

from __future__ import annotations

import ast


def _imports(tree: ast.AST) -> dict[str, str]:
    """alias -> module path, for every import in the program."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module or ''}.{a.name}".lstrip(".")
    return aliases


def _own_names(tree: ast.AST, imported: set) -> set:
    """Names the program defines: assigned names, parameters, functions, classes, `self.x` it assigns."""
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            own.add(node.id)
        elif isinstance(node, ast.arg):
            own.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
    return own - imported


def _strip_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                    first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]


class _Tokens:
    def __init__(self, aliases: dict, own: set):
        self.aliases, self.own = aliases, own
        self.canonical: dict[str, str] = {}
        self.out: list[str] = []

    def name(self, identifier: str) -> str:
        if identifier in self.aliases:
            return self.aliases[identifier]
        if identifier in self.own:
            return self.canonical.setdefault(identifier, f"v{len(self.canonical)}")
        return identifier  # a builtin or a name from elsewhere

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return  # imports are folded into the names that use them
        self.out.append(type(node).__name__)
        if isinstance(node, ast.Name):
            self.out.append(self.name(node.id))
        elif isinstance(node, ast.arg):
            self.out.append(self.name(node.arg))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.out.append(self.name(node.name))
        elif isinstance(node, ast.Attribute):
            self.out.append(self.name(node.attr) if node.attr in self.own else node.attr)
        elif isinstance(node, ast.Constant):
            self.out.append(_literal_kind(node.value))
        elif isinstance(node, ast.keyword):
            self.out.append(f"kw:{node.arg}")
        for child in ast.iter_child_nodes(node):
            self.visit(child)


def _literal_kind(value) -> str:
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, (int, float, complex)):
        return "<num>"
    return "<str>" if isinstance(value, str) else "<bytes>"


def normalised_tokens(source: str) -> list[str]:
    """The program's normalised token sequence (SyntaxError if it does not parse)."""
    tree = ast.parse(source)
    _strip_docstrings(tree)
    aliases = _imports(tree)
    tokens = _Tokens(aliases, _own_names(tree, set(aliases)))
    tokens.visit(tree)
    return tokens.out
