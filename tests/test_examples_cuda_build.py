"""The CUDA example solutions and SKILL.md's worked example compile (no GPU needed).

Every kernels/*.cu is compiled for sm_90 with the evaluator's nvcc flags; the slow test also
compiles every CUDA binding against the installed torch headers (syntax only). A CPU-only torch
lacks one generated CUDA header (c10/cuda/impl/cuda_cmake_macros.h); a one-line stand-in is put
on the include path for that check only. Running the kernels is `scripts/bench_evaluator.py examples`' job.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CUDA_SOLUTIONS = REPO / "examples" / "solutions" / "cuda"
TEMPLATES = REPO / "cuda_agent" / "templates"
NVCC_FLAGS = ["-O3", "--use_fast_math", "-std=c++17", "-arch=sm_90"]

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not installed")

KERNEL_SOURCES = sorted(CUDA_SOLUTIONS.glob("*/kernels/*.cu"))
BINDINGS = sorted(CUDA_SOLUTIONS.glob("*/kernels/*_binding.cpp"))


def compile_cuda(source: Path, out_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [NVCC, *NVCC_FLAGS, "-c", str(source), "-o", str(out_dir / (source.stem + ".o"))],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_every_cuda_solution_has_kernel_binding_and_model():
    solutions = sorted(p for p in CUDA_SOLUTIONS.iterdir() if p.is_dir())
    assert len(solutions) >= 7
    for solution in solutions:
        assert (solution / "model_new.py").exists(), solution
        assert list((solution / "kernels").glob("*.cu")), solution
        assert list((solution / "kernels").glob("*_binding.cpp")), solution


def test_cuda_kernels_do_not_include_torch_headers():
    for source in KERNEL_SOURCES:
        includes = re.findall(r'#include\s*[<"]([^>"]+)', source.read_text())
        assert not [h for h in includes if h.startswith(("torch/", "ATen/", "c10/"))], source


@needs_nvcc
def test_cuda_kernels_compile_for_hopper(tmp_path):
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda s: compile_cuda(s, tmp_path), KERNEL_SOURCES))
    failures = {str(s.relative_to(REPO)): r.stderr[-2000:] for s, r in zip(KERNEL_SOURCES, results) if r.returncode}
    assert not failures, failures


@needs_nvcc
def test_a_planted_cuda_error_is_reported_by_this_check(tmp_path):
    broken = tmp_path / "broken.cu"
    broken.write_text('extern "C" void f(float* y) { y[0] = undefined_name; }\n')
    result = compile_cuda(broken, tmp_path)
    assert result.returncode != 0 and "undefined_name" in result.stderr


def _skill_blocks(language: str) -> list[str]:
    text = (TEMPLATES / "SKILL.md").read_text()
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


@needs_nvcc
def test_skill_md_worked_example_kernels_compile(tmp_path):
    (cuda_block,) = _skill_blocks("cuda")
    cuda_file = tmp_path / "relu_plus_one.cu"
    cuda_file.write_text(cuda_block)
    result = compile_cuda(cuda_file, tmp_path)
    assert result.returncode == 0, result.stderr
    host_blocks = [b for b in _skill_blocks("cpp") if "binding_registry.h" not in b]
    assert len(host_blocks) == 1
    host_file = tmp_path / "relu_plus_one_host.cpp"
    host_file.write_text(host_blocks[0])
    result = subprocess.run(["g++", "-O3", "-c", str(host_file), "-o", str(tmp_path / "h.o")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def cuda_include_dir() -> Path | None:
    """The CUDA toolkit's include folder ($CUDA_HOME, /usr/local/cuda*, or next to the real nvcc)."""
    roots = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda",
             *sorted(glob.glob("/usr/local/cuda-*"), reverse=True), str(Path(NVCC).resolve().parent.parent)]
    for root in filter(None, roots):
        if (Path(root) / "include" / "cuda_runtime_api.h").exists():
            return Path(root) / "include"
    return None


def _torch_include_flags(shim: Path) -> list[str]:
    import torch.utils.cpp_extension as cpp_extension

    cuda_include = cuda_include_dir()
    if cuda_include is None:
        pytest.skip("CUDA headers (cuda_runtime_api.h) not found")
    flags = [f"-I{p}" for p in cpp_extension.include_paths()]
    return [*flags, f"-I{sysconfig.get_paths()['include']}", f"-I{cuda_include}", f"-I{shim}", f"-I{TEMPLATES}"]


def _includes(source: Path) -> list[str]:
    return re.findall(r'^[ \t]*#[ \t]*include[ \t]*([<"][^>"]+[>"])', source.read_text(), flags=re.M)


@pytest.mark.slow
@needs_nvcc
def test_cuda_bindings_compile_against_torch_headers(tmp_path):
    shim = tmp_path / "shim"
    macros = shim / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    macros.parent.mkdir(parents=True)
    macros.write_text("#pragma once\n")
    flags = ["-std=c++20", "-w", *_torch_include_flags(shim)]
    sources = [*BINDINGS, *_skill_binding(tmp_path)]
    # Identical files (a deliberately wrong variant may share its binding) are checked once.
    unique = list({s.read_bytes(): s for s in sources}.values())
    # Parsing torch's headers takes ~13 s of CPU per file, the bindings themselves almost nothing, so the
    # bindings are checked in one translation unit that parses the headers once: first the headers that
    # every binding includes itself, then each file whole, in a namespace of its own, after a #line that
    # makes errors name the file and its line (the file's own #includes are then no-ops: the headers guard
    # against a second inclusion). A file that includes any other header is checked as a file of its own.
    common = [h for h in _includes(unique[0]) if all(h in _includes(s) for s in unique[1:])]
    assert any("binding_registry.h" in h for h in common), common
    together = [s for s in unique if set(_includes(s)) <= set(common)]
    alone = [s for s in unique if s not in together]
    unit = tmp_path / "all_bindings.cpp"
    unit.write_text("".join(f"#include {h}\n" for h in common) + "".join(
        f'namespace binding_{i} {{\n#line 1 "{s}"\n{s.read_text()}\n}}\n' for i, s in enumerate(together)))

    def check(source: Path) -> subprocess.CompletedProcess:
        return subprocess.run(["g++", *flags, "-fsyntax-only", str(source)], capture_output=True, text=True, timeout=600)

    checked = [unit, *alone]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(check, checked))
    failures = {str(s): r.stderr[-4000:] for s, r in zip(checked, results) if r.returncode}
    assert not failures, failures


def _skill_binding(tmp_path: Path) -> list[Path]:
    blocks = [b for b in _skill_blocks("cpp") if "binding_registry.h" in b]
    path = tmp_path / "skill_binding.cpp"
    path.write_text(blocks[0])
    return [path]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
