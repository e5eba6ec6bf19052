"""Input sets made from seeds, the same way in the reference child and the candidate child.

An input set is `get_inputs()` of the task after `torch.manual_seed(seed)`. On a GPU the task's
factory calls (torch.randn, ...) run on the device, under `torch.device`: host-side generation of
large random tensors would cost more than the whole evaluation. The reference child decides where
sets are made (`generated_on`); a candidate child that makes its own sets from the seeds of its
calls makes them there too, with the same code, so an honest child gets the same bits.
"""

from __future__ import annotations

from ..tasks import TaskError


def checked_inputs(task_name: str, fn_name: str, values) -> list:
    """`values` as a list, when it is a list or tuple of values a set may hold."""
    import torch

    if not isinstance(values, (list, tuple)):
        raise TaskError(task_name, f"{fn_name}() returned {type(values).__name__}, expected a list or tuple")
    for v in values:
        if not isinstance(v, (torch.Tensor, int, float, bool, str, type(None), list, tuple, torch.dtype)):
            raise TaskError(task_name, f"{fn_name}() returned an element of type {type(v).__name__}")
    return list(values)


def inputs_from_seed(task_name: str, get_inputs, seed: int, on_device: bool) -> list:
    """get_inputs() after seeding; under `torch.device("cuda")` when `on_device`. Raises what
    get_inputs raised (the caller decides whose failure it is)."""
    import torch

    torch.manual_seed(int(seed))
    if on_device:
        with torch.device("cuda"):
            return checked_inputs(task_name, "get_inputs", get_inputs())
    return checked_inputs(task_name, "get_inputs", get_inputs())


def same_inputs(first: list, again: list) -> bool:
    """Two input sets equal to the bit: tensors of one dtype, shape and device with equal bytes, other
    values equal."""
    import torch

    if len(first) != len(again):
        return False
    for a, b in zip(first, again):
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
                return False
            if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
                return False
            if a.numel() and not torch.equal(_bits(a), _bits(b)):
                return False
        elif type(a) is not type(b) or a != b:
            return False
    return True


def _bits(t):
    """The tensor's elements as integers of its width (NaNs with equal bits compare equal)."""
    import torch

    t = t.detach().contiguous()
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(t.element_size())
    if width is None or t.dtype == torch.bool:
        return t
    return t.view(width)


def nbytes(value) -> int:
    """Bytes of the tensors in a nested value (lists, tuples, dicts)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(nbytes(v) for v in value)
    if isinstance(value, dict):
        return sum(nbytes(v) for v in value.values())
    return 0
