"""The torch-compute guard's off switches, locked in the candidate child before candidate code loads
(docs/cheats.md #22).

Every entry point that turns the guard off or changes torch's global precision is replaced, under
every name any loaded torch module holds it by, with a wrapper that refuses candidate code: calls
through an alias, `getattr` or a module the static checks missed reach the wrapper all the same.
- SWITCHES are refused whenever candidate code is on the stack (torch code the candidate calls
  cannot switch the guard off on its behalf);
- STACK_PRIMITIVES pop the guard's modes and are what torch's own mode machinery runs on, so
  only a direct call from candidate code is refused.
Candidate code is any frame whose file is not under the Python installation (stdlib, site-packages)
or the evaluator. A refusal is recorded before it is raised: a candidate that catches it is still
rejected (torch_guard.take_refusals). Precision settings are read through getters bound here, so
patching them later changes nothing the harness sees.
"""

from __future__ import annotations

import functools
import os
import sys

from .torch_guard import ForbiddenGuardSwitch, bind_state_getters, record_refusal

SWITCHES = {
    "torch._C": """DisableTorchFunction _DisableTorchFunction _disabled_torch_function_impl _DisableTorchDispatch
        _DisablePythonDispatcher _EnablePythonDispatcher _unset_dispatch_mode _set_dispatch_mode
        ExcludeDispatchKeyGuard _ExcludeDispatchKeyGuard _IncludeDispatchKeyGuard _ForceDispatchKeyGuard
        _SetExcludeDispatchKeyGuard _AutoDispatchBelowAutograd _AutoDispatchBelowADInplaceOrView
        _RestorePythonTLSSnapshot
        _set_torch_function_state _dispatch_tls_set_dispatch_key_excluded _dispatch_tls_set_dispatch_key_included
        _skip_one_hop_torch_function _set_skip_next_torch_function""",
    "torch.utils._python_dispatch": "_disable_current_modes _disable_infra_mode _unset_infra_mode",
    "torch.overrides": "_enable_torch_function",
}
PRECISION_SWITCHES = {
    "torch._C": """_set_cublas_allow_tf32 _set_cudnn_allow_tf32 _set_float32_matmul_precision
        _set_cublas_allow_bf16_reduced_precision_reduction _set_cublas_allow_fp16_reduced_precision_reduction
        _set_cpu_allow_fp16_reduced_precision_reduction _set_onednn_allow_tf32 _set_fp32_precision_setter
        _set_cublas_allow_fp16_accumulation
        _set_default_dtype set_flush_denormal""",
    "torch": "set_float32_matmul_precision set_default_dtype set_default_tensor_type set_flush_denormal",
}
STACK_PRIMITIVES = {
    "torch._C": "DisableTorchFunctionSubclass _DisableTorchFunctionSubclass _pop_torch_function_stack "
                "_pop_torch_dispatch_stack",
    "torch.overrides": "_pop_mode _pop_mode_temporarily",
    "torch.utils._python_dispatch": "_pop_mode _pop_mode_temporarily",
}
# What the harness compares before and after candidate code: name -> getter in torch._C.
PRECISION_GETTERS = ("_get_cublas_allow_tf32", "_get_cudnn_allow_tf32", "_get_float32_matmul_precision",
                     "_get_cublas_allow_bf16_reduced_precision_reduction",
                     "_get_cublas_allow_fp16_reduced_precision_reduction",
                     "_get_cpu_allow_fp16_reduced_precision_reduction", "_get_onednn_allow_tf32",
                     "_get_cublas_allow_fp16_accumulation")

_TRUSTED: tuple[str, ...] = ()
_PRECISION: dict = {}


def _trusted_roots() -> tuple[str, ...]:
    evaluator = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, evaluator}
    return tuple(os.path.join(os.path.realpath(r), "") for r in roots) + tuple(os.path.join(r, "") for r in roots)


def is_candidate_frame(frame) -> bool:
    filename = frame.f_code.co_filename
    return not (filename.startswith(_TRUSTED) or filename.startswith("<frozen "))


def candidate_on_stack(frame) -> bool:
    while frame is not None:
        if is_candidate_frame(frame):
            return True
        frame = frame.f_back
    return False


def _refusing(original, qualname: str, reason: str, whole_stack: bool):
    def refuse_candidate(*args, **kwargs):
        caller = sys._getframe(1)
        if candidate_on_stack(caller) if whole_stack else is_candidate_frame(caller):
            what = "changes torch's precision settings" if reason == "precision_switch" else (
                "switches the torch-compute guard off")
            raise record_refusal(ForbiddenGuardSwitch(reason, f"{qualname} {what}; not allowed in candidate code"))
        return original(*args, **kwargs)

    try:
        functools.update_wrapper(refuse_candidate, original)
    except (AttributeError, TypeError):
        pass
    refuse_candidate.__wrapped_original__ = original
    return refuse_candidate


def _entry_points() -> list[tuple[str, str, str, bool]]:
    """(module, name, reason, whole_stack) of every entry point to lock."""
    tables = ((SWITCHES, "guard_switch", True), (PRECISION_SWITCHES, "precision_switch", True),
              (STACK_PRIMITIVES, "guard_switch", False))
    return [(module, name, reason, whole) for table, reason, whole in tables
            for module, names in table.items() for name in names.split()]


def lock_guard_switches() -> int:
    """Replace every off switch in every loaded torch module; the number of replaced bindings."""
    global _TRUSTED
    import importlib

    _TRUSTED = _trusted_roots()
    bind_precision_getters()
    bind_state_getters()
    wrappers = {}
    for module_name, name, reason, whole_stack in _entry_points():
        module = importlib.import_module(module_name)
        original = getattr(module, name, None)
        if original is not None and id(original) not in wrappers:
            wrappers[id(original)] = (original, _refusing(original, f"{module_name}.{name}", reason, whole_stack))
    return _replace_everywhere(wrappers)


def _replace_everywhere(wrappers: dict) -> int:
    """Every loaded torch module's binding of a locked entry point, by identity (aliases included)."""
    replaced = 0
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "torch" or module_name.startswith("torch.")):
            continue
        namespace = getattr(module, "__dict__", {})
        for attr, value in list(namespace.items()):
            entry = wrappers.get(id(value))
            if entry is not None and entry[0] is value:
                try:
                    setattr(module, attr, entry[1])
                    replaced += 1
                except (AttributeError, TypeError):
                    pass
    return replaced


def bind_precision_getters() -> None:
    """Bind the precision getters now, before candidate code can rebind them."""
    import torch

    if not _PRECISION:
        _PRECISION.update({name: getattr(torch._C, name) for name in PRECISION_GETTERS if hasattr(torch._C, name)})
        _PRECISION["default_dtype"] = torch.get_default_dtype


def precision_settings() -> dict:
    """torch's global precision settings, read through the getters bound before candidate code loaded."""
    bind_precision_getters()
    settings = {}
    for name, getter in _PRECISION.items():
        try:
            settings[name] = str(getter())
        except Exception as exc:  # a getter this build does not support
            settings[name] = type(exc).__name__
    return settings
