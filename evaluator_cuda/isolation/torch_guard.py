"""Refuse torch compute outside the candidate's own extension while the candidate runs.

Two layers, both active around each checked forward call:
- a TorchFunctionMode sees Python-level torch calls (every `torch.nn.functional` callable,
  `torch.matmul`, tensor methods, ...) and lets through only allocation, views and metadata;
- a TorchDispatchMode sees every ATen operator that reaches the dispatcher, including those
  a C++ binding calls (`at::matmul`, `torch::relu`), with the same allow-list at ATen level.
After the call the modes, the torch-function state and the dispatch-key sets must be as they were
(a candidate that switched the guard off is rejected: guard_switch). Every refusal is recorded, so a
candidate that catches one is still rejected. guard_lock.py locks the off switches themselves.
The paper's harness only replaced `torch.nn.functional`; see docs/cheats.md #16.
"""

from __future__ import annotations

import contextlib

# Python-level names (the last component of torch.overrides.resolve_name) that do no math.
ALLOWED_PYTHON = frozenset(
    """
    size dim ndimension numel nelement stride storage_offset is_contiguous element_size data_ptr
    is_floating_point is_complex is_signed get_device __len__ __format__ __repr__ __hash__
    view view_as reshape reshape_as flatten unflatten unsqueeze squeeze permute transpose t
    expand expand_as narrow select split chunk unbind contiguous detach __getitem__
    to cuda cpu new_empty new_empty_strided new_zeros new_ones new_full new_tensor
    empty empty_like empty_strided zeros zeros_like ones ones_like full full_like
    tensor as_tensor is_tensor broadcast_shapes get_default_dtype is_grad_enabled
    __get__ __set_name__ requires_grad_ __torch_function__ _is_view is_pinned
    """.split()
)

# ATen operator packets that allocate, alias or move data without computing on it.
ALLOWED_ATEN = frozenset(
    """
    empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like ones ones_like
    full full_like fill zero new_zeros new_ones new_full scalar_tensor
    view _unsafe_view reshape _reshape_alias as_strided alias detach t transpose permute expand
    squeeze unsqueeze slice select split split_with_sizes unbind chunk narrow unflatten flatten
    clone copy _to_copy contiguous lift_fresh lift_fresh_copy resize set _local_scalar_dense
    view_as is_same_size _has_compatible_shallow_copy_type sym_size sym_stride sym_numel
    sym_storage_offset record_stream
    """.split()
)


class ForbiddenTorchCompute(RuntimeError):
    """Raised inside the candidate when it asks torch to compute."""


class ForbiddenGuardSwitch(ForbiddenTorchCompute):
    """Raised inside the candidate when it reaches for an off switch of this guard or of torch's precision
    (guard_lock.py); `reason` is guard_switch or precision_switch."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


_REFUSALS: list[ForbiddenTorchCompute] = []


def record_refusal(exc: ForbiddenTorchCompute) -> ForbiddenTorchCompute:
    """Keep a refusal before raising it: catching it in candidate code does not make it go away."""
    _REFUSALS.append(exc)
    return exc


def take_refusals() -> list[ForbiddenTorchCompute]:
    """The refusals since the last call of this function, oldest first."""
    taken = list(_REFUSALS)
    _REFUSALS.clear()
    return taken


_STATE_GETTERS: dict = {}


def bind_state_getters() -> None:
    """Bind what guard_state reads now, before candidate code can rebind it."""
    import torch

    if not _STATE_GETTERS:
        names = ("_is_torch_function_enabled", "_is_torch_function_mode_enabled", "_get_torch_function_state",
                 "_len_torch_function_stack", "_get_function_stack_at", "_len_torch_dispatch_stack",
                 "_get_dispatch_stack_at", "_dispatch_tls_local_exclude_set", "_dispatch_tls_local_include_set",
                 "_pop_torch_function_stack", "_pop_torch_dispatch_stack")
        _STATE_GETTERS.update({name: getattr(torch._C, name) for name in names})


def guard_state() -> tuple:
    """What the guard's modes depend on: torch-function state, both mode stacks (by identity), the
    thread's dispatch-key include and exclude sets."""
    bind_state_getters()
    get = _STATE_GETTERS
    functions = tuple(id(get["_get_function_stack_at"](i)) for i in range(get["_len_torch_function_stack"]()))
    dispatch = tuple(id(get["_get_dispatch_stack_at"](i)) for i in range(get["_len_torch_dispatch_stack"]()))
    return (get["_is_torch_function_enabled"](), get["_is_torch_function_mode_enabled"](),
            str(get["_get_torch_function_state"]()), functions, dispatch,
            str(get["_dispatch_tls_local_exclude_set"]()), str(get["_dispatch_tls_local_include_set"]()))


def _python_name(func) -> str:
    import torch

    try:
        name = torch.overrides.resolve_name(func)
    except Exception:
        name = None
    return name or getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))


def _aten_allowed(func) -> bool:
    packet = getattr(func, "overloadpacket", func)
    namespace = getattr(func, "namespace", None) or getattr(packet, "_qualified_op_name", "aten::").split("::")[0]
    base = getattr(packet, "__name__", str(packet)).split(".")[-1].rstrip("_")
    return namespace in ("aten", "prim") and base in ALLOWED_ATEN


def _build_modes():
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class RefusePythonCompute(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = _python_name(func)
            if isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
                allowed = _aten_allowed(func)
            else:
                allowed = name.rsplit(".", 1)[-1] in ALLOWED_PYTHON
            if not allowed:
                raise record_refusal(ForbiddenTorchCompute(
                    f"{name} is not allowed while the candidate runs (torch compute outside the extension)"))
            return func(*args, **(kwargs or {}))

    class RefuseAtenCompute(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # torch would wrap the handler below in one that imports torch._dynamo at its first use (a
            # second and a half of CPU per child) and then runs what that module hands back, which
            # candidate code could have planted in sys.modules. Unwrapped, the handler runs as written.
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not _aten_allowed(func):
                packet = getattr(func, "overloadpacket", func)
                name = f"{getattr(func, 'namespace', 'aten')}::{getattr(packet, '__name__', packet)}"
                raise record_refusal(ForbiddenTorchCompute(
                    f"{name} is not allowed while the candidate runs (torch compute outside the extension)"))
            return func(*args, **(kwargs or {}))

    return RefusePythonCompute, RefuseAtenCompute


_MODES = None


def _check_unchanged(before: tuple) -> ForbiddenGuardSwitch | None:
    """The refusal (recorded) if the guard state differs from `before`; modes the candidate left above the
    guard's are popped, so that the guard's own modes exit cleanly."""
    if guard_state() == before:
        return None
    get = _STATE_GETTERS
    while get["_len_torch_function_stack"]() > len(before[3]):
        get["_pop_torch_function_stack"]()
    while get["_len_torch_dispatch_stack"]() > len(before[4]):
        get["_pop_torch_dispatch_stack"]()
    return record_refusal(ForbiddenGuardSwitch(
        "guard_switch", "the torch-compute guard was switched off or changed during the call"))


def prime_guard() -> None:
    """Build the guard's modes and pass one allowed operator through both, before any candidate code.

    Built here, the modes subclass torch's mode classes as torch imported them, whatever candidate code
    later puts in their modules; and the first use of each has happened. Nothing on the guard's path
    is imported lazily (torch._dynamo is not imported at all: see _should_skip_dynamo above).
    """
    import torch

    with refuse_torch_compute(True):
        torch.empty(0)


@contextlib.contextmanager
def refuse_torch_compute(enabled: bool = True):
    """Context manager: inside it torch computes nothing except allocation, views and metadata."""
    global _MODES
    if not enabled:
        yield
        return
    if _MODES is None:
        _MODES = _build_modes()
    python_mode, aten_mode = _MODES
    with python_mode(), aten_mode():
        before = guard_state()
        try:
            yield
        finally:  # checked before the modes exit, whether the call raised or not
            changed = _check_unchanged(before)
        if changed:
            raise changed
