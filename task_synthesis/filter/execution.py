"""The in-process stage of the execution filter (run in a worker process, never in the parent).

Stages, in order, each a rejection reason of its own: `memory` (inputs, parameters and every
tensor of the forward against the bound), `load` (the source runs, Model builds), `inputs` (the
input shapes a task was asked for, when it was asked: an LLM's task), `eager` (the
forward runs), `output` (one floating tensor of the inferred shape, finite), `deterministic`
(the same inputs twice give the same output), `input_dependent` (inputs from another seed give
another output; an output below the tolerance everywhere counts as degenerate too: an all-zero
kernel would pass it) and `window` (the median eager forward time within the backend's window).
"""

from __future__ import annotations

import math
import sys
import time

from . import gpu_memory

ATOL = 1e-2  # the evaluator's tolerance (paper: atol = rtol = 1e-2)
TIMED_CALLS = 5


class Rejected(Exception):
    """A candidate's rejection at `stage`; `measured`: what was measured before it (reported with it)."""

    def __init__(self, stage: str, reason: str, measured: dict | None = None):
        super().__init__(f"{stage}: {reason}")
        self.stage, self.reason, self.measured = stage, reason, dict(measured or {})


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:200]


def _inputs(namespace: dict, seed: int) -> list:
    import torch

    torch.manual_seed(seed)
    return list(namespace["get_inputs"]())


def _nbytes(values) -> int:
    import torch

    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def check_memory(shapes: list[list[int]], parameter_bytes: int, bound: int, element_bytes: int = 4) -> int:
    """Bytes of every tensor of the forward plus the parameters; Rejected above the bound."""
    total = parameter_bytes + element_bytes * sum(math.prod(s) for s in shapes)
    if total > bound:
        raise Rejected("memory", f"{total / 2**20:.1f} MiB of tensors above the {bound / 2**20:.0f} MiB bound")
    return total


def _load(name: str, source: str):
    import torch

    from evaluator_cuda.tasks import TaskError, exec_task

    module_name = f"synth_{abs(hash(name))}"
    try:
        namespace = exec_task(name, source, module_name=module_name)
        torch.manual_seed(0)
        model = namespace["Model"](*namespace["get_init_inputs"]()).eval()
    except TaskError as exc:
        raise Rejected("load", exc.problem) from None
    except Exception as exc:
        raise Rejected("load", _one_line(exc)) from None
    finally:
        sys.modules.pop(module_name, None)  # nothing of the candidate outlives its checks in the worker
    return namespace, model


def _forward(model, inputs):
    import torch

    try:
        with torch.no_grad():
            return model(*[v.clone() if isinstance(v, torch.Tensor) else v for v in inputs])
    except Exception as exc:
        raise Rejected("gpu_memory" if gpu_memory.out_of_memory(exc) else "eager", _one_line(exc)) from None


def _check_output(out, expected_shape) -> None:
    import torch

    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
        raise Rejected("output", f"the forward returns {type(out).__name__}, not one floating tensor")
    if expected_shape is not None and list(out.shape) != list(expected_shape):
        raise Rejected("output", f"shape inference said {list(expected_shape)}, the forward gave {list(out.shape)}")
    if not bool(torch.isfinite(out).all()):
        raise Rejected("output", "non-finite values in the output")


def _on(device: str, value):
    """A model, or a list of inputs, on `device` (the inputs are generated on the CPU, seeded)."""
    import torch

    if device == "cpu":
        return value
    try:
        if isinstance(value, list):
            return [v.to(device) if isinstance(v, torch.Tensor) else v for v in value]
        return value.to(device)
    except Exception as exc:
        stage = "gpu_memory" if gpu_memory.out_of_memory(exc) else "load"
        raise Rejected(stage, f"moving to {device}: {_one_line(exc)}") from None


def _median_ms(model, inputs, device: str = "cpu") -> float:
    """The median of TIMED_CALLS forwards on `device`, each until its device work is done."""
    import torch

    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    times = []
    for _ in range(TIMED_CALLS):
        sync()
        begin = time.perf_counter()
        _forward(model, inputs)
        sync()
        times.append((time.perf_counter() - begin) * 1e3)
    return sorted(times)[len(times) // 2]


def _check_inputs(inputs: list, expected: list | None) -> None:
    got = [list(v.shape) if hasattr(v, "shape") else type(v).__name__ for v in inputs]
    if expected is not None and got != [list(s) for s in expected]:
        raise Rejected("inputs", f"get_inputs() gave {got}, the task was asked for {[list(s) for s in expected]}")


def _first_forward(model, inputs, device: str, memory_bytes: int):
    """(the first forward's output, its measured peak on a GPU or None); Rejected at `memory` above the bound."""
    gpu_memory.reset_peak(device)
    out = _forward(model, inputs)
    peak = gpu_memory.peak_bytes(device)
    if peak is not None and peak > memory_bytes:
        raise Rejected("memory", f"a measured peak of {peak / 2**20:.1f} MiB on {device} during the forward, above "
                                 f"the {memory_bytes / 2**20:.0f} MiB bound")
    return out, peak


def _check_dependence(out, other) -> None:
    import torch

    if other.shape == out.shape and torch.equal(other, out):
        raise Rejected("input_dependent", "the output does not depend on the inputs")
    if float(out.abs().max()) < ATOL and float(other.abs().max()) < ATOL:
        raise Rejected("input_dependent", f"every output below the tolerance {ATOL:g} (all zeros would pass)")


def run_checks(name: str, source: str, expected_shape, shapes, window_ms, memory_bytes: int,
               input_shapes: list | None = None, device: str = "cpu") -> dict:
    """Every in-process check; returns what was measured (eager_ms, bytes, on a GPU peak_bytes), raises Rejected
    (a window rejection carries eager_ms and bytes). `input_shapes`: the shapes get_inputs() must give (None: not
    checked). `device`: where the forwards run and are timed ("cuda" for the cuda backend: its window is a GPU
    time). The planned bytes are checked before anything moves to `device`."""
    import torch

    namespace, model = _load(name, source)
    parameter_bytes = _nbytes([*model.parameters(), *model.buffers()])
    inputs = _inputs(namespace, 1)
    _check_inputs(inputs, input_shapes)
    if shapes is None:  # no plan (an LLM's task): the input and output are what is known
        shapes = [list(v.shape) for v in inputs if isinstance(v, torch.Tensor)]
    total = check_memory(shapes, parameter_bytes, memory_bytes)
    model, inputs = _on(device, model), _on(device, inputs)
    out, peak = _first_forward(model, inputs, device, memory_bytes)
    _check_output(out, expected_shape)
    if not torch.equal(out, _forward(model, inputs)):
        raise Rejected("deterministic", "random: two runs on the same inputs disagree")
    _check_dependence(out, _forward(model, _on(device, _inputs(namespace, 2))))
    for _ in range(2):  # warm-up (a backend's first call may set up kernels)
        _forward(model, inputs)
    eager_ms = _median_ms(model, inputs, device)
    low, high = window_ms
    if not low <= eager_ms <= high:
        raise Rejected("window", f"eager forward {eager_ms:.4g} ms outside [{low:g}, {high:g}] ms",
                       {"eager_ms": round(eager_ms, 6), "bytes": total})
    measured = {"eager_ms": round(eager_ms, 6), "bytes": total, "output_shape": list(out.shape)}
    return {**measured, "peak_bytes": peak} if peak is not None else measured
