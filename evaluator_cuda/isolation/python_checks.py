"""Static checks on a candidate's Python files (docs/cheats.md #4, #5, #7, #12, #16, #20, #21, #22).

Rules judge what a name denotes (names.py resolves imports, aliases and constant getattr), not
how it is spelled. Reasons: reference_import, inherits_reference, fallback (try/except around
anything but imports, anywhere in the file; `contextlib.suppress`; an own `__exit__`), threads,
processes, network, detour, introspection, harness, channel, side_stream, monkeypatch,
torch_private (any `_`-prefixed part of torch: its C bindings, dispatch internals),
guard_switch (entry points that turn the torch-compute guard off), precision_switch (TF32 and
matmul-precision switches, the default dtype).
"""

from __future__ import annotations

import ast
import re

from .cpp_checks import Finding, check_cpp_source
from .names import Bindings, constant_string, dotted, is_getattr

REFERENCE_MODULES = ("model", "reference_task")
_FORBIDDEN_MODULES = {
    "threading": "threads", "_thread": "threads", "concurrent": "threads", "multiprocessing": "processes",
    "subprocess": "processes", "socket": "network", "ctypes": "detour", "cffi": "detour", "gc": "introspection",
    "inspect": "introspection", "importlib": "introspection", "builtins": "introspection",
    "evaluator_cuda": "harness", "pickle": "introspection", "marshal": "introspection",
}
_FORBIDDEN_CALLS = {"__import__": "introspection", "eval": "introspection", "exec": "introspection",
                    "compile": "introspection", "globals": "introspection", "vars": "introspection",
                    "setattr": "monkeypatch", "delattr": "monkeypatch"}
_FORBIDDEN_ATTRS = {("os", "fork"): "processes", ("os", "system"): "processes", ("os", "popen"): "processes",
                    ("os", "forkpty"): "processes", ("cuda", "Stream"): "side_stream",
                    ("cuda", "stream"): "side_stream",
                    ("cuda", "ExternalStream"): "side_stream", ("sys", "_getframe"): "introspection",
                    ("sys", "modules"): "introspection", ("os", "write"): "channel", ("os", "dup2"): "channel",
                    ("os", "fdopen"): "channel", ("os", "open"): "channel", ("os", "kill"): "processes",
                    ("sys", "settrace"): "introspection", ("sys", "setprofile"): "introspection",
                    ("operator", "attrgetter"): "introspection", ("operator", "methodcaller"): "introspection",
                    ("contextlib", "suppress"): "fallback", ("torch", "compile"): "torch_private"}
_STREAM_NAMES = frozenset({"Stream", "ExternalStream", "StreamContext", "set_stream", "stream", "streams"})
# Entry points that switch the torch-compute guard (torch_guard.py) off, under any module they are reached through.
GUARD_SWITCH_NAMES = frozenset(
    """
    DisableTorchFunction _DisableTorchFunction DisableTorchFunctionSubclass _DisableTorchFunctionSubclass
    _disabled_torch_function_impl _DisableTorchDispatch _DisablePythonDispatcher _EnablePythonDispatcher
    _unset_dispatch_mode _set_dispatch_mode _disable_current_modes _pop_mode _pop_mode_temporarily _push_mode
    ExcludeDispatchKeyGuard _ExcludeDispatchKeyGuard _IncludeDispatchKeyGuard _ForceDispatchKeyGuard
    _SetExcludeDispatchKeyGuard _PreserveDispatchKeyGuard _AutoDispatchBelowAutograd _AutoDispatchBelowADInplaceOrView
    _set_torch_function_state _pop_torch_function_stack _pop_torch_dispatch_stack _RestorePythonTLSSnapshot
    _dispatch_tls_set_dispatch_key_excluded _dispatch_tls_set_dispatch_key_included _skip_one_hop_torch_function
    _set_skip_next_torch_function no_dispatch no_python_dispatcher _disable_infra_mode _unset_infra_mode
    _enable_torch_function
    """.split()
)
# Global precision switches (a TF32 GEMM scored as a speed-up of an fp32 task, docs/cheats.md #15).
PRECISION_NAMES = frozenset(
    """
    allow_tf32 allow_bf16_reduced_precision_reduction allow_fp16_reduced_precision_reduction allow_fp16_accumulation
    fp32_precision set_float32_matmul_precision set_default_dtype set_default_tensor_type set_flush_denormal
    preferred_blas_library preferred_linalg_library
    """.split()
)
_PRECISION_PART = re.compile(r"tf32|precision|set_default_dtype|set_default_tensor_type|flush_denormal"
                             r"|preferred_(?:blas|linalg)_library|fp16_accumulation")
# Attributes that reach a module's namespace, a frame or code from any object.
_INTROSPECTION_ATTRS = frozenset(
    """
    __globals__ __builtins__ __code__ __closure__ __subclasses__ __getattribute__ __loader__ __spec__ __self__
    f_globals f_locals f_back f_builtins gi_frame cr_frame tb_frame
    """.split()
)
_IDENTIFIER = re.compile(r"[A-Za-z_][\w.]*")


def _finding(reason: str, name: str, line: int, what: str) -> Finding:
    if reason in ("torch_private", "guard_switch", "precision_switch"):
        what += " is not allowed"
    return Finding((reason, f"{name}:{line}: {what}"))


def name_reasons(part: str) -> list[str]:
    """Reasons a single attribute or imported name is refused wherever it is reached from."""
    reasons = []
    if part in GUARD_SWITCH_NAMES:
        reasons.append("guard_switch")
    if part in PRECISION_NAMES:
        reasons.append("precision_switch")
    if part == "_C":
        reasons.append("torch_private")
    if part in _INTROSPECTION_ATTRS:
        reasons.append("introspection")
    return reasons


def path_reasons(path: str) -> list[str]:
    """Reasons a resolved module path ("torch.cuda.Stream") is refused."""
    parts = path.split(".")
    reasons = [_FORBIDDEN_MODULES[p] for p in parts if p in _FORBIDDEN_MODULES]
    reasons += [_FORBIDDEN_ATTRS[pair] for pair in zip(parts, parts[1:]) if pair in _FORBIDDEN_ATTRS]
    reasons += [r for p in parts for r in name_reasons(p)]
    if "torch" in parts:
        after = parts[parts.index("torch") + 1:]
        if any(_PRECISION_PART.search(p) for p in after):
            reasons.append("precision_switch")
        if after and after[-1] in _STREAM_NAMES:
            reasons.append("side_stream")
        if any(p.startswith("_") and not p.endswith("__") for p in after):
            reasons.append("torch_private")
    return sorted(dict.fromkeys(reasons), key=lambda r: r == "torch_private")  # the specific reason first


class PythonChecker:
    """All findings in one Python file."""

    def __init__(self, name: str, tree: ast.Module):
        self.name = name
        self.tree = tree
        self.bindings = Bindings(tree)
        self.modules = {k for k in self.bindings.paths if "." not in k}
        self.called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}

    def findings(self) -> list[Finding]:
        found = []
        for node in ast.walk(self.tree):
            found += self._node(node)
        found += self._model_new() + self._fallbacks()
        seen, unique = set(), []
        for f in found:
            key = (f.reason, f.message.split(": ", 1)[0])
            if key not in seen:
                seen.add(key)
                unique.append(f)
        return unique

    def _node(self, node: ast.AST) -> list[Finding]:
        line = getattr(node, "lineno", 0)
        found = self._patches(node, line)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found += self._imports(node, line)
        elif isinstance(node, ast.Call):
            found += self._call(node, line)
        elif isinstance(node, ast.Attribute):
            found += self._attribute(node, line)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            found += self._name(node, line)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += self._string(node, line)
        return found

    def _resolved(self, node: ast.AST, line: int) -> list[Finding]:
        return [_finding(r, self.name, line, f"uses {path}") for path in sorted(self.bindings.resolve(node))
                for r in path_reasons(path)]

    def _patches(self, node: ast.AST, line: int) -> list[Finding]:
        """`torch.cuda.Event.elapsed_time = ...`, `m = torch.backends; m.x = ...`: rebinding what a module holds
        (the harness's too); the candidate's own objects (self.x = ...) are fine."""
        found = []
        for target in _patched_targets(node):
            if isinstance(target, (ast.Attribute, ast.Subscript)) and (
                    _root_name(target) in self.modules or self.bindings.resolve(target.value)):
                found += self._resolved(target, line)
                found.append(_finding("monkeypatch", self.name, line,
                                      f"assigns to {ast.unparse(target)[:80]} (patching a module)"))
        return found

    def _imports(self, node: ast.Import | ast.ImportFrom, line: int) -> list[Finding]:
        found = _import_findings(self.name, node, line)
        base = "." * getattr(node, "level", 0) + (getattr(node, "module", None) or "")
        for alias in node.names:
            path = alias.name if isinstance(node, ast.Import) else f"{base}.{alias.name}"
            found += [_finding(r, self.name, line, f"imports {path}") for r in path_reasons(path)]
        return found

    def _call(self, node: ast.Call, line: int) -> list[Finding]:
        func = node.func
        if isinstance(func, ast.Name) and func.id in _FORBIDDEN_CALLS:
            return [_finding(_FORBIDDEN_CALLS[func.id], self.name, line, f"calls {func.id}()")]
        if is_getattr(node):
            attr = constant_string(node.args[1], self.bindings.strings)
            if attr is None:
                computed = _root_name(node.args[0]) != "self"
                return [_finding("introspection", self.name, line, "getattr with a computed name")] if computed else []
            named = [_finding(r, self.name, line, f"gets .{attr}") for r in name_reasons(attr)]
            return named + self._resolved(node, line)
        return []

    def _attribute(self, node: ast.Attribute, line: int) -> list[Finding]:
        found = [_finding(r, self.name, line, f"uses .{node.attr}") for r in name_reasons(node.attr)]
        owner = dotted(node.value)
        reason = _FORBIDDEN_ATTRS.get((owner.rsplit(".", 1)[-1], node.attr)) if owner else None
        if reason:
            found.append(_finding(reason, self.name, line, f"uses {owner}.{node.attr}"))
        if node.attr == "__dict__" and self.bindings.resolve(node.value):
            found.append(_finding("introspection", self.name, line, "reads a module's __dict__"))
        return found + self._resolved(node, line)

    def _name(self, node: ast.Name, line: int) -> list[Finding]:
        if node.id == "__builtins__" or (node.id == "getattr" and id(node) not in self.called):
            return [_finding("introspection", self.name, line, f"uses {node.id} as a value")]
        return self._resolved(node, line) if node.id in self.bindings.paths else []

    def _string(self, node: ast.Constant, line: int) -> list[Finding]:
        text = node.value
        if len(text) > 40:
            where = f"{self.name} (string at line {line}), line "
            return [Finding((f.reason, f.message.replace(f"{self.name}:", where, 1)))
                    for f in check_cpp_source(self.name, text, sees_torch=_looks_like_cpp(text))]
        if not _IDENTIFIER.fullmatch(text):
            return []
        reasons = [r for part in text.split(".") for r in name_reasons(part) if r != "introspection"]
        reasons += [r for r in path_reasons(text) if r in ("torch_private", "guard_switch", "precision_switch")]
        return [_finding(r, self.name, line, f"names {text!r}") for r in dict.fromkeys(reasons)]

    def _model_new(self) -> list[Finding]:
        model_new = next((n for n in self.tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"), None)
        if model_new is None:
            return []
        return [_finding("inherits_reference", self.name, model_new.lineno, "ModelNew inherits the reference Model")
                for base in model_new.bases
                if (base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")) == "Model"]

    def _fallbacks(self) -> list[Finding]:
        """A way to go on after an exception (the guard's refusal, a failed kernel) anywhere in the file."""
        found = []
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
                if node.handlers and not all(_import_only(s) for s in node.body):
                    what = "try/except around code that is not an import (a fallback path is not allowed)"
                    found.append(_finding("fallback", self.name, node.lineno, what))
                jumps = (ast.Return, ast.Break, ast.Continue)
                if any(isinstance(n, jumps) for s in node.finalbody for n in ast.walk(s)):
                    what = "a finally block that swallows exceptions"
                    found.append(_finding("fallback", self.name, node.lineno, what))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in ("__exit__", "__aexit__"):
                found.append(_finding("fallback", self.name, node.lineno,
                                      f"defines {node.name} (a context manager can swallow exceptions)"))
        return found


def _looks_like_cpp(text: str) -> bool:
    """A load_inline source (statements and braces, or an include), not prose such as a docstring."""
    return "#include" in text or (";" in text and "{" in text)


def _import_only(statement: ast.stmt) -> bool:
    return isinstance(statement, (ast.Import, ast.ImportFrom, ast.Pass)) or (
        isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant))


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _patched_targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        unpacked = (ast.Tuple, ast.List)
        return [t for target in node.targets for t in (target.elts if isinstance(target, unpacked) else [target])]
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    if isinstance(node, ast.Delete):
        return list(node.targets)
    return []


def _import_findings(name: str, node: ast.Import | ast.ImportFrom, line: int) -> list[Finding]:
    findings = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            top = alias.name.split(".")[0]
            if top in REFERENCE_MODULES:
                findings.append(Finding(("reference_import",
                                         f"{name}:{line}: imports the reference module {alias.name!r}")))
            elif top in _FORBIDDEN_MODULES:
                findings.append(Finding((_FORBIDDEN_MODULES[top], f"{name}:{line}: imports {alias.name}")))
        return findings
    top = (node.module or "").split(".")[0]
    if top in REFERENCE_MODULES:
        findings.append(Finding(("reference_import",
                                 f"{name}:{line}: imports from the reference module {node.module!r}")))
    elif top in _FORBIDDEN_MODULES:
        findings.append(Finding((_FORBIDDEN_MODULES[top], f"{name}:{line}: imports from {node.module}")))
    elif top == "os" and any(a.name in ("fork", "system", "popen", "forkpty") for a in node.names):
        findings.append(Finding(("processes", f"{name}:{line}: imports a process call from os")))
    return findings


def check_python_source(name: str, text: str) -> list[Finding]:
    """Findings in a candidate's Python file, including C++ held in its string constants."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []  # the candidate child reports syntax errors with their line
    return PythonChecker(name, tree).findings()
