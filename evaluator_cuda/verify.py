"""The verdict on one input set: does the candidate's output match the reference's exactly in
structure, class, dtype, shape and device, and in value within `assert_close(atol, rtol)`?

Runs in the parent (the verdict process), on CPU copies received from the children.
"""

from __future__ import annotations


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
    if not bool(torch.isfinite(expected).all()):
        return False
    diff = (actual - expected).abs_()
    return bool((diff <= expected.abs().mul_(rtol).add_(atol)).all())


def _walk(expected, actual, metas: list, path: str, problems: list, device_type: str, atol: float, rtol: float) -> None:
    import torch

    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            problems.append(f"{path}: expected a tensor, got {type(actual).__name__}")
            return
        meta = metas.pop(0) if metas else {}
        if meta.get("cls") != "Tensor":
            problems.append(f"{path}: expected exactly torch.Tensor, got {meta.get('cls')}")
            return
        if meta.get("device") != device_type:
            problems.append(f"{path}: expected device {device_type}, got {meta.get('device')}")
            return
        if actual.dtype != expected.dtype:
            problems.append(f"{path}: expected dtype {str(expected.dtype).removeprefix('torch.')}, got {str(actual.dtype).removeprefix('torch.')}")
            return
        if tuple(actual.shape) != tuple(expected.shape):
            problems.append(f"{path}: expected shape {tuple(expected.shape)}, got {tuple(actual.shape)}")
            return
        if _close_fast(actual, expected, atol, rtol):
            return
        try:
            torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)
        except AssertionError as exc:
            lines = [l.strip() for l in str(exc).splitlines() if l.strip()]
            problems.append(f"{path}: values differ: " + "; ".join(lines[:4]))
        return
    if isinstance(actual, torch.Tensor):
        metas.pop(0) if metas else None
    if isinstance(expected, (list, tuple)):
        if type(actual) is not type(expected) or len(actual) != len(expected):
            problems.append(f"{path}: expected a {type(expected).__name__} of {len(expected)}, got {type(actual).__name__}" + (f" of {len(actual)}" if isinstance(actual, (list, tuple)) else ""))
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


def compare_outputs(expected, actual, actual_meta: list[dict], device_type: str, atol: float, rtol: float) -> str | None:
    """None if `actual` passes against `expected`, else the first problem as one line.

    `actual_meta`: what the candidate process reported for each tensor of `actual`, in
    depth-first order (class name and device; see wire.py).
    """
    problems: list[str] = []
    _walk(expected, actual, list(actual_meta), "output", problems, device_type, atol, rtol)
    return problems[0] if problems else None
