"""Which names torch's C++ API has: to tell a typo (`torch::emptyy`) from a real torch call.

The names are torch's operators (`aten::*`) and its Python-visible functions, which the C++
`at::` / `torch::` namespaces mirror. A name outside them may still be a C++-only helper
(`at::parallel_for`), so an unknown name is never taken as harmless: the build decides, and a
source that builds with it is judged as before.
"""

from __future__ import annotations

import difflib
import functools


@functools.lru_cache(maxsize=1)
def torch_names() -> frozenset[str]:
    """Operator and function names of torch (empty when torch cannot be imported here)."""
    try:
        import torch
    except ImportError:
        return frozenset()
    ops = torch._C._dispatch_get_all_op_names()
    names = {op.split("::", 1)[1].split(".")[0] for op in ops if "::" in op}
    names.update(name for name in dir(torch._C._VariableFunctions) if not name.startswith("__"))
    return frozenset(names)


def is_unknown(name: str) -> bool:
    """True when `name` is certainly not a torch operator or function (False when unsure)."""
    names = torch_names()
    return bool(names) and name not in names and not name.startswith(("k", "TORCH_")) and name[:1].islower()


def closest(name: str) -> str | None:
    """The torch name a typo most likely meant, or None."""
    match = difflib.get_close_matches(name, torch_names(), n=1, cutoff=0.8)
    return match[0] if match else None
