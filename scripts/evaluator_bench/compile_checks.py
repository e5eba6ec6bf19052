"""What `compile` checks after timing: the built extensions' outputs, their call overhead, each example built fast."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from evaluator_bench.common import SOLUTIONS, TASKS, load_model_new, load_task


def check_outputs(modules: dict, backend: str) -> dict:
    """Every built extension on the same inputs; each compared with a*x+b*y and with each other (max abs diff)."""
    import torch

    device = "cuda" if backend == "cuda" else "cpu"
    gen = torch.Generator(device="cpu").manual_seed(1234)
    x = torch.randn(1 << 20, generator=gen).to(device)
    y = torch.randn(1 << 20, generator=gen).to(device)
    a, b = 1.75, -0.5
    expected = a * x + b * y
    outs = {name: module.axpby(x, y, a, b) for name, module in modules.items()}
    if device == "cuda":
        torch.cuda.synchronize()
    report = {f"{name}_vs_torch": float((out - expected).abs().max()) for name, out in outs.items()}
    names = sorted(outs)
    for i, p in enumerate(names):
        for q in names[i + 1:]:
            report[f"{p}_vs_{q}"] = float((outs[p] - outs[q]).abs().max())
    return report


def call_overhead_us(modules: dict, backend: str, calls: int = 2000) -> dict:
    """Host time per call of each extension's axpby on 256 floats (binding + allocation + launch), median of 5."""
    import torch

    device = "cuda" if backend == "cuda" else "cpu"
    x, y = torch.randn(256, device=device), torch.randn(256, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    report = {}
    for name, module in modules.items():
        samples = []
        for _ in range(5):
            sync()
            begin = time.perf_counter()
            for _ in range(calls):
                module.axpby(x, y, 1.0, 2.0)
            sync()
            samples.append((time.perf_counter() - begin) / calls * 1e6)
        report[name] = statistics.median(samples)
    return report


def bench_examples(clock, backend: str, work: Path, arch: str) -> list[dict]:
    """Each examples/solutions/<backend>/<stem>: fast cold and cached build, then outputs vs the task's Model."""
    from evaluator_cuda.extension.fast.builder import build_fast

    cache = work / "fast_cache"  # the shared parts are warm: each example's cold build is a candidate's cold build
    rows = []
    for solution in sorted((SOLUTIONS / backend).iterdir()):
        if not solution.is_dir():
            continue
        cold = build_fast(solution, backend, cache, arch)
        cached = build_fast(solution, backend, cache, arch)
        row = {"solution": solution.name, "status": cold.status, "cold_s": cold.seconds, "cached_s": cached.seconds,
               "fallback_reason": cold.fallback_reason}
        if cold.ok:
            try:
                row.update(compare_example(solution, cold.so_path, backend, work / "runtime_cache"))
            except Exception as exc:  # report and go on: one broken example must not hide the others
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        clock.say(f"example {solution.name}: {row}")
    return rows


def compare_example(solution: Path, so_path: str, backend: str, runtime_cache: Path) -> dict:
    """The fast-built candidate against its task's Model on the task's inputs (same weights)."""
    import torch

    device = "cuda" if backend == "cuda" else "cpu"
    task = load_task(TASKS / f"{solution.name.split('__')[0]}.py")
    model_new = load_model_new(solution, so_path, str(runtime_cache))
    torch.manual_seed(0)
    reference = task["Model"](*task["get_init_inputs"]()).to(device)
    candidate = model_new(*task["get_init_inputs"]()).to(device)
    candidate.load_state_dict(reference.state_dict())
    inputs = [t.to(device) if isinstance(t, torch.Tensor) else t for t in task["get_inputs"]()]
    copies = lambda: [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]  # noqa: E731
    with torch.no_grad():
        expected = reference(*copies())
        got = candidate(*copies())
    return {"max_abs_err": float((got - expected).abs().max()),
            "matches_1e-2": bool(torch.allclose(got, expected, atol=1e-2, rtol=1e-2))}
