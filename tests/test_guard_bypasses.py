"""Planted candidates that try to switch the guards off or slip past the static rules by spelling
(docs/cheats.md #21, #22), each rejected with its reason in both solution formats where the form
exists, and honest controls that still pass. Host backend, so CI runs them.

Two layers are shown apart: with the static checks on, the source is rejected before anything is
built; with them off (`static_checks=False`), the candidate child's locked switches, its guard-state
and precision checks and its record of swallowed refusals reject the same candidate at run time."""

import textwrap

import pytest

from evaluator_cuda.evaluation import evaluate
from evaluator_cuda.isolation.static_checks import check_python_source, check_solution_sources
from evaluator_cuda.solutions import Solution
from evaluator_helpers import (AXPY_TASK, BINDING, KERNEL, build_cache, host, kernelbench, model_new_with,  # noqa: F401
                               workspace)

HONEST_CALL = "return cuda_extension.axpy_forward(x, y, float(self.alpha))"
TOKEN_CALL = "cuda_extension.axpy_forward(x, y, 0.0)\n"  # one call into the extension, its result unused


def rejected(record: dict, reason: str, needle: str | None = None) -> None:
    assert record["status"] == "incorrect", (record["status"], record["message"])
    assert record["reward"] == -1
    assert record.get("rejected") == reason, record["message"]
    if needle:
        assert needle in record["message"], record["message"]


def both_formats(body: str, prelude: str = "") -> dict[str, Solution]:
    """The same forward body as a workspace model_new.py (calling the extension once) and a KernelBench file."""
    return {"workspace": workspace(model_new=model_new_with(TOKEN_CALL + body, prelude=prelude)),
            "kernelbench": kernelbench(body, prelude=prelude)}


# --- the torch-compute guard switched off from candidate code --------------------------------

GUARD_OFF = {  # name -> (forward body computing with torch once the guard is off, prelude, reason)
    "disable_torch_function": ("with torch._C.DisableTorchFunction():\n    return self.alpha * x + y", "",
                               "guard_switch"),
    "alias_and_getattr": ("with getattr(C, 'Disable' + 'TorchFunction')():\n    return self.alpha * x + y",
                          "from torch import _C as C", "guard_switch"),
    "dispatch_modes_off": ("with _disable_current_modes():\n    return torch.add(y, x, alpha=self.alpha)",
                           "from torch.utils._python_dispatch import _disable_current_modes", "guard_switch"),
    "unset_dispatch_mode": ("torch._C._unset_dispatch_mode(torch._C._TorchDispatchModeKey.PROXY)\n"
                            "return self.alpha * x + y", "", "guard_switch"),
    "pop_mode": ("torch.overrides._pop_mode()\nreturn self.alpha * x + y", "", "guard_switch"),
}
STATIC_REASONS = {"alias_and_getattr": "torch_private"}  # `from torch import _C` is refused before the switch


@pytest.mark.parametrize("fmt", ["workspace", "kernelbench"])
@pytest.mark.parametrize("case", sorted(GUARD_OFF))
def test_guard_switch_is_rejected_statically(tmp_path, case, fmt):
    body, prelude, reason = GUARD_OFF[case]
    record = evaluate(AXPY_TASK, both_formats(body, prelude)[fmt], host(str(tmp_path)))
    rejected(record, STATIC_REASONS.get(case, reason), "is not allowed")
    assert "build" not in record["wall_s"]


@pytest.mark.parametrize("fmt", ["workspace", "kernelbench"])
@pytest.mark.parametrize("case", sorted(GUARD_OFF))
def test_guard_switch_is_refused_at_run_time(build_cache, case, fmt):
    body, prelude, reason = GUARD_OFF[case]
    record = evaluate(AXPY_TASK, both_formats(body, prelude)[fmt], host(build_cache, static_checks=False))
    rejected(record, reason, "not allowed in candidate code")


def test_switch_reached_through_torch_code_is_refused(build_cache):
    """The off switch called by a torch helper on the candidate's behalf: the candidate is still on the stack."""
    body = "import torch.utils._pytree as pytree\n" \
           "pytree.tree_map(torch._C._unset_dispatch_mode, [torch._C._TorchDispatchModeKey.PROXY])\n" \
           "return self.alpha * x + y"
    record = evaluate(AXPY_TASK, both_formats(body)["workspace"], host(build_cache, static_checks=False))
    rejected(record, "guard_switch", "_unset_dispatch_mode")


def test_guard_state_changed_during_the_call_is_rejected(build_cache):
    """A mode of the candidate's own left on the stack: no switch is touched, the guard state differs after the call."""
    body = "torch.overrides.TorchFunctionMode().__enter__()\n" + HONEST_CALL
    record = evaluate(AXPY_TASK, workspace(model_new=model_new_with(body)), host(build_cache))
    rejected(record, "guard_switch", "switched off or changed during the call")


@pytest.mark.parametrize("fmt", ["workspace", "kernelbench"])
def test_swallowed_refusal_is_a_fallback(tmp_path, build_cache, fmt):
    """torch compute in a module-level helper whose try/except falls back when the guard refuses."""
    prelude = textwrap.dedent(
        """
        def combine(a, x, y):
            try:
                return a * x + y
            except Exception:
                return y
        """
    )
    solution = both_formats("return combine(self.alpha, x, y)", prelude)[fmt]
    rejected(evaluate(AXPY_TASK, solution, host(str(tmp_path))), "fallback", "try/except")
    rejected(evaluate(AXPY_TASK, solution, host(build_cache, static_checks=False)), "fallback",
             "caught the refusal")


# --- global precision switches ---------------------------------------------------------------

PRECISION = {
    "matmul_precision_call": "torch.set_float32_matmul_precision('medium')\n",
    "tf32_assignment": "torch.backends.cuda.matmul.allow_tf32 = True\n",
    "cudnn_tf32_alias": "b = torch.backends.cudnn\nb.allow_tf32 = not b.allow_tf32\n",
    "default_dtype": "torch.set_default_dtype(torch.float64)\n",
}


@pytest.mark.parametrize("fmt", ["workspace", "kernelbench"])
@pytest.mark.parametrize("case", sorted(PRECISION))
def test_precision_switch_is_rejected_statically(tmp_path, case, fmt):
    record = evaluate(AXPY_TASK, both_formats(PRECISION[case] + "return x")[fmt], host(str(tmp_path)))
    rejected(record, "precision_switch")


@pytest.mark.parametrize("case", sorted(PRECISION))
def test_precision_switch_is_rejected_at_run_time(build_cache, case):
    for where in ("forward", "import"):
        body, prelude = (PRECISION[case] + HONEST_CALL, "") if where == "forward" else (HONEST_CALL, PRECISION[case])
        record = evaluate(AXPY_TASK, workspace(model_new=model_new_with(body, prelude=prelude)),
                          host(build_cache, static_checks=False))
        rejected(record, "precision_switch")


# --- static rules resolve names --------------------------------------------------------------

RESOLVED = {  # prelude + forward line -> reason, each a spelling the rule once missed
    "stream_imported_as": ("from torch.cuda import Stream as S", "s = S()", "side_stream"),
    "torch_stream": ("", "s = torch.Stream()", "side_stream"),
    "stream_by_getattr": ("", "s = getattr(torch.cuda, 'Str' + 'eam')()", "side_stream"),
    "stream_through_other_module": ("import torch.nn.functional as F", "s = F.torch.cuda.streams.Stream()",
                                    "side_stream"),
    "stream_module_alias": ("cu = torch.cuda", "s = cu.Stream()", "side_stream"),
    "sys_modules_imported": ("from sys import modules", "t = modules['torch']", "introspection"),
    "os_through_os_path": ("import os.path", "os.path.os.system('true')", "processes"),
    "computed_getattr": ("", "f = getattr(torch, ''.join(reversed('dda')))", "introspection"),
    "private_through_getattr": ("", "c = getattr(torch, '_' + 'C')", "torch_private"),
    "suppress_instead_of_try": ("import contextlib", "with contextlib.suppress(Exception):\n    return x", "fallback"),
}


@pytest.mark.parametrize("fmt", ["workspace", "kernelbench"])
@pytest.mark.parametrize("case", sorted(RESOLVED))
def test_names_are_resolved_before_the_rules(tmp_path, case, fmt):
    prelude, line, reason = RESOLVED[case]
    record = evaluate(AXPY_TASK, both_formats(line + "\nreturn x", prelude)[fmt], host(str(tmp_path)))
    rejected(record, reason)


def test_honest_aliases_and_import_fallbacks_pass(build_cache):
    """Aliases of harmless names, getattr on the candidate's own object, try/except around an import."""
    prelude = "import torch.nn.functional as F\nfrom torch import nn as tnn\n" \
              "try:\n    import numpy\nexcept ImportError:\n" \
              "    numpy = None\nEXT = cuda_extension\n"
    body = "fn = getattr(EXT, 'axpy_forward')\nalpha = getattr(self, 'alpha')\n" \
           "return fn(x.contiguous(), y, float(alpha))"
    assert check_python_source("model_new.py", model_new_with(body, prelude=prelude)) == []
    record = evaluate(AXPY_TASK, workspace(model_new=model_new_with(body, prelude=prelude)), host(build_cache))
    assert record["status"] == "correct", record["message"]


# --- the C++ rule understands methods, using and dispatch-key guards -------------------------

CPP = {  # binding body (x, y, a, out in scope) or a line before the function -> reason
    "tensor_method": ("", "out.copy_(x.mul(a).add(y));", "torch_compute_cpp"),
    "using_namespace": ("using namespace at;", "out.copy_(add(mul(x, a), y));", "torch_compute_cpp"),
    "using_declaration": ("using at::add;", "out.copy_(add(x, y, a));", "torch_compute_cpp"),
    "namespace_alias": ("namespace T = at;", "out.copy_(T::add(y, x, a));", "torch_compute_cpp"),
    "exclude_python_key": ("", "c10::impl::ExcludeDispatchKeyGuard g(c10::DispatchKey::Python);", "dispatch_guard"),
    "below_autograd": ("", "at::AutoDispatchBelowAutograd g;", "dispatch_guard"),
}


def binding_with(before: str, body: str) -> Solution:
    files = dict(workspace().files)
    include = '#include "binding_registry.h"'
    text = BINDING.replace("BODY", body).replace(include, f"{include}\n{before}")
    files["kernels/axpy_binding.cpp"] = text.encode()
    return Solution("workspace", files, "model_new.py", "axpy")


def inline_source_with(before: str, body: str) -> Solution:
    """A KernelBench file holding the C++ as a load_inline source string (never built: rejected first)."""
    cpp = f"#include <torch/extension.h>\n{before}\ntorch::Tensor f(torch::Tensor x, torch::Tensor y, double a) {{\n" \
          f"  auto out = torch::empty_like(x);\n  {body}\n  return out;\n}}\n"
    return kernelbench("return x", prelude=f"CPP_SOURCE = {cpp!r}")


@pytest.mark.parametrize("case", sorted(CPP))
def test_cpp_forms_are_rejected_in_both_formats(tmp_path, case):
    before, body, reason = CPP[case]
    for solution in (binding_with(before, body), inline_source_with(before, body)):
        record = evaluate(AXPY_TASK, solution, host(str(tmp_path)))
        rejected(record, reason)
        assert "build" not in record["wall_s"]  # rejected from the sources, before any build


@pytest.mark.slow  # a torch build (the fast build cannot take ATen compute)
def test_cpp_tensor_method_is_refused_at_run_time_too(build_cache):
    """A binding that computes with ATen tensor methods is refused at the dispatcher when it runs
    (docs/cheats.md #16), whatever the static checks say; the torch build made it, and the record says why
    the fast build handed over."""
    solution = binding_with("", "out.copy_(x.mul(a).add(y));")
    assert "torch_compute_cpp" in [f.reason for f in check_solution_sources(solution.files)]
    record = evaluate(AXPY_TASK, solution, host(build_cache, static_checks=False))  # the run-time refusal
    assert record["status"] == "incorrect" and record["reward"] == -1, record["message"]
    assert "mul" in record["message"] and "not allowed" in record["message"], record["message"]
    assert record["build"]["path"] == "torch" and record["build"]["fast_fallback"]


def test_honest_cpp_with_using_and_metadata_methods_passes(build_cache):
    """`using namespace torch;`, an own device-style function named like a torch op, scalar math and
    metadata methods are not torch compute."""
    before = "using namespace torch;\nstatic float relu(float v) { return v > 0 ? v : 0; }\n" \
             "namespace T = torch;"
    body = "TORCH_CHECK(x.dim() == 1 && x.size(0) == out.numel(), \"shape\");\n" \
           "  TORCH_CHECK(relu(1.0f) == 1.0f && exp(0.0) == 1.0, \"scalar math\");\n" \
           "  auto spare = T::empty_like(out); (void)spare;"
    solution = binding_with(before, body)
    assert check_solution_sources(solution.files) == []
    record = evaluate(AXPY_TASK, solution, host(build_cache))
    assert record["status"] == "correct", record["message"]


def test_prose_naming_tensor_methods_is_not_cpp():
    """A docstring that mentions `x.matmul(w)` is prose; the same text in a C++ source string is compute."""
    prose = 'class ModelNew:\n    """Equivalent to x.matmul(w) followed by y.relu(), fused in one kernel."""\n'
    assert check_python_source("model_new.py", prose) == []
    source = 'SRC = "torch::Tensor f(torch::Tensor x, torch::Tensor w) { return x.matmul(w); }"\n'
    assert [f.reason for f in check_python_source("model_new.py", source)] == ["torch_compute_cpp"]


# --- failures the candidate's process claims for someone else --------------------------------

@pytest.mark.parametrize("kind", ["internal", "task"])
def test_a_candidate_child_claiming_an_infrastructure_or_task_failure_is_a_runtime_error(build_cache, kind):
    """The candidate's code owns its process: a reply there that blames the harness or the task would take the
    episode out of training instead of scoring it. It is the candidate's runtime_error (reward -1)."""
    prelude = ("from evaluator_cuda.roles.errors import HandlerError\n"
               f"def _blame(self, req):\n    raise HandlerError({kind!r}, 'not my fault')\n"
               "import sys\nsys.modules['evaluator_cuda.roles.candidate'].CandidateRole.do_call = _blame\n")
    record = evaluate(AXPY_TASK, workspace(model_new=model_new_with(HONEST_CALL, prelude=prelude)),
                      host(build_cache, static_checks=False))
    assert (record["status"], record["reward"]) == ("runtime_error", -1), record["message"]
    assert "not my fault" in record["message"]


def test_a_self_check_whose_task_fails_to_load_is_a_task_error(build_cache):
    """A self-check (the reference as the candidate) of a task that does not load stays a task_error: only
    what the candidate's process claims for itself is taken as the candidate's."""
    from evaluator_cuda.solutions import reference_solution
    from evaluator_cuda.tasks import Task

    broken = Task(name="broken", source=AXPY_TASK.source.replace("def get_inputs", "def get_inputs_gone"))
    record = evaluate(broken, reference_solution(broken.name), host(build_cache))
    assert record["status"] == "task_error", record["message"]


class _BuildChild:
    """A torch build child whose process the candidate's static initialiser took over: it dies, or answers
    with a failure of its own making."""

    def __init__(self, how):
        self.how = how

    def __call__(self, *args, **kwargs):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def request(self, message, timeout):
        from evaluator_cuda.isolation.sandbox import ChildFailed

        if self.how == "died":
            raise ChildFailed("died", "build process exited with status 3")
        if self.how == "protocol":
            raise ChildFailed("protocol", "build process broke the protocol: malformed header")
        return {"ok": False, "kind": "internal", "message": "the harness broke, honestly"}


@pytest.mark.parametrize("how", ["died", "protocol", "internal"])
def test_a_torch_build_child_that_dies_or_blames_the_harness_is_a_compile_error_and_not_cached(monkeypatch, tmp_path,
                                                                                              how):
    """The torch build child imports what it built, so the candidate's static initialisers run there
    (docs/cheats.md #25): what that process does is the candidate's compile_error, not an infra_error."""
    from evaluator_cuda.extension import torch_build

    monkeypatch.setattr(torch_build, "Child", _BuildChild(how))
    settings = host(str(tmp_path), fast_build=False)
    sources = {"kernels/axpy.cpp": KERNEL.replace("OP", "+").encode(), "kernels/axpy_binding.cpp": BINDING.encode()}
    built = torch_build.build_with_torch(sources, settings)
    assert built.status == "compile_error" and built.so_path is None, built
    assert "the build failed" in built.diagnostics[0]["message"]
    assert torch_build._cached(torch_build.build_cache_dir(settings) / torch_build.build_key(sources, settings)) is None
