"""Whose work ran on the GPU during the candidate's calls, and whether its times can be believed.

The candidate child reports what CUPTI recorded per call (timing/kernel_trace.py). Here, in the
parent, each activity is classed:
- data movement: memcpys, memsets, and kernels launched by torch's allocation, fill and copy
  operators (`torch::zeros` in a binding, say); allowed up to `data_movement_share` of the GPU time;
- the candidate's own: a kernel launched outside every torch operator whose name is a symbol of
  the candidate's built extension;
- foreign: anything else (a kernel launched by aten::mm, a library kernel the extension did not
  build), which rejects the candidate whatever the Python side did to the torch-compute guard.
"""

from __future__ import annotations

import re
import shutil
import subprocess

DATA_OPERATORS = frozenset({
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided",
    "aten::zeros", "aten::zeros_like", "aten::new_zeros", "aten::zero_", "aten::fill_", "aten::full",
    "aten::full_like", "aten::ones", "aten::ones_like", "aten::copy_", "aten::clone", "aten::contiguous",
    "aten::to", "aten::_to_copy",
})
SHOWN_FOREIGN = 3  # foreign kernels named in the message


def kernel_base_name(name: str) -> str:
    """`void ns::scale<float, 4>(float*, int)` -> `scale`: the kernel's own identifier."""
    text = name.replace("(anonymous namespace)::", "")
    depth = 0
    for i, ch in enumerate(text):
        depth = depth + 1 if ch == "<" else max(0, depth - 1) if ch == ">" else depth
        if ch == "(" and depth == 0:
            text = text[:i]
            break
    while True:  # template arguments, innermost first
        shorter = re.sub(r"<[^<>]*>", "", text)
        if shorter == text:
            break
        text = shorter
    tokens = text.split()
    return tokens[-1].split("::")[-1] if tokens else ""


def extension_symbols(so_path: str | None) -> str | None:
    """The symbol table of the built extension as text (`nm`), or None when it cannot be read."""
    nm = shutil.which("nm")
    if not so_path or nm is None:
        return None
    try:
        done = subprocess.run([nm, "--defined-only", so_path], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def is_own_kernel(name: str, symbols: str | None) -> bool:
    """A kernel the extension built: its identifier appears in the extension's symbols (mangled names
    hold it with its length before it; extern "C" kernels as the plain name). Without symbols
    (a KernelBench file builds its extension in the child) every kernel launched outside torch's
    operators counts as the candidate's own."""
    if symbols is None:
        return True
    base = kernel_base_name(name)
    if not base:
        return False
    # no look-behind: an anonymous namespace's mangled name may end in a digit just before the length
    pattern = rf"{len(base)}{re.escape(base)}|^\S+\s+\S\s+{re.escape(base)}$"
    return re.search(pattern, symbols, re.M) is not None


def classify(trace: dict, symbols: str | None) -> dict:
    """{"own_us", "data_us", "foreign": [described], "own_kernels": [names], "calls", "truncated"} over
    every traced call."""
    own_us = data_us = 0.0
    foreign: dict[str, float] = {}
    own_names: set[str] = set()
    truncated = False
    for call in trace.get("calls", {}).values():
        truncated = truncated or bool(call.get("truncated"))
        for name, kind, operator, _count, total_us in call.get("items", []):
            if kind in ("memcpy", "memset") or operator in DATA_OPERATORS:
                data_us += total_us
            elif operator is None and is_own_kernel(name, symbols):
                own_us += total_us
                own_names.add(kernel_base_name(name))
            else:
                origin = f" (launched by {operator})" if operator else " (not built by the extension)"
                label = name[:120] + origin
                foreign[label] = foreign.get(label, 0.0) + total_us
    shown = sorted(foreign, key=foreign.get, reverse=True)
    return {"own_us": round(own_us, 3), "data_us": round(data_us, 3), "foreign": shown,
            "own_kernels": sorted(own_names), "calls": len(trace.get("calls", {})), "truncated": truncated}


def attribution_problem(summary: dict, data_share_limit: float, calls_expected: int) -> tuple[str, str] | None:
    """(reason, message) when the traced work rejects the candidate, else None."""
    if summary["foreign"]:
        names = "; ".join(summary["foreign"][:SHOWN_FOREIGN])
        more = len(summary["foreign"]) - SHOWN_FOREIGN
        return "foreign_kernels", f"forward ran GPU work outside the candidate's extension: {names}" + (
            f" (and {more} more)" if more > 0 else "")
    if summary["truncated"]:
        return "foreign_kernels", "forward launched more distinct GPU activities per call than the trace keeps"
    total = summary["own_us"] + summary["data_us"]
    if calls_expected and summary["own_us"] <= 0.0:
        return "no_own_kernel", "no kernel of the candidate's extension ran during its calls"
    if total > 0 and summary["data_us"] / total > data_share_limit:
        share = summary["data_us"] / total
        return "data_movement", (f"copies, fills and memsets took {share:.0%} of forward's GPU time "
                                 f"(at most {data_share_limit:.0%})")
    return None


def span_disagreement(spans_us: list[float], times_us: list[float], rel: float, slack_us: float) -> str | None:
    """Why the timed calls' event times cannot be believed: the GPU work they launched (hardware
    timestamps, any stream) spanned longer than the events around them, else None."""
    pairs = [(s, t) for s, t in zip(spans_us, times_us) if isinstance(s, (int, float)) and isinstance(t, (int, float))]
    if not pairs:
        return None
    spans = sorted(s for s, _ in pairs)
    times = sorted(t for _, t in pairs)
    span, time = spans[len(spans) // 2], times[len(times) // 2]
    if span > time * (1.0 + rel) + slack_us:
        return (f"the GPU work of the timed calls spanned {span:.1f} µs (median) but their events measured "
                f"{time:.1f} µs: work ran outside the timed window")
    return None
