"""What the names in a candidate's Python file denote (docs/cheats.md #21).

The static rules judge meanings, not spellings: `from torch.cuda import Stream as S`, `c = torch.cuda`,
`getattr(torch, "cu" + "da")`, `from sys import modules` all resolve to the dotted module path they
name ("torch.cuda.Stream", "torch.cuda", "sys.modules"). Resolution is flow-insensitive: a name bound
to several paths anywhere in the file denotes all of them.
"""

from __future__ import annotations

import ast

_PASSES = 4  # aliases of aliases of aliases


def constant_string(node: ast.AST, strings: dict[str, set[str]] | None = None) -> str | None:
    """The value of a string built from constants ('cu' + 'da', f'{"_"}C', ''.join(['_', 'C'])), else None.
    `strings`: names bound to one constant string in the file."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and strings and len(strings.get(node.id, ())) == 1:
        return next(iter(strings[node.id]))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = constant_string(node.left, strings), constant_string(node.right, strings)
        return left + right if left is not None and right is not None else None
    if isinstance(node, ast.JoinedStr):
        parts = [constant_string(v.value if isinstance(v, ast.FormattedValue) else v, strings) for v in node.values]
        return "".join(parts) if all(p is not None for p in parts) else None
    if _is_join(node):
        parts = [constant_string(e, strings) for e in node.args[0].elts]
        sep = constant_string(node.func.value, strings)
        return sep.join(parts) if sep is not None and all(p is not None for p in parts) else None
    return None


def _is_join(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"
            and len(node.args) == 1 and isinstance(node.args[0], (ast.List, ast.Tuple)))


def dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a chain of names and attributes, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def is_getattr(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2)


class Bindings:
    """Module paths that the names (and `a.b` targets) of one file are bound to."""

    def __init__(self, tree: ast.Module):
        self.paths: dict[str, set[str]] = {}
        self.strings: dict[str, set[str]] = {}
        self.star_modules: list[str] = []
        for _ in range(_PASSES):
            if not self._collect(tree):
                break

    def resolve(self, node: ast.AST) -> set[str]:
        """The module paths an expression may denote (empty: none known)."""
        if isinstance(node, ast.Name):
            return set(self.paths.get(node.id, ())) or {f"{m}.{node.id}" for m in self.star_modules}
        if isinstance(node, ast.Attribute):
            found = {f"{p}.{node.attr}" for p in self.resolve(node.value)}
            return found | set(self.paths.get(dotted(node) or "", ()))
        if is_getattr(node):
            name = constant_string(node.args[1], self.strings)
            return {f"{p}.{name}" for p in self.resolve(node.args[0])} if name is not None else set()
        if isinstance(node, ast.NamedExpr):
            return self.resolve(node.value)
        if isinstance(node, ast.IfExp):
            return self.resolve(node.body) | self.resolve(node.orelse)
        if isinstance(node, ast.BoolOp):
            return set().union(*(self.resolve(v) for v in node.values))
        return set()

    def _bind(self, key: str | None, paths: set[str], table: dict | None = None) -> bool:
        table = self.paths if table is None else table
        if not key or not paths or paths <= table.get(key, set()):
            return False
        table.setdefault(key, set()).update(paths)
        return True

    def _collect(self, tree: ast.Module) -> bool:
        changed = False
        for node in ast.walk(tree):
            for key, paths in self._bindings_of(node):
                changed |= self._bind(key, paths)
            for key, value in _assignments(node):
                text = constant_string(value)
                if text is not None:
                    changed |= self._bind(key, {text}, self.strings)
        return changed

    def _bindings_of(self, node: ast.AST) -> list[tuple[str | None, set[str]]]:
        if isinstance(node, ast.Import):
            return [(a.asname, {a.name}) if a.asname else (a.name.split(".")[0], {a.name.split(".")[0]})
                    for a in node.names]
        if isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            if any(a.name == "*" for a in node.names) and base not in self.star_modules:
                self.star_modules.append(base)
            return [(a.asname or a.name, {f"{base}.{a.name}"}) for a in node.names if a.name != "*"]
        if isinstance(node, ast.For) and isinstance(node.iter, (ast.Tuple, ast.List, ast.Set)):
            return [(dotted(node.target), set().union(*(self.resolve(e) for e in node.iter.elts)))]
        return [(dotted(target), self.resolve(value)) for target, value in _assignment_nodes(node)]


def _assignment_nodes(node: ast.AST) -> list[tuple[ast.expr, ast.expr]]:
    """(target, value) pairs that a statement binds, tuples unpacked pairwise."""
    if isinstance(node, ast.Assign):
        pairs = []
        for target in node.targets:
            if isinstance(target, (ast.Tuple, ast.List)) and isinstance(node.value, (ast.Tuple, ast.List)):
                pairs += list(zip(target.elts, node.value.elts))
            else:
                pairs.append((target, node.value))
        return pairs
    if isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
        return [(node.target, node.value)]
    return []


def _assignments(node: ast.AST) -> list[tuple[str | None, ast.expr]]:
    return [(dotted(target), value) for target, value in _assignment_nodes(node)]
