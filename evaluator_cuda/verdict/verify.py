"""The verdict on one input set: does the candidate's output match the reference's exactly in
structure, class, dtype, shape and device, and in value?

Values pass two criteria per floating tensor (see the README's "Correctness" section):
- elementwise, `|out - ref| <= atol_t + rtol * |ref|`, where atol_t is the paper's atol, or
  SCALE_ATOL_FRACTION of the reference tensor's largest finite magnitude when that is smaller
  (an output whose values all lie below atol is still checked at its own scale);
- whole-tensor, `||out - ref|| / ||ref|| <= norm_rtol`.

Runs in the parent (the verdict process), on copies received from the children: on the CPU, or
moved to the evaluation's GPU first (on_device) where the parent can use it.
"""

from __future__ import annotations

import math

# The elementwise atol of a tensor is at most this fraction of its reference's largest finite
# magnitude: a softmax over 262,144 columns (values near 4e-6) is checked at ~1e-2 of its peak,
# not at the paper's absolute 1e-2, which every value would pass as zeros.
SCALE_ATOL_FRACTION = 1e-2


def on_device(value, device: str):
    """A nested output (tensors in lists, tuples and dicts) with every tensor moved to `device`."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, list):
        return [on_device(v, device) for v in value]
    if isinstance(value, tuple):
        return tuple(on_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: on_device(v, device) for k, v in value.items()}
    return value


def tensor_atol(expected, atol: float) -> float:
    """The elementwise atol for one reference tensor: min(atol, SCALE_ATOL_FRACTION * max|ref|)."""
    if not (expected.is_floating_point() or expected.is_complex()) or expected.numel() == 0:
        return atol
    magnitude = expected.detach().abs()  # a fresh tensor: the non-finite values become 0 in place
    peak = float(magnitude.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0).max())
    return min(atol, SCALE_ATOL_FRACTION * peak)


def _close_fast(actual, expected, atol: float, rtol: float) -> bool:
    """A cheap sufficient test of assert_close's criterion |a - e| <= atol + rtol * |e|.

    True only when every element passes and the expected values are all finite; anything
    else (NaN, inf, integer dtypes, a real mismatch) goes to assert_close for the verdict and
    its message.
    """
    import torch

    if not (expected.is_floating_point() and actual.is_floating_point()):
        return False
    if expected.dtype != torch.float64:
        expected, actual = expected.float(), actual.float()
    bound = expected.abs()
    if not bool(torch.isfinite(bound.max())):  # max propagates NaN: a finite peak means every value is finite
        return False
    diff = (actual - expected).abs_()
    return bool((diff <= bound.mul_(rtol).add_(atol)).all())


def _walk(expected, actual, metas: list, path: str, problems: list, device_type: str, atol: float, rtol: float) -> None:
    import torch

    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            problems.append(f"{path}: expected a tensor, got {type(actual).__name__}")
            return
        meta = metas.pop(0) if metas else {}
        problem = _tensor_mismatch(expected, actual, meta, device_type) or _values_differ(expected, actual, atol, rtol)
        if problem:
            problems.append(f"{path}: {problem}")
        return
    if isinstance(actual, torch.Tensor):
        metas.pop(0) if metas else None
    if isinstance(expected, (list, tuple)):
        if type(actual) is not type(expected) or len(actual) != len(expected):
            size = f" of {len(actual)}" if isinstance(actual, (list, tuple)) else ""
            problems.append(f"{path}: expected a {type(expected).__name__} of {len(expected)}, "
                            f"got {type(actual).__name__}{size}")
            return
        for i, (e, a) in enumerate(zip(expected, actual)):
            _walk(e, a, metas, f"{path}[{i}]", problems, device_type, atol, rtol)
        return
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            problems.append(f"{path}: expected a dict with keys {sorted(expected)}")
            return
        for k in expected:
            _walk(expected[k], actual[k], metas, f"{path}[{k!r}]", problems, device_type, atol, rtol)
        return
    if isinstance(expected, float) and isinstance(actual, (int, float)) and not isinstance(actual, bool):
        if not abs(actual - expected) <= atol + rtol * abs(expected):
            problems.append(f"{path}: expected {expected}, got {actual}")
        return
    if type(actual) is not type(expected) or actual != expected:
        problems.append(f"{path}: expected {expected!r}, got {actual!r}")


def _tensor_mismatch(expected, actual, meta: dict, device_type: str) -> str | None:
    """What differs in the class, device, dtype or shape of an output tensor, or None."""
    if meta.get("cls") != "Tensor":
        return f"expected exactly torch.Tensor, got {meta.get('cls')}"
    if meta.get("device") != device_type:
        return f"expected device {device_type}, got {meta.get('device')}"
    if actual.dtype != expected.dtype:
        want, got = str(expected.dtype).removeprefix('torch.'), str(actual.dtype).removeprefix('torch.')
        return f"expected dtype {want}, got {got}"
    if tuple(actual.shape) != tuple(expected.shape):
        return f"expected shape {tuple(expected.shape)}, got {tuple(actual.shape)}"
    return None


def _values_differ(expected, actual, atol: float, rtol: float) -> str | None:
    """The elementwise criterion at the tensor's own scale (tensor_atol): None when it passes."""
    import torch

    atol_t = tensor_atol(expected, atol)
    if _close_fast(actual, expected, atol_t, rtol):
        return None
    try:
        torch.testing.assert_close(actual, expected, atol=atol_t, rtol=rtol)
    except AssertionError as exc:
        lines = [l.strip() for l in str(exc).splitlines() if l.strip()]
        scale = ""
        if atol_t != atol:
            scale = f" at the output's scale (atol {atol_t:.3g} = {SCALE_ATOL_FRACTION:g} x max|ref|)"
        return f"values differ{scale}: " + "; ".join(lines[:4])
    return None


def _tensor_pairs(expected, actual):
    """(expected, actual) tensor pairs of two structures that already compared equal in shape."""
    import torch

    if isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor):
        yield expected, actual
    elif isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
        for e, a in zip(expected, actual):
            yield from _tensor_pairs(e, a)
    elif isinstance(expected, dict) and isinstance(actual, dict):
        for k in expected:
            if k in actual:
                yield from _tensor_pairs(expected[k], actual[k])


def relative_error(expected, actual) -> float | None:
    """max over floating tensors of ||actual - expected||_2 / ||expected||_2 (torch's pairwise-summed norms).

    None when there is no floating tensor with a finite, non-zero reference.
    """
    import torch

    worst = None
    for e, a in _tensor_pairs(expected, actual):
        if not (e.is_floating_point() and a.is_floating_point()) or e.shape != a.shape or e.numel() == 0:
            continue
        if e.dtype != torch.float64:
            e, a = e.float(), a.float()
        scale = float(torch.linalg.vector_norm(e))
        if not math.isfinite(scale) or scale == 0.0:  # inf/NaN references: atol/rtol decide alone
            continue
        err = float(torch.linalg.vector_norm(a - e)) / scale
        err = err if math.isfinite(err) else float("inf")
        worst = err if worst is None else max(worst, err)
    return worst


# Relative error of the whole tensor that an honest kernel of each output dtype stays under;
# above it the output looks computed at a lower precision (docs/cheats.md #15): bf16 rounding of
# float32 values gives ~1e-3, float32 reordering and fast-math ~1e-6.
PRECISION_BOUNDS = {"float64": 1e-9, "float32": 1e-4, "float16": 5e-3}


def precision_bound(expected) -> float | None:
    """The PRECISION_BOUNDS entry of the first floating tensor of `expected` (None: no bound)."""
    for e, _ in _tensor_pairs(expected, expected):
        if e.is_floating_point():
            return PRECISION_BOUNDS.get(str(e.dtype).removeprefix("torch."))
    return None


def tolerances(expected, atol: float, rtol: float, norm_rtol: float) -> dict:
    """What the verdict on outputs like `expected` checks: per floating tensor its elementwise
    atol, and whether any was scaled down to the output's magnitude (for the record)."""
    atols = [tensor_atol(e, atol) for e, _ in _tensor_pairs(expected, expected) if e.is_floating_point()]
    return {"atol": atol, "rtol": rtol, "tensor_atol": atols, "norm_rtol": norm_rtol,
            "scaled": any(a < atol for a in atols)}


def criterion_of(problem: str) -> str:
    """Which criterion a compare_outputs()/scale_problem() problem failed (for the record)."""
    if "wrong at the tensor's scale" in problem:
        return "relative_norm"
    if "values differ at the output's scale" in problem:
        return "elementwise_scaled"
    if "values differ" in problem:
        return "elementwise"
    return "structure"  # structure, class, device, dtype, shape, or a non-tensor value


def compare_outputs(expected, actual, actual_meta: list[dict], device_type: str, atol: float, rtol: float,
                    norm_rtol: float | None = None) -> str | None:
    """None if `actual` passes against `expected`, else the first problem as one line.

    `norm_rtol`: the scale-aware check on top of atol/rtol (docs/cheats.md #2): the relative error of
    each whole floating tensor, ||actual - expected|| / ||expected||, must not exceed it, so a
    tensor whose true values are all below atol cannot pass as zeros or a constant.

    `actual_meta`: what the candidate process reported for each tensor of `actual`, in
    depth-first order (class name and device; see wire.py).
    """
    problems: list[str] = []
    _walk(expected, actual, list(actual_meta), "output", problems, device_type, atol, rtol)
    if problems:
        return problems[0]
    if norm_rtol is not None:
        return scale_problem(relative_error(expected, actual), norm_rtol)
    return None


def scale_problem(err: float | None, norm_rtol: float) -> str | None:
    """The scale-aware verdict for a relative_error() value (None: passes)."""
    if err is not None and not err <= norm_rtol:
        return f"output: wrong at the tensor's scale: ||out - ref|| / ||ref|| = {err:.3g} > {norm_rtol:g}"
    return None


def outputs_ignore_inputs(expected_sets: list, actual_sets: list) -> bool:
    """True when the reference outputs differ between input sets but the candidate's are all
    identical (an output that does not depend on its inputs, docs/cheats.md #2)."""
    import torch

    def flat(value) -> list:
        return [t.reshape(-1) for t, _ in _tensor_pairs(value, value)]

    def same(x, y) -> bool:
        fx, fy = flat(x), flat(y)
        return len(fx) == len(fy) and all(a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
                                          for a, b in zip(fx, fy))

    if len(expected_sets) < 2 or not flat(expected_sets[0]):
        return False
    reference_varies = any(not same(expected_sets[0], e) for e in expected_sets[1:])
    candidate_constant = all(same(actual_sets[0], a) for a in actual_sets[1:])
    return reference_varies and candidate_constant
