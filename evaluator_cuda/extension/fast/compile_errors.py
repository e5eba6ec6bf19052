"""Telling a genuine compile error from a gap in the slim headers.

A unit that never sees torch (a `.cu` kernel, a plain host kernel) compiles the same way in the
fast and the full build, so its errors are the candidate's. A binding compiles against the slim
headers here, so its failure may only mean it uses torch API the shim lacks; then the builder
asks for the full torch build (whose diagnostics are authoritative). The one binding error we
report directly are a plain syntax error in the candidate's own file when the file uses no
torch-style macro the shim does not define (an unknown macro also produces "expected ..." errors),
and a name that torch itself lacks (`torch::emptyy`: a typo, whatever the headers).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from ...isolation.static_checks import ALLOWED_TORCH_CPP_CALLS
from ..diagnostics import UNKNOWN_NAME

INCLUDE_DIR = Path(__file__).parent / "include"
TORCH_HEADER = re.compile(r"#\s*include\s*[<\"](torch/|ATen/|c10/|pybind11/|caffe2/|THC/)")
_SYNTAX = re.compile(
    r"^(expected |stray |missing terminating|unterminated |extra qualification|"
    r"expected primary-expression|expected unqualified-id|expected declaration)"
)
_TORCH_MACRO = re.compile(r"\b((?:C10|AT|TORCH|CUDA_KERNEL)_[A-Z0-9_]+)\b")
_DEFINE = re.compile(r"#\s*define\s+([A-Za-z_]\w*)")
# Undefined symbols the slim link cannot provide: torch/pybind11 C++ symbols, NVIDIA libraries other than cudart.
_UNDEFINED_TORCH_SYMBOL = re.compile(
    r"undefined (?:reference to|symbol:?)\s*[`']?(?:_ZN\d*(?:at|c10|torch|pybind11)|_ZNK\d*(?:at|c10|torch)|"
    r"(?:at|c10|torch|pybind11|caffe2)::|cublas|cublasLt|cudnn|cusparse|cusolver|curand|cufft|nccl)"
)


def includes_torch(source: bytes) -> bool:
    """Whether a source includes a torch, ATen, c10 or pybind11 header."""
    return bool(TORCH_HEADER.search(source.decode("utf-8", "replace")))


@functools.lru_cache(maxsize=1)
def shim_macros() -> frozenset[str]:
    """Every macro the slim headers define."""
    names = set()
    for header in INCLUDE_DIR.rglob("*.h"):
        names.update(_DEFINE.findall(header.read_text()))
    return frozenset(names)


def unknown_torch_macros(source: bytes) -> set[str]:
    """Torch-style macros (C10_*, AT_*, TORCH_*) a source uses that the slim headers do not define."""
    used = set(_TORCH_MACRO.findall(source.decode("utf-8", "replace")))
    return used - shim_macros()


def is_unknown_torch_name(diagnostics: list[dict], unit_rel: str, source: bytes) -> bool:
    """True when the first error is a call, in the unit's own file, of a name torch lacks (a typo).

    Only calls (`torch::emptyy(`) of names outside the allocation calls count: the static checks
    refuse any other torch call in C++ whether it exists or not, so no valid solution is lost.
    """
    errors = [d for d in diagnostics if d.get("file")]
    if not errors or errors[0]["file"] != unit_rel or not errors[0]["message"].startswith(UNKNOWN_NAME):
        return False
    qualified = errors[0]["message"][len(UNKNOWN_NAME):].split(": ", 1)[0]
    if qualified.rsplit("::", 1)[-1] in ALLOWED_TORCH_CPP_CALLS:
        return False
    lines = source.decode("utf-8", "replace").splitlines()
    line = lines[errors[0]["line"] - 1] if 0 < (errors[0].get("line") or 0) <= len(lines) else ""
    return re.search(re.escape(qualified) + r"\s*(?:<[^<>;]*>)?\s*\(", line) is not None


def is_plain_syntax_error(diagnostics: list[dict], unit_rel: str, source: bytes) -> bool:
    """True when the first error is a syntax error in the unit's own file and no unknown torch macro is used."""
    errors = [d for d in diagnostics if d.get("file")]
    if not errors:
        return False
    first = errors[0]
    return (
        first["file"] == unit_rel
        and bool(_SYNTAX.match(first["message"]))
        and not unknown_torch_macros(source)
    )


def shim_gap_reason(role: str, rel: str, source: bytes, diagnostics: list[dict]) -> str | None:
    """Why a failed unit should be rebuilt the full torch way, or None when the error is the candidate's.

    role: "kernel" (a .cu or a host kernel .cpp), "binding" (kernels/*_binding.cpp) or "harness".
    """
    if role == "harness":
        first = next((d for d in diagnostics if d.get("message")), {"message": "no diagnostic"})
        return f"the fast-build harness did not compile with this toolchain ({first['message'][:200]})"
    touches_torch = role == "binding" or includes_torch(source)
    if not touches_torch:
        return None
    if is_plain_syntax_error(diagnostics, rel, source) or is_unknown_torch_name(diagnostics, rel, source):
        return None
    first = next((d for d in diagnostics if d.get("message")), {"message": "compile failed"})
    where = f"{first.get('file')}:{first.get('line')}: " if first.get("file") else ""
    return f"{rel} needs torch API outside the slim headers ({where}{first['message'][:200]})"


def link_gap_reason(log: str) -> str | None:
    """A link failure on torch/pybind11 symbols means the slim path cannot serve this solution."""
    match = _UNDEFINED_TORCH_SYMBOL.search(log)
    if match:
        return "the link needs torch symbols (" + match.group(0)[:120] + ")"
    return None
