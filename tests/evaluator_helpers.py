"""Shared fixtures of the evaluator tests: the axpy task, workspace and KernelBench-file
candidates built from small templates, and host-backend settings."""

import textwrap
from pathlib import Path

try:
    import pytest
except ImportError:  # scripts/check_hardening_gpu.py on a machine without pytest
    pytest = None

from evaluator_cuda.settings import EvalSettings
from evaluator_cuda.solutions import Solution
from evaluator_cuda.tasks import Task

AXPY_TASK = Task(
    name="axpy",
    source=textwrap.dedent(
        """
        import torch

        class Model(torch.nn.Module):
            def __init__(self, alpha):
                super().__init__()
                self.alpha = alpha

            def forward(self, x, y):
                return self.alpha * x + y

        def get_inputs():
            return [torch.randn(4096), torch.randn(4096)]

        def get_init_inputs():
            return [2.5]
        """
    ),
)

KERNEL = """#include <cstdint>
extern "C" void axpy_launcher(const float* x, const float* y, float* out, float a, int64_t n, int config, void* stream) {
  (void)config; (void)stream;
  for (int64_t i = 0; i < n; ++i) out[i] = a * x[i] OP y[i];
}
"""
BINDING = """#include "binding_registry.h"
extern "C" void axpy_launcher(const float* x, const float* y, float* out, float a, int64_t n, int config, void* stream);
torch::Tensor axpy_forward(torch::Tensor x, torch::Tensor y, double a) {
  TORCH_CHECK(x.is_contiguous() && y.is_contiguous() && x.scalar_type() == torch::kFloat32, "contiguous float32 only");
  auto out = torch::empty_like(x);
  axpy_launcher(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), (float)a, x.numel(), 0, nullptr);
  BODY
  return out;
}
REGISTER_BINDING(axpy_forward, axpy_forward);
"""
MODEL_NEW = """import torch
import cuda_extension

class ModelNew(torch.nn.Module):
    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha

    def forward(self, x, y):
        return cuda_extension.axpy_forward(x, y, float(self.alpha))
"""


def workspace(op: str = "+", binding_body: str = "", kernel: str | None = None, model_new: str | None = None) -> Solution:
    files = {
        "model_new.py": (model_new if model_new is not None else MODEL_NEW).encode(),
        "kernels/axpy.cpp": (kernel if kernel is not None else KERNEL.replace("OP", op)).encode(),
        "kernels/axpy_binding.cpp": BINDING.replace("BODY", binding_body).encode(),
    }
    return Solution("workspace", files, "model_new.py", "axpy")


def kernelbench(forward_body: str, prelude: str = "") -> Solution:
    source = f"""import torch
import torch.nn.functional as F
{prelude}

class ModelNew(torch.nn.Module):
    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha

    def forward(self, x, y):
{textwrap.indent(textwrap.dedent(forward_body), '        ')}
"""
    return Solution("kernelbench", {"candidate.py": source.encode()}, "candidate.py", "axpy")


def _build_cache() -> str:
    """Persistent, content-hash keyed: a source compiled by an earlier test session is reused.

    The evaluator's default cache ($CUDA_AGENT_CACHE, which tests/conftest.py points at
    $CUDA_AGENT_TEST_CACHE or ~/.cache/cuda-agent-tests), so that these builds, the binding
    runtime and the torch build's precompiled header are shared with the evaluator workers
    and every other test that uses the default cache."""
    from evaluator_cuda.settings import cache_root

    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    return str(root)


build_cache = pytest.fixture(scope="session", name="build_cache")(_build_cache) if pytest else _build_cache


def host(cache_dir: str, **overrides) -> EvalSettings:
    overrides.setdefault("profile", False)
    # The schedule's timed calls alone unless a test asks for further rounds: the tests' candidates take
    # microseconds a call, whose medians stay imprecise, so every profiled evaluation would spend the budget.
    overrides.setdefault("timing_rounds_budget_s", 0.0)
    return EvalSettings.for_backend("host", cache_dir=cache_dir, **overrides)


def model_new_with(forward_body: str, prelude: str = "", init_extra: str = "") -> str:
    """A workspace model_new.py (imports cuda_extension) with its own forward body."""
    return f"""import torch
import cuda_extension
{prelude}

class ModelNew(torch.nn.Module):
    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha
{textwrap.indent(textwrap.dedent(init_extra), '        ')}

    def forward(self, x, y):
{textwrap.indent(textwrap.dedent(forward_body), '        ')}
"""


def model_new_showing(expression: str) -> str:
    """A model_new.py whose import fails with `expression`'s value in the message (what reaches the
    record and the agent), or with the error it raised."""
    return model_new_with("return cuda_extension.axpy_forward(x, y, float(self.alpha))", prelude=f"""
import os
def _shown():
    try:
        return repr({expression})
    except Exception as exc:
        return "refused: " + repr(exc)
raise RuntimeError("SHOWN " + _shown())
""")


def _forking(monkeypatch):
    """Forking on (reference and jailed children), and only the fork servers this test starts."""
    from evaluator_cuda.isolation import forkserver

    forkserver.close_all()
    monkeypatch.setenv(forkserver.FORK_ENV, "1")
    yield
    forkserver.close_all()


forking = pytest.fixture(name="forking")(_forking) if pytest else _forking


def kernel_with(body: str) -> str:
    """A host axpy kernel file whose loop body is `body` (variables: x, y, out, a, n, i)."""
    return KERNEL.replace("for (int64_t i = 0; i < n; ++i) out[i] = a * x[i] OP y[i];", body)


# CUDA forms of docs/cheats.md #4 and #19 (a side stream; an L2 persistence window), shared by the
# cheat tests and scripts/check_hardening_gpu.py.
STREAM_KERNEL = """#include <cuda_runtime.h>
#include <cstdint>
extern "C" void axpy_launcher(const float* x, const float* y, float* out, float a, int64_t n, int config, void* stream) {
  cudaStream_t side; cudaStreamCreate(&side);
  (void)side; (void)x; (void)y; (void)out; (void)a; (void)n; (void)config; (void)stream;
}
"""
L2_KERNEL = """#include <cuda_runtime.h>
#include <cstdint>
extern "C" void axpy_launcher(const float* x, const float* y, float* out, float a, int64_t n, int config, void* stream) {
  cudaStreamAttrValue attr = {};
  attr.accessPolicyWindow.base_ptr = (void*)x;
  cudaStreamSetAttribute((cudaStream_t)stream, cudaStreamAttributeAccessPolicyWindow, &attr);
}
"""


# CUDA forms of docs/cheats.md #23 (scripts/check_hardening_gpu.py, static checks off to reach run time):
# one token kernel on out[0], the rest computed by ATen from the binding with the Python dispatch
# keys excluded (the runtime guard never sees it; the kernel trace does) ...
TOKEN_KERNEL = """#include <cuda_runtime.h>
#include <cstdint>
__global__ void axpy_first(const float* x, const float* y, float* out, float a, int64_t n) {
  if (threadIdx.x == 0 && blockIdx.x == 0 && n > 0) out[0] = a * x[0] + y[0];
}
extern "C" void axpy_launcher(const float* x, const float* y, float* out, float a, int64_t n, int config, void* stream) {
  (void)config;
  axpy_first<<<1, 32, 0, (cudaStream_t)stream>>>(x, y, out, a, n);
}
"""
ATEN_BEHIND_THE_GUARD = """{
    c10::impl::ExcludeDispatchKeyGuard hidden(c10::DispatchKeySet({c10::DispatchKey::Python,
                                                                   c10::DispatchKey::PythonTLSSnapshot}));
    out.copy_(x.mul(a).add(y));
  }"""
# ... and the whole axpy on a side stream that waits for the call's start but not its end: the
# events around the call see almost nothing, the device-wide synchronize still gets a right output.
HIDDEN_STREAM_KERNEL = """#include <cuda_runtime.h>
#include <cstdint>
__global__ void axpy_slow(const float* x, const float* y, float* out, float a, int64_t n) {
  long long begin = clock64();
  while (clock64() - begin < 200000) {}
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = a * x[i] + y[i];
}
extern "C" void axpy_launcher(const float* x, const float* y, float* out, float a, int64_t n, int config, void* stream) {
  (void)config;
  static cudaStream_t side = nullptr;
  static cudaEvent_t ready = nullptr;
  if (!side) {
    cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
  }
  cudaEventRecord(ready, (cudaStream_t)stream);
  cudaStreamWaitEvent(side, ready, 0);
  axpy_slow<<<16, 256, 0, side>>>(x, y, out, a, n);
}
"""

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def example(name: str, backend: str = "cuda") -> tuple[Task, Solution]:
    """The task of an example and its solution under examples/solutions/<backend>/<name>."""
    from evaluator_cuda.solutions import read_solution
    from evaluator_cuda.tasks import load_tasks

    solution = read_solution(EXAMPLES / "solutions" / backend / name)
    return {t.stem: t for t in load_tasks(EXAMPLES / "tasks").tasks}[solution.stem], solution


# Small outputs scored at their own scale: a plain softmax over wide rows (every value far below
# atol), the example row-softmax kernel as the honest answer and four wrong ones, each computed
# by the kernel itself (the torch-compute guard would refuse zero_() or fill_() before the check). Shared by
# tests/test_evaluator_tolerance.py (host) and scripts/check_small_outputs.py (both backends).
SOFTMAX_MODEL_NEW = """import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, x):
        {body}
"""
SMALL_OUTPUT_ANSWERS = {
    "honest": ("return cuda_extension.row_softmax_forward(x, 1.0)", "correct"),
    "zeros": ("return cuda_extension.row_softmax_forward(x, 0.0)", "incorrect"),
    "constant": ("return cuda_extension.row_softmax_forward(torch.zeros_like(x), 1.0)", "incorrect"),  # 1/cols everywhere
    "permuted_rows": ("y = cuda_extension.row_softmax_forward(x, 1.0)\n        r, c = y.shape\n        return y.view(2, r // 2, c).transpose(0, 1).contiguous().view(r, c)", "incorrect"),
    "half": ("return cuda_extension.row_softmax_forward(x, 0.5)", "incorrect"),
}


def wide_softmax_task(rows: int, cols: int, ignore_inputs: bool = False) -> Task:
    """A plain softmax over (rows, cols) inputs; `ignore_inputs`: of ones_like(x) instead of x."""
    source = (EXAMPLES / "tasks" / "row_softmax.py").read_text()
    source = source.replace("ROWS = 4096", f"ROWS = {rows}").replace("COLS = 4096", f"COLS = {cols}")
    operand = "torch.ones_like(x)" if ignore_inputs else "x"
    source = source.replace("return torch.softmax(x, dim=-1) * x.shape[-1]", f"return torch.softmax({operand}, dim=-1)")
    suffix = "_ignoring_inputs" if ignore_inputs else ""
    return Task(name=f"softmax_{rows}x{cols}{suffix}", source=source)


def softmax_answer(backend: str, answer: str) -> Solution:
    """The example row-softmax workspace of `backend` with model_new.py giving `answer`."""
    from evaluator_cuda.solutions import read_solution

    base = read_solution(EXAMPLES / "solutions" / backend / "row_softmax")
    files = dict(base.files)
    files["model_new.py"] = SOFTMAX_MODEL_NEW.format(body=SMALL_OUTPUT_ANSWERS[answer][0]).encode()
    return Solution("workspace", files, "model_new.py", f"softmax_{answer}")


def small_output_cases(backend: str, wide_cols: int = 262_144, honest_runs: int = 2) -> list[tuple]:
    """(label, task, solution, expected status) for the small-output table."""
    from evaluator_cuda.solutions import reference_solution

    wide, mid = wide_softmax_task(64, wide_cols), wide_softmax_task(64, 8192)
    cases = [(f"{wide.name} honest #{i + 1}", wide, softmax_answer(backend, "honest"), "correct") for i in range(honest_runs)]
    cases += [(f"{mid.name} honest #{i + 1}", mid, softmax_answer(backend, "honest"), "correct") for i in range(honest_runs + 1)]
    cases += [(f"{wide.name} {answer}", wide, softmax_answer(backend, answer), expected) for answer, (_, expected) in SMALL_OUTPUT_ANSWERS.items() if answer != "honest"]
    constant_task = wide_softmax_task(64, 8192, ignore_inputs=True)
    cases.append((constant_task.name, constant_task, reference_solution(constant_task.name), "task_error"))
    return cases


class FakeCudaEvent:
    """Stands in for torch.cuda.Event on a machine without a GPU: 'records' wall-clock nanoseconds."""

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        import time

        self.t = time.perf_counter_ns()

    def elapsed_time(self, end):
        return (end.t - self.t) / 1e6  # milliseconds, as CUDA events report
