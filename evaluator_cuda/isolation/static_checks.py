"""Static checks on a candidate's sources: what the runtime guard cannot see (docs/cheats.md #4, #5,
#16, #19, #20).

Run in the verdict process before anything is built or imported. Each finding is a short
reason name plus one line naming the file and the line; any finding rejects the candidate
(status `incorrect`, `record["rejected"]` = the reason).

- Python (`model_new.py`, a KernelBench file): `class ModelNew(Model)` or importing the
  reference module (inheriting the reference forward), try/except inside ModelNew (a fallback
  to torch), threads, processes, sockets and ctypes (background work, escaping the sandbox,
  dlsym detours), CUDA streams created from Python, and rebinding any attribute of an imported
  module (`torch.cuda.Event.elapsed_time = ...`, `setattr(torch.cuda, ...)`: patching the
  timer or the checker, docs/cheats.md #7).
- C++/CUDA (kernels/*, and load_inline source strings, which live inside the .py): `at::` /
  `torch::` calls other than allocation, metadata and the current stream; threads, fork,
  system/popen; stream creation; L2 persistence windows.
"""

from __future__ import annotations

import ast
import re

from .torch_names import is_unknown

# at::/torch::/c10:: calls that allocate, describe or locate tensors (SKILL.md: allocation only).
ALLOWED_TORCH_CPP_CALLS = frozenset(
    """
    empty empty_like empty_strided zeros zeros_like ones ones_like full full_like from_blob
    TensorOptions dtype device layout requires_grad Device Scalar IntArrayRef ArrayRef
    getCurrentCUDAStream getDefaultCUDAStream CUDAGuard OptionalCUDAGuard DeviceGuard
    current_device elementSize toString typeMetaToScalarType kCUDA kCPU
    """.split()
)

_CPP_TORCH_CALL = re.compile(r"\b(?:at|torch|c10)::((?:\w+::)*)(\w+)\s*(?:<[^<>;]*>)?\s*\(")
_CPP_FORBIDDEN = [
    (re.compile(r"\bstd::(?:thread|async|jthread)\b|\bpthread_create\b|#\s*include\s*<thread>"), "threads",
     "starts a thread"),
    (re.compile(r"\b(?:fork|vfork|system|popen|execv|execve|execvp|posix_spawn)\s*\("), "processes",
     "starts a process"),
    (re.compile(r"\bcudaStreamCreate\w*\b|\bgetStreamFromPool\b|\bcudaStreamPerThread\b|\bcudaStreamLegacy\b"),
     "side_stream", "creates or uses a side stream"),
    (re.compile(r"\bcudaAccessPolicyWindow\b|\baccessPolicyWindow\b|\bcudaLimitPersistingL2CacheSize\b"
                r"|\bcudaStreamAttributeAccessPolicyWindow\b"), "persisting_l2", "sets an L2 persistence window"),
    (re.compile(r"\bdlsym\b|\bdlopen\b|\bLD_PRELOAD\b"), "detour", "loads or looks up symbols at run time"),
    (re.compile(r"\bsocket\s*\(|\bconnect\s*\("), "network", "opens a socket"),
    (re.compile(r"\bPyImport_\w+|\bPyObject_SetAttr\w*|\bPyRun_\w+|\bmodule_?::import\b|\bpy::eval\b|\bpy::exec\b"),
     "harness", "reaches into the Python interpreter"),
]

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
                    ("os", "fdopen"): "channel", ("os", "open"): "channel", ("os", "kill"): "processes"}
REFERENCE_MODULES = ("model", "reference_task")


def _imported_names(tree: ast.Module) -> set[str]:
    """Names bound to modules by the file's imports (`import torch.cuda as tc` binds tc, `import torch` binds torch)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names if alias.name != "*")
    return names


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


class Finding(tuple):
    """(reason, message)."""

    @property
    def reason(self) -> str:
        return self[0]

    @property
    def message(self) -> str:
        return self[1]


def _strip_cpp_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def check_cpp_source(name: str, text: str) -> list[Finding]:
    """Findings in one C++/CUDA source (or a Python string holding one)."""
    findings = []
    code = _strip_cpp_comments(text)
    for lineno, line in enumerate(code.splitlines(), 1):
        for match in _CPP_TORCH_CALL.finditer(line):
            if match.group(2) not in ALLOWED_TORCH_CPP_CALLS and not match.group(2).startswith(("k", "TORCH_")):
                call = match.group(0).rstrip('(').strip()
                message = (f"{name}:{lineno}: {call} is not allowed: "
                           "torch compute in C++ (only allocation such as torch::empty_like)")
                # A name torch lacks may be a typo: the build reports it; if it builds, this finding stands.
                unknown = not match.group(1) and is_unknown(match.group(2))
                reason = "unknown_torch_name" if unknown else "torch_compute_cpp"
                findings.append(Finding((reason, message)))
        for pattern, reason, what in _CPP_FORBIDDEN:
            if pattern.search(line):
                findings.append(Finding((reason, f"{name}:{lineno}: {what} ({line.strip()[:80]})")))
    return findings


def _model_new_class(tree: ast.Module) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"), None)


def check_python_source(name: str, text: str) -> list[Finding]:
    """Findings in a candidate's Python file, including C++ held in its string constants."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []  # the candidate child reports syntax errors with their line
    findings = []
    modules = _imported_names(tree)
    for node in ast.walk(tree):
        findings += _node_findings(name, node, modules)
    return findings + _model_new_findings(name, tree)


def _node_findings(name: str, node: ast.AST, modules: set[str]) -> list[Finding]:
    line = getattr(node, "lineno", 0)
    findings = []
    for target in _patched_targets(node):
        # `torch.cuda.Event.elapsed_time = ...`, `time.perf_counter = ...`: rebinding what a
        # module (the harness's too) looks up; the candidate's own objects (self.x = ...) are fine.
        if isinstance(target, (ast.Attribute, ast.Subscript)) and _root_name(target) in modules:
            findings.append(Finding(("monkeypatch",
                                     f"{name}:{line}: assigns to {ast.unparse(target)[:80]} (patching a module)")))
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        findings += _import_findings(name, node, line)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FORBIDDEN_CALLS:
        findings.append(Finding((_FORBIDDEN_CALLS[node.func.id], f"{name}:{line}: calls {node.func.id}()")))
    elif isinstance(node, ast.Attribute) and isinstance(node.value, (ast.Name, ast.Attribute)):
        owner = node.value.id if isinstance(node.value, ast.Name) else node.value.attr
        reason = _FORBIDDEN_ATTRS.get((owner, node.attr))
        if reason:
            findings.append(Finding((reason, f"{name}:{line}: uses {owner}.{node.attr}")))
    elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) > 40:
        for finding in check_cpp_source(name, node.value):
            message = finding.message.replace(f"{name}:", f"{name} (string at line {line}), line ", 1)
            findings.append(Finding((finding.reason, message)))
    return findings


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


def _model_new_findings(name: str, tree: ast.Module) -> list[Finding]:
    """ModelNew inheriting the reference Model, or falling back with try/except."""
    model_new = _model_new_class(tree)
    if model_new is None:
        return []
    findings = []
    for base in model_new.bases:
        base_name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
        if base_name == "Model":
            findings.append(Finding(("inherits_reference",
                                     f"{name}:{model_new.lineno}: ModelNew inherits the reference Model")))
    for node in ast.walk(model_new):
        if isinstance(node, ast.Try):
            message = f"{name}:{node.lineno}: try/except inside ModelNew (a fallback path is not allowed)"
            findings.append(Finding(("fallback", message)))
    return findings


def check_solution_sources(files: dict) -> list[Finding]:
    """All findings over a solution's files {relpath: bytes}, in file order."""
    findings: list[Finding] = []
    for rel in sorted(files):
        text = files[rel].decode("utf-8", "replace") if isinstance(files[rel], (bytes, bytearray)) else str(files[rel])
        if rel.endswith(".py"):
            findings += check_python_source(rel, text)
        elif rel.endswith((".cu", ".cuh", ".cpp", ".cc", ".cxx", ".h", ".hpp")):
            findings += check_cpp_source(rel, text)
    return findings
