#!/usr/bin/env python
"""Compile-time benchmark of one candidate, three ways, in one run (the fast build against torch's builds).

    (a) kernelbench  torch.utils.cpp_extension.load_inline, torch headers in the .cu (KernelBench style)
    (b) cuda-agent   torch.utils.cpp_extension.load of the harness binding.cpp + kernels/*.cu + *_binding.cpp
    (c) fast         evaluator_cuda.extension.fast: units alone in parallel, slim headers, content-hash cache

For each: cold (fresh build folder / cache) and cached (same sources again) wall time. For the fast path also:
machine-cold (empty cache: precompiled headers + harness object built too), candidate-cold (shared parts
warm: what an RL step pays for a new candidate; median of --runs, each with new source bytes), cached in this
process and cached in a fresh process (median of --runs), and the one-time binding runtime build.
Correctness: the three extensions are run on the same inputs and compared with each other and with a*x+y
(GPU, or CPU for --backend host); with --examples, every examples/solutions/<backend>/<stem> is also built
fast (cold and cached) and checked against its task's reference Model.

    TORCH_CUDA_ARCH_LIST=9.0 python scripts/bench_compile.py                 # on the H200 (~3-4 min)
    python scripts/bench_compile.py --backend host --skip kernelbench        # on a CPU machine
Prints a table; writes $OUT/bench_compile.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# The evaluator's children run `python -m evaluator_cuda.roles.child`: they need the checkout on PYTHONPATH too.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)

TEMPLATES = REPO / "cuda_agent" / "templates"

CUDA_KERNEL = r"""
#include <cuda_runtime.h>
__global__ void axpby_kernel(const float* x, const float* y, float* out, float a, float b, long n) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + b * y[i];
}
extern "C" void axpby_launcher(const float* x, const float* y, float* out, float a, float b, long n, int config,
                               cudaStream_t stream) {
  int threads = config > 0 ? config : 256;
  axpby_kernel<<<(unsigned)((n + threads - 1) / threads), threads, 0, stream>>>(x, y, out, a, b, n);
}
"""
CUDA_BINDING = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include "binding_registry.h"
extern "C" void axpby_launcher(const float* x, const float* y, float* out, float a, float b, long n, int config,
                               cudaStream_t stream);
torch::Tensor axpby(torch::Tensor x, torch::Tensor y, double a, double b) {
  TORCH_CHECK(x.is_cuda() && y.is_cuda(), "axpby: CUDA tensors expected");
  TORCH_CHECK(x.sizes() == y.sizes() && x.is_contiguous() && y.is_contiguous(), "axpby: same-shape contiguous");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && y.scalar_type() == torch::kFloat32, "axpby: float32");
  auto out = torch::empty_like(x);
  axpby_launcher(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), (float)a, (float)b, x.numel(), 256,
                 at::cuda::getCurrentCUDAStream());
  return out;
}
REGISTER_BINDING(axpby, axpby);
"""
HOST_KERNEL = r"""
#include <cstdint>
extern "C" void axpby_launcher(const float* x, const float* y, float* out, float a, float b, long n, int config,
                               void* stream) {
  (void)config; (void)stream;
  for (long i = 0; i < n; ++i) out[i] = a * x[i] + b * y[i];
}
"""
HOST_BINDING = CUDA_BINDING.replace("#include <ATen/cuda/CUDAContext.h>\n", "").replace(
    "cudaStream_t stream", "void* stream").replace("at::cuda::getCurrentCUDAStream()", "nullptr").replace(
    "x.is_cuda() && y.is_cuda(), \"axpby: CUDA tensors expected\"", "x.is_cpu() && y.is_cpu(), \"axpby: CPU tensors expected\"")
# KernelBench style: one .cu with torch headers, the kernel and the wrapper; load_inline writes the pybind module.
KERNELBENCH_CUDA = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
__global__ void axpby_kernel(const float* x, const float* y, float* out, float a, float b, long n) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + b * y[i];
}
torch::Tensor axpby(torch::Tensor x, torch::Tensor y, double a, double b) {
  auto out = torch::empty_like(x);
  long n = x.numel();
  axpby_kernel<<<(unsigned)((n + 255) / 256), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(),
                                                     (float)a, (float)b, n);
  return out;
}
"""
KERNELBENCH_HOST = r"""
#include <torch/extension.h>
torch::Tensor axpby(torch::Tensor x, torch::Tensor y, double a, double b) {
  auto out = torch::empty_like(x);
  const float* px = x.data_ptr<float>(); const float* py = y.data_ptr<float>(); float* po = out.data_ptr<float>();
  for (long i = 0; i < x.numel(); ++i) po[i] = (float)a * px[i] + (float)b * py[i];
  return out;
}
"""


def log(message: str) -> None:
    print(f"[bench_compile {time.strftime('%H:%M:%S')}] {message}", flush=True)


def candidate_files(backend: str, nonce: str = "") -> dict[str, bytes]:
    """The one-kernel workspace (kernels/ only); a nonce comment makes every byte sequence new (a cold build)."""
    tag = f"\n// {nonce}\n" if nonce else ""
    if backend == "cuda":
        return {"kernels/axpby.cu": (CUDA_KERNEL + tag).encode(), "kernels/axpby_binding.cpp": (CUDA_BINDING + tag).encode()}
    return {"kernels/axpby.cpp": (HOST_KERNEL + tag).encode(), "kernels/axpby_binding.cpp": (HOST_BINDING + tag).encode()}


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def timed(fn):
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def median(values):
    return statistics.median(values) if values else None


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
        log(f"fresh-process timing failed: {out.stderr[-500:]}")
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])["s"]


# ---- (a) KernelBench: load_inline -------------------------------------------------------------------------------


def bench_kernelbench(backend: str, work: Path) -> dict:
    from torch.utils.cpp_extension import load_inline

    build = work / "kernelbench"
    build.mkdir()
    name = f"kb_axpby_{uuid.uuid4().hex[:8]}"

    def kwargs() -> dict:  # fresh lists per call: load_inline edits the source lists it is given
        args = dict(name=name, cpp_sources=["torch::Tensor axpby(torch::Tensor x, torch::Tensor y, double a, double b);"],
                    functions=["axpby"], build_directory=str(build), extra_cflags=["-O3"], verbose=False)
        if backend == "cuda":
            args.update(cuda_sources=[KERNELBENCH_CUDA], extra_cuda_cflags=["-O3", "--use_fast_math"])
        else:
            args["cpp_sources"] = [KERNELBENCH_HOST]
        return args

    cold, module = timed(lambda: load_inline(**kwargs()))
    cached, _ = timed(lambda: load_inline(**kwargs()))
    fresh = fresh_process_seconds("load_inline(**kwargs)", f"kwargs = {kwargs()!r}")
    return {"cold_s": cold, "cached_s": cached, "cached_fresh_process_s": fresh, "module": module}


# ---- (b) CUDA-Agent: load of harness binding.cpp + kernels ---------------------------------------------------------


def bench_cuda_agent(backend: str, work: Path) -> dict:
    from torch.utils.cpp_extension import load

    src = write_tree(work / "cuda_agent_src", candidate_files(backend))
    for name in ("binding.cpp", "binding_registry.h"):
        shutil.copy(TEMPLATES / name, src / name)
    sources = [str(src / "binding.cpp")] + sorted(str(p) for p in (src / "kernels").iterdir())
    build = work / "cuda_agent_build"
    build.mkdir()
    kwargs = dict(name="cuda_extension", sources=sources, extra_cflags=["-O3"],
                  extra_cuda_cflags=["-O3", "--use_fast_math"], extra_include_paths=[str(src)],
                  build_directory=str(build), with_cuda=backend == "cuda", verbose=False)
    cold, module = timed(lambda: load(**kwargs))
    cached, _ = timed(lambda: load(**kwargs))
    fresh = fresh_process_seconds("load(**kwargs)", f"kwargs = {kwargs!r}")
    return {"cold_s": cold, "cached_s": cached, "cached_fresh_process_s": fresh, "module": module}


# ---- (c) the fast path --------------------------------------------------------------------------------------------


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


def bench_fast(backend: str, work: Path, arch: str, runs: int) -> dict:
    from evaluator_cuda.extension.fast.binding_runtime import ensure_binding_runtime, load_fast_extension
    from evaluator_cuda.extension.fast.builder import build_fast

    cache = work / "fast_cache"
    runtime_s, _ = timed(lambda: ensure_binding_runtime(work / "runtime_cache"))
    machine_cold = build_fast(candidate_files(backend, "machine-cold"), backend, cache, arch)
    assert machine_cold.ok, machine_cold.log[-3000:]
    cold_runs, unit_rows = [], []
    for k in range(runs):
        result = build_fast(candidate_files(backend, f"cold-{k}-{uuid.uuid4()}"), backend, cache, arch)
        assert result.ok and not result.cache_hit, result.log[-3000:]
        cold_runs.append(result.seconds)
        unit_rows.append(result.units)
    files_dir = write_tree(work / "fast_src", candidate_files(backend))
    first = build_fast(files_dir, backend, cache, arch)
    assert first.ok, first.log[-3000:]
    cached_runs = []
    for _ in range(runs):
        again = build_fast(files_dir, backend, cache, arch)
        assert again.ok and again.cache_hit
        cached_runs.append(again.seconds)
    fresh_runs = [fresh_process_cached_build(files_dir, backend, cache, arch) for _ in range(runs)]
    module = load_fast_extension(first.so_path, module_name="cuda_extension_fast", cache_dir=work / "runtime_cache")
    return {
        "runtime_build_s": runtime_s,
        "machine_cold_s": machine_cold.seconds,
        "cold_s": median(cold_runs),
        "cold_runs_s": cold_runs,
        "cold_units": unit_rows[len(unit_rows) // 2] if unit_rows else [],
        "cached_s": median(cached_runs),
        "cached_runs_s": cached_runs,
        "cached_fresh_process_s": median(fresh_runs),
        "cached_fresh_process_runs_s": fresh_runs,
        "module": module,
    }


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
    report = {}
    for name, module in modules.items():
        samples = []
        for _ in range(5):
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                module.axpby(x, y, 1.0, 2.0)
            if device == "cuda":
                torch.cuda.synchronize()
            samples.append((time.perf_counter() - t0) / calls * 1e6)
        report[name] = statistics.median(samples)
    return report


def bench_examples(backend: str, work: Path, arch: str) -> list[dict]:
    """Each examples/solutions/<backend>/<stem>: fast cold and cached build, then outputs vs the task's Model."""
    import importlib.util

    import torch

    from evaluator_cuda.extension.fast.binding_runtime import load_fast_extension
    from evaluator_cuda.extension.fast.builder import build_fast

    cache = work / "fast_cache"  # the shared parts are warm: each example's cold build is a candidate's cold build
    rows = []
    device = "cuda" if backend == "cuda" else "cpu"
    for solution in sorted((REPO / "examples" / "solutions" / backend).iterdir()):
        if not solution.is_dir():
            continue
        cold = build_fast(solution, backend, cache, arch)
        cached = build_fast(solution, backend, cache, arch)
        row = {"solution": solution.name, "status": cold.status, "cold_s": cold.seconds, "cached_s": cached.seconds,
               "fallback_reason": cold.fallback_reason}
        if cold.ok:
            try:
                load_fast_extension(cold.so_path, cache_dir=work / "runtime_cache")  # as `cuda_extension`
                task_path = REPO / "examples" / "tasks" / f"{solution.name.split('__')[0]}.py"
                spec = importlib.util.spec_from_file_location(f"task_{solution.name}", task_path)
                task = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(task)
                spec = importlib.util.spec_from_file_location(f"model_new_{solution.name}", solution / "model_new.py")
                model_new = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(model_new)
                torch.manual_seed(0)
                reference = task.Model(*task.get_init_inputs()).to(device)
                candidate = model_new.ModelNew(*task.get_init_inputs()).to(device)
                candidate.load_state_dict(reference.state_dict())
                inputs = [t.to(device) if isinstance(t, torch.Tensor) else t for t in task.get_inputs()]
                with torch.no_grad():
                    expected = reference(*[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])
                    got = candidate(*[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])
                row["max_abs_err"] = float((got - expected).abs().max())
                row["matches_1e-2"] = bool(torch.allclose(got, expected, atol=1e-2, rtol=1e-2))
            except Exception as exc:  # report and go on: one broken example must not hide the others
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        log(f"example {solution.name}: {row}")
    return rows


def fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=["cuda", "host"], default=None, help="default: cuda when a GPU is present")
    parser.add_argument("--runs", type=int, default=5, help="fast-path repetitions for the medians")
    parser.add_argument("--skip", action="append", default=[], choices=["kernelbench", "cuda-agent", "examples"],
                        help="leave a part out (repeatable)")
    args = parser.parse_args()
    import torch

    backend = args.backend or ("cuda" if torch.cuda.is_available() else "host")
    arch = os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    work = Path(tempfile.mkdtemp(prefix="bench_compile-"))
    os.environ["TORCH_EXTENSIONS_DIR"] = str(work / "torch_extensions")
    from evaluator_cuda.extension.fast.toolchain import find_toolchain

    results: dict = {"backend": backend, "arch_list": arch, "torch": torch.__version__, "cuda": torch.version.cuda,
                     "device": torch.cuda.get_device_name() if backend == "cuda" else "cpu",
                     "cpus": os.cpu_count(), "toolchain": find_toolchain(backend).versions()}
    modules = {}
    log(f"backend={backend} arch={arch} torch={torch.__version__} work={work}")
    try:
        log("fast path ...")
        fast = bench_fast(backend, work, arch, args.runs)
        modules["fast"] = fast.pop("module")
        results["fast"] = fast
        log(f"fast: {json.dumps({k: v for k, v in fast.items() if not isinstance(v, list)})}")
        if "cuda-agent" not in args.skip:
            log("CUDA-Agent way (torch load, torch headers in the binding) ...")
            cuda_agent = bench_cuda_agent(backend, work)
            modules["cuda_agent"] = cuda_agent.pop("module")
            results["cuda_agent"] = cuda_agent
            log(f"cuda-agent: {cuda_agent}")
        if "kernelbench" not in args.skip:
            log("KernelBench way (load_inline, torch headers in the .cu) ...")
            kernelbench = bench_kernelbench(backend, work)
            modules["kernelbench"] = kernelbench.pop("module")
            results["kernelbench"] = kernelbench
            log(f"kernelbench: {kernelbench}")
        results["correctness_max_abs_diff"] = check_outputs(modules, backend)
        results["call_overhead_us"] = call_overhead_us(modules, backend)
        if "examples" not in args.skip:
            results["examples"] = bench_examples(backend, work, arch)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    results["children_cpu_s"] = usage.ru_utime + usage.ru_stime
    print()
    print(f"compile time of a one-kernel candidate ({backend}, arch {arch}, torch {torch.__version__}, "
          f"{results['device']}, {os.cpu_count()} CPUs)")
    print(f"{'method':<36}{'cold s':>10}{'cached s':>10}{'cached, new process s':>24}")
    for key, label in (("kernelbench", "(a) KernelBench load_inline"), ("cuda_agent", "(b) CUDA-Agent load"),
                       ("fast", "(c) fast path (candidate cold)")):
        if key in results:
            r = results[key]
            print(f"{label:<36}{fmt(r['cold_s']):>10}{fmt(r['cached_s']):>10}{fmt(r.get('cached_fresh_process_s')):>24}")
    if "fast" in results:
        f = results["fast"]
        print(f"{'    fast, machine cold (empty cache)':<36}{fmt(f['machine_cold_s']):>10}")
        print(f"{'    binding runtime (once/machine)':<36}{fmt(f['runtime_build_s']):>10}")
        for unit in f["cold_units"]:
            print(f"{'      unit ' + unit['file']:<36}{fmt(unit['seconds']):>10}")
        ok_cold = f["cold_s"] <= 3.0
        ok_cached = f["cached_s"] <= 0.3 and f["cached_fresh_process_s"] <= 0.3
        print(f"goal cold <= 3 s: {'MET' if ok_cold else 'NOT MET'};  goal cached <= 0.3 s: {'MET' if ok_cached else 'NOT MET'}")
    print("correctness (max |diff|, inputs 2^20 floats):")
    for key, value in results["correctness_max_abs_diff"].items():
        print(f"    {key:<40}{value:.3g}")
    print("host time per call, 256 floats (us): " + ", ".join(
        f"{name} {value:.1f}" for name, value in results["call_overhead_us"].items()))
    for row in results.get("examples", []):
        print(f"    example {row['solution']:<26} {row['status']:<14} cold {fmt(row['cold_s'])} s  cached "
              f"{fmt(row['cached_s'])} s  matches: {row.get('matches_1e-2', row.get('error', '-'))}")
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "bench_compile.json").write_text(json.dumps(results, indent=2, default=str))
        print(f"wrote {Path(out) / 'bench_compile.json'}")
    bad = [k for k, v in results["correctness_max_abs_diff"].items() if v > 1e-5]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
