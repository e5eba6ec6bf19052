"""Subcommand `compile`: the compile time of one candidate, three ways, in one run (the fast build against torch's).

    (a) kernelbench  torch.utils.cpp_extension.load_inline, torch headers in the .cu (KernelBench style)
    (b) cuda-agent   torch.utils.cpp_extension.load of the harness binding.cpp + kernels/*.cu + *_binding.cpp
    (c) fast         evaluator_cuda.extension.fast: units alone in parallel, slim headers, content-hash cache

For each: cold (fresh build folder / cache) and cached (same sources again) wall time. For the fast path also:
machine-cold (empty cache: precompiled headers + harness object built too), candidate-cold (shared parts
warm: what an RL step pays for a new candidate; median of --runs, each with new source bytes), cached in this
process and cached in a fresh process (median of --runs), and the one-time binding runtime build.
Correctness: the built extensions are run on the same inputs and compared with each other and with a*x+y
(GPU, or CPU for --backend host); unless --skip examples, every examples/solutions/<backend>/<stem> is also
built fast (cold and cached) and checked against its task's reference Model.

    TORCH_CUDA_ARCH_LIST=9.0 python scripts/bench_evaluator.py compile                  # on the H200 (~3-4 min)
    python scripts/bench_evaluator.py compile --backend host --skip kernelbench         # on a CPU machine
Prints a table; writes $OUT/bench_evaluator_compile.json when OUT is set. Exit status 1 when the extensions disagree.
"""

from __future__ import annotations

import os
import resource
import shutil
import tempfile
import uuid
from pathlib import Path

from evaluator_bench.common import REPO, write_out
from evaluator_bench.compile_checks import bench_examples, call_overhead_us, check_outputs
from evaluator_bench.compile_sources import (KERNELBENCH_CUDA, KERNELBENCH_HOST, candidate_files, write_tree)
from evaluator_bench.report import Clock, fmt
from evaluator_bench.timing import fresh_process_cached_build, fresh_process_seconds, median, timed

TEMPLATES = REPO / "cuda_agent" / "templates"


def add_arguments(parser) -> None:
    parser.add_argument("--backend", choices=["cuda", "host"], default=None, help="default: cuda when a GPU is present")
    parser.add_argument("--runs", type=int, default=5, help="fast-path repetitions for the medians")
    parser.add_argument("--skip", action="append", default=[], choices=["kernelbench", "cuda-agent", "examples"],
                        help="leave a part out (repeatable)")


def main(args) -> int:
    import torch

    from evaluator_cuda.extension.fast.toolchain import find_toolchain

    clock = Clock()
    backend = args.backend or ("cuda" if torch.cuda.is_available() else "host")
    arch = os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    work = Path(tempfile.mkdtemp(prefix="bench_evaluator_compile-"))
    os.environ["TORCH_EXTENSIONS_DIR"] = str(work / "torch_extensions")
    results: dict = {"backend": backend, "arch_list": arch, "torch": torch.__version__, "cuda": torch.version.cuda,
                     "device": torch.cuda.get_device_name() if backend == "cuda" else "cpu",
                     "cpus": os.cpu_count(), "toolchain": find_toolchain(backend).versions()}
    clock.say(f"backend={backend} arch={arch} torch={torch.__version__} work={work}")
    try:
        measure(clock, args, backend, arch, work, results)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    results["children_cpu_s"] = usage.ru_utime + usage.ru_stime
    print_report(results, backend, arch)
    write_out("bench_evaluator_compile.json", results)
    bad = [k for k, v in results["correctness_max_abs_diff"].items() if v > 1e-5]
    return 1 if bad else 0


def measure(clock: Clock, args, backend: str, arch: str, work: Path, results: dict) -> None:
    """The three ways (less the skipped ones), then the checks; results filled in place."""
    ways = [("fast", "fast path", lambda: bench_fast(backend, work, arch, args.runs)),
            ("cuda_agent", "CUDA-Agent way (torch load, torch headers in the binding)",
             lambda: bench_cuda_agent(backend, work)),
            ("kernelbench", "KernelBench way (load_inline, torch headers in the .cu)",
             lambda: bench_kernelbench(backend, work))]
    modules = {}
    for key, label, bench in ways:
        if key.replace("_", "-") in args.skip:
            continue
        clock.say(f"{label} ...")
        row = bench()
        modules[key] = row.pop("module")
        results[key] = row
        clock.say(f"{key.replace('_', '-')}: {({k: v for k, v in row.items() if not isinstance(v, list)})}")
    results["correctness_max_abs_diff"] = check_outputs(modules, backend)
    results["call_overhead_us"] = call_overhead_us(modules, backend)
    if "examples" not in args.skip:
        results["examples"] = bench_examples(clock, backend, work, arch)


# ---- (a) KernelBench: load_inline -------------------------------------------------------------------------------


def bench_kernelbench(backend: str, work: Path) -> dict:
    from torch.utils.cpp_extension import load_inline

    build = work / "kernelbench"
    build.mkdir()
    name = f"kb_axpby_{uuid.uuid4().hex[:8]}"

    def kwargs() -> dict:  # fresh lists per call: load_inline edits the source lists it is given
        declaration = "torch::Tensor axpby(torch::Tensor x, torch::Tensor y, double a, double b);"
        args = dict(name=name, cpp_sources=[declaration],
                    functions=["axpby"], build_directory=str(build), extra_cflags=["-O3"], verbose=False)
        if backend == "cuda":
            args.update(cuda_sources=[KERNELBENCH_CUDA], extra_cuda_cflags=["-O3", "--use_fast_math"])
        else:
            args["cpp_sources"] = [KERNELBENCH_HOST]
        return args

    return torch_build_times(load_inline, kwargs, "load_inline")


def torch_build_times(build, kwargs, name: str) -> dict:
    """A torch build cold, again here (cached), and again in a fresh interpreter."""
    cold, module = timed(lambda: build(**kwargs()))
    cached, _ = timed(lambda: build(**kwargs()))
    fresh = fresh_process_seconds(f"{name}(**kwargs)", f"kwargs = {kwargs()!r}")
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
    return torch_build_times(load, lambda: dict(kwargs), "load")


# ---- (c) the fast path --------------------------------------------------------------------------------------------


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
        "runtime_build_s": runtime_s, "machine_cold_s": machine_cold.seconds,
        "cold_s": median(cold_runs), "cold_runs_s": cold_runs,
        "cold_units": unit_rows[len(unit_rows) // 2] if unit_rows else [],
        "cached_s": median(cached_runs), "cached_runs_s": cached_runs,
        "cached_fresh_process_s": median(fresh_runs), "cached_fresh_process_runs_s": fresh_runs,
        "module": module,
    }


# ---- report -------------------------------------------------------------------------------------------------------


def print_report(results: dict, backend: str, arch: str) -> None:
    print()
    print(f"compile time of a one-kernel candidate ({backend}, arch {arch}, torch {results['torch']}, "
          f"{results['device']}, {results['cpus']} CPUs)")
    print(f"{'method':<36}{'cold s':>10}{'cached s':>10}{'cached, new process s':>24}")
    for key, label in (("kernelbench", "(a) KernelBench load_inline"), ("cuda_agent", "(b) CUDA-Agent load"),
                       ("fast", "(c) fast path (candidate cold)")):
        if key in results:
            r = results[key]
            print(f"{label:<36}{fmt(r['cold_s'], 3):>10}{fmt(r['cached_s'], 3):>10}"
                  f"{fmt(r.get('cached_fresh_process_s'), 3):>24}")
    if "fast" in results:
        print_fast_details(results["fast"])
    print("correctness (max |diff|, inputs 2^20 floats):")
    for key, value in results["correctness_max_abs_diff"].items():
        print(f"    {key:<40}{value:.3g}")
    print("host time per call, 256 floats (us): " + ", ".join(
        f"{name} {value:.1f}" for name, value in results["call_overhead_us"].items()))
    for row in results.get("examples", []):
        print(f"    example {row['solution']:<26} {row['status']:<14} cold {fmt(row['cold_s'], 3)} s  cached "
              f"{fmt(row['cached_s'], 3)} s  matches: {row.get('matches_1e-2', row.get('error', '-'))}")


def print_fast_details(fast: dict) -> None:
    print(f"{'    fast, machine cold (empty cache)':<36}{fmt(fast['machine_cold_s'], 3):>10}")
    print(f"{'    binding runtime (once/machine)':<36}{fmt(fast['runtime_build_s'], 3):>10}")
    for unit in fast["cold_units"]:
        print(f"{'      unit ' + unit['file']:<36}{fmt(unit['seconds'], 3):>10}")
    ok_cold = fast["cold_s"] <= 3.0
    ok_cached = fast["cached_s"] <= 0.3 and fast["cached_fresh_process_s"] <= 0.3
    met = lambda ok: "MET" if ok else "NOT MET"  # noqa: E731
    print(f"goal cold <= 3 s: {met(ok_cold)};  goal cached <= 0.3 s: {met(ok_cached)}")
