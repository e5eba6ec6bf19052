"""Wall-clock helpers, builds timed in a fresh interpreter, and the timing child shared by `examples` and `speed`.

The timing child runs as `python scripts/bench_evaluator.py time-child SPEC OUT` (a hidden subcommand): a new
process with none of the evaluator's state, which times the same ModelNew call the evaluator timed, with
triton.testing.do_bench on CUDA (L2 flushed, median) or a perf_counter median on the host; with "baselines"
in the spec, the task's eager Model and its torch.compile too.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from evaluator_bench.common import REPO, SCRIPT, load_model_new, load_task


def timed(fn):
    """(seconds, value) of one call."""
    begin = time.perf_counter()
    value = fn()
    return time.perf_counter() - begin, value


def median(values):
    return statistics.median(values) if values else None


# ---- builds timed in a fresh interpreter ------------------------------------------------------------------------


def fresh_process_seconds(call: str, setup: str = "") -> float | None:
    """Seconds of one torch build call (`call`, an expression) in a new interpreter, torch already imported."""
    code = (
        "import json, sys, time, torch\n"
        "from torch.utils.cpp_extension import load, load_inline\n"
        f"{setup}\n"
        "t0 = time.perf_counter()\n"
        f"{call}\n"
        "print(json.dumps({'s': time.perf_counter() - t0}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        print(f"fresh-process timing failed: {out.stderr[-500:]}", flush=True)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])["s"]


def fresh_process_cached_build(files_dir: Path, backend: str, cache: Path, arch: str) -> float:
    """Seconds of build_fast for an already-built solution, measured inside a new interpreter (no torch import)."""
    code = (
        "import json, sys, time\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from evaluator_cuda.extension.fast.builder import build_fast\n"
        "t0 = time.perf_counter()\n"
        f"r = build_fast({str(files_dir)!r}, backend={backend!r}, cache_dir={str(cache)!r}, arch_list={arch!r})\n"
        "print(json.dumps({'s': time.perf_counter() - t0, 'hit': r.cache_hit, 'torch': 'torch' in sys.modules}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["hit"] and not data["torch"], data
    return data["s"]


# ---- the timing child -------------------------------------------------------------------------------------------


def time_outside(spec: dict, spec_path: Path, timeout: float, env: dict | None = None) -> dict:
    """Run the timing child on `spec` (written to spec_path, its answer beside it); its result, or {"error"}."""
    spec_path.write_text(json.dumps(spec))
    out_path = spec_path.with_name(spec_path.stem + ".out.json")
    command = [sys.executable, str(SCRIPT), "time-child", str(spec_path), str(out_path)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout)[-600:]}
    return json.loads(out_path.read_text())


def time_child(spec_path: str, out_path: str) -> None:
    """In its own process: {name: timing} for the candidate (and with spec["baselines"], eager and compile)."""
    import torch

    spec = json.loads(Path(spec_path).read_text())
    device = "cuda" if spec["backend"] == "cuda" else "cpu"
    functions, inputs = _prepare(spec, device)
    result = {}
    with torch.no_grad():
        for name, fn in functions.items():
            result[name] = _do_bench(fn, inputs) if device == "cuda" else _perf_counter(fn, inputs)
    Path(out_path).write_text(json.dumps(result))


def _prepare(spec: dict, device: str) -> tuple[dict, list]:
    """The functions to time (candidate with the reference's weights; eager and compile on request) and the inputs."""
    import torch

    namespace = load_task(spec["task"])
    model_new = load_model_new(spec["solution"], spec.get("so_path"), spec.get("fast_cache_dir"))
    torch.manual_seed(0)
    init = namespace["get_init_inputs"]()
    reference = namespace["Model"](*init)
    candidate = model_new(*init)
    candidate.load_state_dict(reference.state_dict())
    functions = {"candidate": candidate.eval().to(device)}
    if spec.get("baselines"):
        reference = reference.eval().to(device)
        functions = {"eager": reference, "compile": torch.compile(reference), **functions}
    del reference
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in namespace["get_inputs"]()]
    return functions, inputs


def _do_bench(fn, inputs: list) -> dict:
    import torch
    import triton.testing

    fn(*inputs)
    torch.cuda.synchronize()
    q = triton.testing.do_bench(lambda: fn(*inputs), warmup=25, rep=100, quantiles=[0.5, 0.2, 0.8])
    return {"tool": "triton.testing.do_bench (L2 flushed, median)", "median_us": q[0] * 1e3, "p20_us": q[1] * 1e3,
            "p80_us": q[2] * 1e3}


def _perf_counter(fn, inputs: list) -> dict:
    for _ in range(4):
        fn(*inputs)
    samples, deadline = [], time.perf_counter() + 3.0
    while len(samples) < 5 or (len(samples) < 50 and time.perf_counter() < deadline):
        begin = time.perf_counter()
        fn(*inputs)
        samples.append((time.perf_counter() - begin) * 1e6)
    return {"tool": "time.perf_counter (median)", "median_us": statistics.median(samples), "n": len(samples)}
