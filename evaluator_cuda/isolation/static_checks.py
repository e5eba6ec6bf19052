"""Static checks on a candidate's sources: what the runtime guard cannot see (docs/cheats.md #4, #5,
#16, #19, #20, #21, #22).

Run in the verdict process before anything is built or imported. Each finding is a short
reason name plus one line naming the file and the line; any finding rejects the candidate
(status `incorrect`, `record["rejected"]` = the reason), except `unknown_torch_name` (a torch
call of a name torch lacks, most likely a typo), which waits for the build: the compiler names
the typo, and a source that builds with it is rejected as `torch_compute_cpp`.

- Python (`model_new.py`, a KernelBench file, any helper module): python_checks.py. Names are
  resolved through imports, aliases and constant getattr before the rules judge them.
- C++/CUDA (kernels/*, and load_inline source strings, which live inside the .py): cpp_checks.py.
  Torch compute in any spelling (namespaced, aliased, `using`, tensor methods), dispatch-key guards.
"""

from __future__ import annotations

from .cpp_checks import (ALLOWED_TORCH_CPP_CALLS, Finding, check_cpp_source, cpp_sources_seeing_torch, own_functions,
                         strip_cpp_comments)
from .python_checks import REFERENCE_MODULES, check_python_source

__all__ = ["ALLOWED_TORCH_CPP_CALLS", "REFERENCE_MODULES", "Finding", "check_cpp_source", "check_python_source",
           "check_solution_sources"]

CPP_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".h", ".hpp")


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def check_solution_sources(files: dict) -> list[Finding]:
    """All findings over a solution's files {relpath: bytes}, in file order."""
    texts = {rel: _text(files[rel]) for rel in sorted(files)}
    cpp = {rel: text for rel, text in texts.items() if rel.endswith(CPP_SUFFIXES)}
    seeing = cpp_sources_seeing_torch(cpp)
    defined = frozenset().union(*(own_functions(strip_cpp_comments(t)) for t in cpp.values()))
    findings: list[Finding] = []
    for rel, text in texts.items():
        if rel.endswith(".py"):
            findings += check_python_source(rel, text)
        elif rel in cpp:
            findings += check_cpp_source(rel, text, sees_torch=rel in seeing, defined=defined)
    return findings
