"""Crawl the installed torch for seed operators and record the shapes under which each runs.

Candidates: the public `torch.nn` modules, the public `torch.nn.functional` functions and the
C-implemented functions of the `torch` namespace; plus the transformers-style blocks of
blocks.py. Each is probed on small float32 tensors of rank 1 to 5: a module's family comes from
its required constructor arguments, a function's from the output shape it gives (same shape,
last dimension reduced, or same shape with a broadcast second operand). An operator is kept for
the ranks where it runs, gives the shape its family predicts, a floating output, the same
output twice, and not its input unchanged; otherwise it is recorded with the reason.
"""

from __future__ import annotations

import contextlib
import inspect
import random
import re
import warnings

from .blocks import BLOCKS
from .families import FAMILIES, ShapeError, choose_args, output_shape
from .runtime import build_callable, resolve

CATALOGUE_VERSION = 1
# Distinct sizes per dimension, so that an operator defined only for square matrices shows
# (two shapes per rank: a rank counts when the operator behaves on both)
PROBE_SHAPES = {1: ([7], [4]), 2: ([5, 3], [3, 8]), 3: ([2, 4, 6], [3, 5, 4]), 4: ([2, 3, 5, 6], [3, 4, 7, 5]),
                5: ([2, 3, 4, 5, 6], [3, 2, 5, 4, 3])}
BLOCK_PROBE_SHAPES = ([2, 4, 16], [3, 5, 32])
PROBE_SIZES = {"features": [5], "channels": [3]}
# Required constructor arguments -> family (a module whose required arguments match none is recorded as such)
MODULE_FAMILIES = (
    ({"in_features", "out_features"}, "linear"),
    ({"normalized_shape"}, "feature_norm"),
    ({"num_features"}, "channel_norm"),
    ({"num_groups", "num_channels"}, "group_norm"),
    ({"in_channels", "out_channels", "kernel_size"}, "conv"),
    ({"kernel_size"}, "pool"),
    ({"output_size"}, "adaptive_pool"),
    (set(), "parameterless"),
)
# Scalar constructor arguments the crawl can fill in itself
SCALAR_DEFAULTS = {"threshold": 0.5, "value": 0.0, "norm_type": 2.0, "lower": 0.125, "upper": 0.333}
CONTAINERS = {"Module", "Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict", "Container"}
# Names of the torch namespace that are not operators on a tensor (factories, state, framework)
NOT_OPERATORS = re.compile(
    r"^(_|set_|get_|is_|use_|manual_seed|seed|initial_seed|save|load|compile|from_|empty|zeros|ones|full|rand|"
    r"normal|poisson|bernoulli|multinomial|arange|range|linspace|logspace|eye|tensor|as_|sparse|quantize|fbgemm|"
    r"mkldnn|cudnn|miopen|native_|export|jit|autocast|cond|vmap|align|sym_|fork|wait|import|q_|dequantize|"
    r"result_type|can_cast|promote_types|typename|numel|clear_|device|stream|sync|empty_like|frombuffer|asarray|"
    r"scalar_tensor|cat|stack|concat|hstack|vstack|dstack|column_stack|broadcast_|meshgrid|block_diag|cartesian|"
    r"combinations|split|chunk|unbind|tensor_split|hsplit|vsplit|dsplit|resolve_|fake_|fused_|choose_qparams)")


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:160]


def _float_input(shape, domain: str = "real"):
    import torch

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen)
    if domain == "positive":
        return x.abs() + 1.0
    if domain == "unit":
        return torch.tanh(x)
    return x


def _check_output(op: dict, x, out, expected: list[int], runs: list) -> str | None:
    """Why this probe's output disqualifies the operator at this rank, or None."""
    import torch

    if not isinstance(out, torch.Tensor):
        return f"returns {type(out).__name__}, not one tensor"
    if not out.is_floating_point():
        return f"returns {str(out.dtype).removeprefix('torch.')}, not a floating tensor"
    if list(out.shape) != expected:
        return f"output shape {list(out.shape)} where its family predicts {expected}"
    if not all(torch.equal(out.nan_to_num(), again.nan_to_num()) for again in runs):
        return "random: runs on the same input disagree"
    if out.shape == x.shape and torch.equal(out, x):
        return "no computation: the output is the input"
    if not bool(torch.isfinite(out).all()):
        return "non-finite output"
    return None


def _probe(op: dict, rank: int, domain: str = "real") -> str | None:
    """Run `op` on the probe tensors of this rank; None when it behaves on both, else the reason."""
    shapes = BLOCK_PROBE_SHAPES if op["family"] == "block" else PROBE_SHAPES[rank]
    return next((r for r in (_probe_shape(op, shape, domain) for shape in shapes) if r), None)


def _probe_shape(op: dict, shape: list[int], domain: str) -> str | None:
    """Run `op` three times on one probe tensor; None when it behaves, else the reason."""
    import torch

    try:
        args = choose_args(op, shape, random.Random(0), PROBE_SIZES)
        expected = output_shape(op, shape, args)
    except ShapeError as exc:
        return f"shape: {exc}"
    try:
        fn = build_callable(op, args)
        x = _float_input(shape, domain)
        with torch.no_grad(), warnings.catch_warnings(record=True) as caught, _every_warning():
            warnings.simplefilter("always")
            out, *runs = (fn(x.clone()) for _ in range(3))
    except Exception as exc:
        return _short(exc)
    messages = [str(w.message) for w in caught]
    deprecated = next((m for m in messages if "deprecat" in m.lower()), None)
    if deprecated:
        return f"deprecated call form: {deprecated.splitlines()[0]}"[:160]
    if messages:  # a call form torch warns about (say, arguments it ignores) is not one to teach
        return f"warns: {messages[0].splitlines()[0]}"[:160]
    return _check_output(op, x, out, expected, runs)


@contextlib.contextmanager
def _every_warning():
    """torch's C++ warnings that fire once per process fire on every call inside (a probe must not
    miss one because an earlier probe or test triggered it first)."""
    import torch

    before = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    try:
        yield
    finally:
        torch.set_warn_always(before)


def _ranks(op: dict, domain: str = "real") -> tuple[list[int], str | None]:
    """The ranks where the operator behaves, and the first reason it did not where it did not."""
    ranks, first = [], None
    for rank in PROBE_SHAPES:
        reason = _probe(op, rank, domain)
        if reason is None:
            ranks.append(rank)
        else:
            first = first or f"rank {rank}: {reason}"
    return ranks, first


def _with_domain(op: dict) -> tuple[dict | None, str | None]:
    """The operator with the ranks and input domain (real, positive, unit interval) it runs on."""
    first = None
    for domain in ("real", "positive", "unit"):
        ranks, reason = _ranks(op, domain)
        if ranks:
            return {**op, "ranks": ranks, "domain": domain}, None
        first = first or reason
        if not reason or "non-finite" not in reason:
            break
    return None, first


# --- modules ----------------------------------------------------------------------------------


def _required(cls) -> tuple[set, str | None]:
    try:
        params = inspect.signature(cls.__init__).parameters.values()
    except (TypeError, ValueError) as exc:
        return set(), _short(exc)
    names = {p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return names - {"self"}, None


def _module_entry(name: str, cls) -> tuple[dict | None, str | None]:
    if name in CONTAINERS:
        return None, "excluded: a container, no computation of its own"
    if name.startswith("Lazy"):
        return None, "excluded: lazy module, its shapes are known only after the first call"
    required, problem = _required(cls)
    if problem:
        return None, problem
    fixed = {k: SCALAR_DEFAULTS[k] for k in required if k in SCALAR_DEFAULTS}
    required -= set(fixed)
    family = next((f for needed, f in MODULE_FAMILIES if needed == required), None)
    if family is None:
        return None, f"constructor needs {', '.join(sorted(required))}, which no shape family provides"
    family = "conv_transpose" if family == "conv" and "Transpose" in name else family
    dims = re.search(r"([123])d$", name)
    op = {"name": f"torch.nn.{name}", "call": "module", "family": family, "fixed": fixed,
          "dims": int(dims.group(1)) if dims and family in ("conv", "conv_transpose", "pool", "adaptive_pool") else 0}
    if family == "parameterless":
        return _classify(op)
    return _with_domain(op)


# --- functions: the family from what the function does to a probe tensor -----------------------

CALL_FORMS = (("elementwise", {}), ("reduce", {}), ("elementwise", {"dim": -1}), ("reduce", {"dim": -1}),
              ("binary", {}), ("flatten", {}))


def _classify(op: dict) -> tuple[dict | None, str | None]:
    """Try the call forms in turn; the first one the operator runs in is its family."""
    first = None
    for family, fixed in CALL_FORMS:
        if op["call"] == "module" and (fixed or family == "binary"):
            continue
        candidate, reason = _with_domain({**op, "family": family, "fixed": {**op.get("fixed", {}), **fixed}})
        if candidate is not None:
            return candidate, None
        first = first or reason
    return None, first


def _function_entry(path: str, fn) -> tuple[dict | None, str | None]:
    name = path.rsplit(".", 1)[-1]
    if name.endswith("_") and not name.endswith("__"):
        return None, "excluded: in-place variant"
    if path.startswith("torch.") and not path.startswith("torch.nn") and NOT_OPERATORS.match(name):
        return None, "excluded: not an operator on a tensor (factory, state or framework function)"
    return _classify({"name": path, "call": "function", "family": "elementwise", "fixed": {}})


def _candidates() -> list[tuple[str, str, object]]:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    out = []
    for name in sorted(getattr(nn, "__all__", dir(nn))):
        obj = getattr(nn, name, None)
        if inspect.isclass(obj) and issubclass(obj, nn.Module):
            out.append(("module", name, obj))
    for name in sorted(n for n in dir(F) if not n.startswith("_")):
        obj = getattr(F, name)
        defined_here = getattr(obj, "__module__", "") == F.__name__ or inspect.isbuiltin(obj)  # F.gelu is C
        if callable(obj) and not inspect.isclass(obj) and defined_here:
            out.append(("function", f"torch.nn.functional.{name}", obj))
    for name in sorted(n for n in dir(torch) if n[:1].islower()):
        obj = getattr(torch, name)
        if inspect.isbuiltin(obj):
            out.append(("function", f"torch.{name}", obj))
    return out


def _block_entries() -> list[dict]:
    entries = []
    for name, (_, mirrors, heads, intermediate) in BLOCKS.items():
        try:
            resolve(mirrors)
            found = True
        except (ImportError, AttributeError):
            found = False
        op = {"name": name, "call": "block", "family": "block", "fixed": {}, "ranks": [3], "heads": heads,
              "intermediate": intermediate, "mirrors": mirrors, "mirror_found": found, "domain": "real"}
        entries.append((op, _probe(op, 3)))
    return entries


def crawl(progress=None) -> dict:
    """The catalogue: every candidate, kept with its family, ranks and domain, or recorded with why not."""
    import torch

    operators, failures = [], {}
    candidates = _candidates()
    for i, (kind, name, obj) in enumerate(candidates):
        entry, reason = _module_entry(name, obj) if kind == "module" else _function_entry(name, obj)
        full = f"torch.nn.{name}" if kind == "module" else name
        if entry is not None:
            operators.append(entry)
        else:
            failures[full] = reason or "unknown"
        if progress and (i + 1) % 200 == 0:
            progress(f"crawled {i + 1}/{len(candidates)} candidates, {len(operators)} kept")
    for op, reason in _block_entries():
        if reason is None:
            operators.append(op)
        else:
            failures[op["name"]] = reason
    return {"version": CATALOGUE_VERSION, "torch": torch.__version__, "transformers": _transformers_version(),
            "families": sorted(FAMILIES), "operators": operators, "failures": dict(sorted(failures.items()))}


def _transformers_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("transformers")
    except Exception:
        return None
