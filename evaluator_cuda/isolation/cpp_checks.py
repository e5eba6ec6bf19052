"""Static checks on C++/CUDA sources (kernels/*, and load_inline strings inside a .py): docs/cheats.md #4, #5,
#16, #19, #20, #21.

Torch compute in C++ in all its spellings: namespaced calls (`at::matmul`), calls through a namespace
alias (`namespace T = torch;`), names brought in by `using torch::matmul;` or `using namespace at;`,
and tensor-method calls (`x.matmul(w)`) in sources that see torch's headers. Dispatch-key guards
(`c10::impl::ExcludeDispatchKeyGuard`, `at::AutoDispatchBelowAutograd`, redispatch) are refused
outright: they hide ops from the runtime guard. Plus threads, processes, side streams, L2 persistence
windows, symbol detours, sockets and reaching into the interpreter.
"""

from __future__ import annotations

import functools
import re

from .torch_guard import ALLOWED_ATEN, ALLOWED_PYTHON
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
# Tensor methods that describe a tensor or hand out its memory (besides the runtime guard's allow-lists).
ALLOWED_TENSOR_METHODS = frozenset(
    """
    scalar_type options sizes strides dtype device layout defined item get_device element_size itemsize
    nbytes type data const_data_ptr mutable_data_ptr accessor packed_accessor32 packed_accessor64
    storage untyped_storage names dim_order nelement ndimension requires_grad
    """.split()
) | ALLOWED_PYTHON | ALLOWED_ATEN | ALLOWED_TORCH_CPP_CALLS
# C and CUDA math functions that share a name with a torch function: under `using namespace at;` a bare
# `exp(v)` is most likely the scalar one (the runtime guard still sees a tensor one).
C_MATH = frozenset(
    """
    abs fabs exp exp2 expm1 log log2 log10 log1p sqrt rsqrt cbrt pow sin cos tan asin acos atan atan2 sinh cosh
    tanh asinh acosh atanh erf erfc lgamma tgamma floor ceil round trunc fmod remainder max min fmax fmin copysign
    hypot isnan isinf isfinite signbit frexp ldexp nextafter
    """.split()
)
CPP_KEYWORDS = frozenset("if for while switch return sizeof alignof decltype static_assert catch new delete".split())

_TORCH_NAMESPACES = ("at", "torch", "c10")
_INCLUDES_TORCH = re.compile(r'#\s*include\s*[<"](?:torch/|ATen/|c10/|binding_registry\.h)')
_INCLUDE = re.compile(r'#\s*include\s*"([^"]+)"')
_NAMESPACE_ALIAS = re.compile(r"\bnamespace\s+(\w+)\s*=\s*(?:::)?(\w+)(?:::\w+)*\s*;")
_USING_DIRECTIVE = re.compile(r"\busing\s+namespace\s+(?:::)?(\w+)(?:::\w+)*\s*;")
_USING_DECLARATION = re.compile(r"\busing\s+(?:::)?(\w+)::(?:\w+::)*(\w+)\s*;")
_METHOD_CALL = re.compile(r"(?:\.|->)\s*(\w+)\s*(?:<[^<>;()]*>)?\s*\(")
_BARE_CALL = re.compile(r"(?<![\w.:>])(\w+)\s*(?:<[^<>;()]*>)?\s*\(")
_OWN_FUNCTION = re.compile(r"\b(?!return\b|else\b|case\b|new\b|throw\b|co_return\b|delete\b)[A-Za-z_]\w*"
                           r"(?:\s*<[^<>;()]*>)?\s+[*&]?\s*(\w+)\s*\([^;{}]*\)\s*(?:const\s*)?(?:noexcept\s*)?[{;]")
_DISPATCH_GUARD = re.compile(
    r"\b(?:\w*DispatchKeyGuard|AutoDispatch\w*|AutoNonVariableTypeMode|Disable\w*TorchFunction\w*|DisableTorchDispatch"
    r"|\w*PythonDispatcher\w*|tls_set_dispatch_key_\w+|\w*tls_local_dispatch_key_set|ThreadLocalStateGuard"
    r"|redispatch\w*|callBoxed|findSchema\w*|Dispatcher\s*::\s*singleton|DispatchKeySet|DispatchKey\s*::"
    r"|TorchDispatchModeTLS|PythonTorchFunctionTLS|ExcludeDispatchKeyGuard|IncludeDispatchKeyGuard)\b")
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
    (_DISPATCH_GUARD, "dispatch_guard", "changes which dispatch keys run (hides ops from the torch-compute guard)"),
]


class Finding(tuple):
    """(reason, message)."""

    @property
    def reason(self) -> str:
        return self[0]

    @property
    def message(self) -> str:
        return self[1]


@functools.cache
def torch_names() -> tuple[frozenset, frozenset]:
    """(tensor methods, free functions) of the installed torch that compute: what C++ may not call."""
    import torch
    import torch.nn.functional as F

    methods = {n for n in dir(torch.Tensor) if not n.startswith("_") and callable(getattr(torch.Tensor, n, None))}
    functions = set()
    for namespace in (torch._C._VariableFunctions, torch._C._nn, torch._C._linalg, torch._C._special, torch._C._fft, F):
        functions |= {n for n in dir(namespace) if not n.startswith("_") and callable(getattr(namespace, n, None))}
    return frozenset(n for n in methods if not _allowed_method(n)), frozenset(n for n in functions if not _allowed(n))


def _allowed(name: str) -> bool:
    return name in ALLOWED_TORCH_CPP_CALLS or name.startswith(("k", "TORCH_"))


def _allowed_method(name: str) -> bool:
    return name in ALLOWED_TENSOR_METHODS or name.rstrip("_") in ALLOWED_TENSOR_METHODS or name.startswith(("is_",
                                                                                                             "has_"))


def strip_cpp_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _strip_strings(line: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', line)


class CppContext:
    """What one C++ source brings into scope: torch namespaces (with aliases), using-declarations, whether
    it sees torch's headers, and the functions the candidate defines itself (which torch names may shadow)."""

    def __init__(self, code: str, sees_torch: bool, own_functions: frozenset):
        aliases = {m.group(1) for m in _NAMESPACE_ALIAS.finditer(code) if m.group(2) in _TORCH_NAMESPACES}
        self.namespaces = set(_TORCH_NAMESPACES) | aliases
        self.using_torch = any(m.group(1) in self.namespaces for m in _USING_DIRECTIVE.finditer(code))
        self.sees_torch = sees_torch or self.using_torch or bool(_INCLUDES_TORCH.search(code))
        self.own_functions = own_functions
        names = "|".join(sorted(self.namespaces))
        self.namespaced_call = re.compile(rf"\b(?:{names})::((?:\w+::)*)(\w+)\s*(?:<[^<>;]*>)?\s*\(")


def own_functions(code: str) -> frozenset:
    """Functions a C++ source defines or declares (`__device__ float gelu(float x) {`)."""
    return frozenset(m.group(1) for m in _OWN_FUNCTION.finditer(code))


def check_cpp_source(name: str, text: str, sees_torch: bool = True, defined: frozenset = frozenset()) -> list[Finding]:
    """Findings in one C++/CUDA source (or a Python string holding one). `sees_torch`: the source may
    include torch's headers through another of the candidate's files; `defined`: functions the
    candidate's other sources define."""
    code = strip_cpp_comments(text)
    context = CppContext(code, sees_torch, defined | own_functions(code))
    findings = []
    for lineno, line in enumerate(code.splitlines(), 1):
        findings += _torch_compute(name, lineno, _strip_strings(line), context)
        for pattern, reason, what in _CPP_FORBIDDEN:
            if pattern.search(line):
                findings.append(Finding((reason, f"{name}:{lineno}: {what} ({line.strip()[:80]})")))
    return findings


def _torch_compute(name: str, lineno: int, line: str, context: CppContext) -> list[Finding]:
    """Torch calls that compute on one line, however they are spelled. A namespaced call or a
    using-declaration of a name torch lacks (`torch::emptyy`) is most likely a typo: its reason is
    `unknown_torch_name`, which waits for the build (the compiler names the typo; a source that
    builds with it is rejected as torch compute)."""
    calls = []  # (reason, call)
    for match in context.namespaced_call.finditer(line):
        if not _allowed(match.group(2)):
            unknown = not match.group(1) and is_unknown(match.group(2))
            calls.append(("unknown_torch_name" if unknown else "torch_compute_cpp", match.group(0).rstrip("(").strip()))
    for match in _USING_DECLARATION.finditer(line):
        if match.group(1) in context.namespaces and not (_allowed(match.group(2)) or match.group(2)[:1].isupper()):
            reason = "unknown_torch_name" if is_unknown(match.group(2)) else "torch_compute_cpp"
            calls.append((reason, f"using {match.group(1)}::{match.group(2)}"))
    if context.sees_torch:
        methods, functions = torch_names()
        calls += [("torch_compute_cpp", f".{m.group(1)}") for m in _METHOD_CALL.finditer(line) if m.group(1) in methods]
        if context.using_torch:
            calls += [("torch_compute_cpp", m.group(1)) for m in _BARE_CALL.finditer(line) if m.group(1) in functions
                      and m.group(1) not in C_MATH | CPP_KEYWORDS and m.group(1) not in context.own_functions]
    return [Finding((reason, f"{name}:{lineno}: {call} is not allowed: "
                     "torch compute in C++ (only allocation such as torch::empty_like)")) for reason, call in calls]


def cpp_sources_seeing_torch(sources: dict[str, str]) -> set[str]:
    """The candidate's C++ files that include torch's headers, directly or through its own headers."""
    seeing = {rel for rel, text in sources.items() if _INCLUDES_TORCH.search(text)}
    changed = True
    while changed:
        changed = False
        for rel, text in sources.items():
            included = {inc.split("/")[-1] for inc in _INCLUDE.findall(text)}
            if rel not in seeing and any(other.split("/")[-1] in included for other in seeing):
                seeing.add(rel)
                changed = True
    return seeing
