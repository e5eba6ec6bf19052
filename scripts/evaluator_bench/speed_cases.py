"""The sized cases of `speed`: a task with its size constants rewritten, written to a temp folder.

Cases (H200 sizes; row_softmax moves 8 bytes per element, sized at 4.3 TB/s so the kernel takes at least
the target; the GEMM scaled from the example's 79 µs at 1024^3 measured on the H200, docs/figures.md):
  softmax_100us  row_softmax, ROWS 13120 x 4096 (215 MB in)
  gemm_1ms       gemm_bias_gelu, 2368 x 2368 x 2368
  softmax_1ms    row_softmax, ROWS 131200 x 4096 (2.1 GB in: past the 1 GiB fresh-input budget, so the
                 timed calls rotate one kept set and each evaluation ships 6 sets, ~13 GB, once each; it
                 runs only if the budget left covers an estimate from the cases before it)
Host cases (--quick): softmax_small, softmax_4x (and gemm_small on request).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from evaluator_bench.common import TASKS, load_task

GEMM_US_AT_1024 = 79.0  # the example GEMM kernel at 1024^3 on the H200 (docs/figures.md)

@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    stem: str  # examples/tasks/<stem>.py, examples/solutions/<backend>/<stem>
    constants: dict  # module-level integer constants rewritten in the task source
    target_us: float | None  # what the size aims at on the H200 (None: a host size)


def task_constant(stem: str, name: str) -> int:
    match = re.search(rf"^{name}\s*=\s*(\d+)\s*$", (TASKS / f"{stem}.py").read_text(), re.M)
    if not match:
        raise ValueError(f"examples/tasks/{stem}.py has no constant {name}")
    return int(match[1])


def softmax_rows(target_us: float) -> int:
    """ROWS so that reading and writing ROWS x COLS fp32 once takes target_us at the H200's bandwidth."""
    from evaluator_cuda.settings import H200_PEAK_BANDWIDTH

    rows = target_us * 1e-6 * H200_PEAK_BANDWIDTH / (8 * task_constant("row_softmax", "COLS"))
    return max(64, round(rows / 64) * 64)


def gemm_side(target_us: float) -> int:
    """M = N = K scaled from the example's time at 1024^3 (time grows as the cube), a multiple of 64."""
    return max(64, round(1024 * (target_us / GEMM_US_AT_1024) ** (1 / 3) / 64) * 64)


def gemm_constants(side: int) -> dict:
    return {"TOKENS": side, "IN_FEATURES": side, "OUT_FEATURES": side}


def all_cases() -> dict[str, Case]:
    cases = [
        Case("softmax_100us", "row_softmax", {"ROWS": softmax_rows(100)}, 100.0),
        Case("gemm_1ms", "gemm_bias_gelu", gemm_constants(gemm_side(1000)), 1000.0),
        Case("softmax_1ms", "row_softmax", {"ROWS": softmax_rows(1000)}, 1000.0),
        Case("softmax_small", "row_softmax", {"ROWS": 256}, None),
        Case("softmax_4x", "row_softmax", {"ROWS": 1024}, None),
        Case("gemm_small", "gemm_bias_gelu", gemm_constants(256), None),
    ]
    return {c.name: c for c in cases}


DEFAULT_CASES = ["softmax_100us", "gemm_1ms", "softmax_1ms"]
QUICK_CASES = ["softmax_small", "softmax_4x"]



def write_variant_task(case: Case, folder: Path) -> Path:
    """examples/tasks/<stem>.py with the case's constants rewritten, as <folder>/<case>.py."""
    source = (TASKS / f"{case.stem}.py").read_text()
    for name, value in case.constants.items():
        source, count = re.subn(rf"^{name}\s*=\s*\d+\s*$", f"{name} = {value}", source, flags=re.M)
        if count != 1:
            raise ValueError(f"examples/tasks/{case.stem}.py: constant {name} found {count} times")
    changed = ", ".join(f"{k} = {v}" for k, v in case.constants.items())
    path = folder / f"{case.name}.py"
    path.write_text(f"# examples/tasks/{case.stem}.py with {changed} (scripts/bench_evaluator.py speed)\n" + source)
    return path


def task_sizes(task_path: Path) -> dict:
    """Input/output shapes and bytes of a task (run on the meta device: nothing allocated), and the
    bytes-over-bandwidth time bound the evaluator reports as sol_bound_us."""
    import torch

    from evaluator_cuda.settings import H200_PEAK_BANDWIDTH

    namespace = load_task(task_path)
    with torch.device("meta"), torch.no_grad():
        model = namespace["Model"](*namespace["get_init_inputs"]())
        inputs = namespace["get_inputs"]()
        output = model(*inputs)
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    in_bytes = sum(t.numel() * t.element_size() for t in tensors)
    out_bytes = output.numel() * output.element_size()
    return {"input_shapes": [list(t.shape) for t in tensors], "output_shape": list(output.shape),
            "input_bytes": in_bytes,
            "output_bytes": out_bytes, "sol_us": (in_bytes + out_bytes) / H200_PEAK_BANDWIDTH * 1e6}

