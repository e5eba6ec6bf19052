"""The host-backend example solutions, built and checked against their tasks' reference Models.

Each solution is compiled the way the harness does it (templates/binding.cpp + the workspace's
kernels/*.cpp into one module `cuda_extension`), in its own child process because the module
name is fixed. The child loads the reference Model and the candidate ModelNew with a shared
state_dict, runs both on fresh random inputs and reports whether the outputs match at the
verifier's tolerance (atol = rtol = 1e-2). The honest solutions must match; the deliberately
wrong one must not.

Builds are cached by content hash under ~/.cache/cuda-agent/examples-build/, two at a time.
Cold (seven builds of ~26 s each on a 2-core machine) this takes a few minutes, hence `slow`.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
TEMPLATES = REPO / "evaluator_cuda" / "templates"
HOST_SOLUTIONS = EXAMPLES / "solutions" / "host"
CACHE = Path(os.environ.get("CUDA_AGENT_CACHE", Path.home() / ".cache" / "cuda-agent")) / "examples-build"
TOLERANCE = 1e-2  # reference.md §4: assert_close(atol=1e-2, rtol=1e-2)
CHECKS = 3
CXX_FLAGS = ["-O3"]  # the C++ standard is left to torch (C++20 on torch >= 2.10), as the builder does


def solution_sources(solution: Path) -> list[Path]:
    """Harness binding first, then the workspace's host kernels and bindings, in a stable order."""
    return [TEMPLATES / "binding.cpp", *sorted((solution / "kernels").glob("*.cpp"))]


def build_key(solution: Path) -> str:
    """Content hash of everything that determines the built module."""
    import torch

    digest = hashlib.sha256()
    for path in [*solution_sources(solution), TEMPLATES / "binding_registry.h"]:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    digest.update(json.dumps([CXX_FLAGS, torch.__version__, sys.version]).encode())
    return digest.hexdigest()[:24]


def task_for(solution: Path) -> Path:
    """`<stem>` or `<stem>__<variant>` -> examples/tasks/<stem>.py."""
    return EXAMPLES / "tasks" / f"{solution.name.split('__')[0]}.py"


def run_in_child(solution: Path) -> dict:
    """Builds and checks one solution in a fresh interpreter; returns the child's JSON report."""
    build_dir = CACHE / build_key(solution)
    build_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, __file__, str(task_for(solution)), str(solution), str(build_dir)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "MAX_JOBS": "1"},
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"rc={proc.returncode}", "stderr": proc.stderr[-4000:], "stdout": proc.stdout[-2000:]}
    return json.loads(lines[-1])


SOLUTIONS = sorted(p for p in HOST_SOLUTIONS.iterdir() if p.is_dir())
HONEST = [p for p in SOLUTIONS if "__" not in p.name]
WRONG = [p for p in SOLUTIONS if p.name.endswith("__wrong")]


@pytest.fixture(scope="module")
def reports() -> dict[str, dict]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip([p.name for p in SOLUTIONS], pool.map(run_in_child, SOLUTIONS)))


def test_every_task_has_an_honest_host_solution_and_one_wrong_one():
    tasks = sorted(p.stem for p in (EXAMPLES / "tasks").glob("*.py"))
    assert len(tasks) >= 6
    assert [p.name for p in HONEST] == tasks
    assert len(WRONG) >= 1 and all(task_for(p).exists() for p in WRONG)


@pytest.mark.slow
@pytest.mark.parametrize("name", [p.name for p in HONEST])
def test_honest_host_solution_matches_reference(reports, name):
    report = reports[name]
    assert "error" not in report, report
    assert report["checks"] == CHECKS
    assert report["mismatches"] == [], report


@pytest.mark.slow
@pytest.mark.parametrize("name", [p.name for p in WRONG])
def test_wrong_host_solution_is_caught(reports, name):
    report = reports[name]
    assert "error" not in report, report  # it must build and run: the bug is numerical
    assert len(report["mismatches"]) == CHECKS, report


# ---------------------------------------------------------------- child process side


def _load_module(path: Path, name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _child_main(task_path: str, solution_dir: str, build_dir: str) -> None:
    import torch
    from torch.utils.cpp_extension import load

    solution = Path(solution_dir)
    sys.modules["cuda_extension"] = load(
        name="cuda_extension",
        sources=[str(p) for p in solution_sources(solution)],
        extra_include_paths=[str(TEMPLATES)],
        extra_cflags=CXX_FLAGS,
        build_directory=build_dir,
        verbose=False,
    )
    task = _load_module(Path(task_path), "example_task")
    candidate = _load_module(solution / "model_new.py", "example_model_new")

    torch.manual_seed(1234)
    reference = task.Model(*task.get_init_inputs())
    model_new = candidate.ModelNew(*task.get_init_inputs())
    model_new.load_state_dict(reference.state_dict(), strict=True)

    mismatches = []
    with torch.no_grad():
        for check in range(CHECKS):
            torch.manual_seed(100 + check)
            inputs = task.get_inputs()
            expected = reference(*inputs)
            got = model_new(*[t.clone() for t in inputs])
            same_layout = got.shape == expected.shape and got.dtype == expected.dtype
            if not same_layout or not torch.allclose(got, expected, atol=TOLERANCE, rtol=TOLERANCE):
                diff = (got - expected).abs().max().item() if same_layout else None
                mismatches.append({"check": check, "layout_ok": same_layout, "max_abs_diff": diff})
    print(json.dumps({"checks": CHECKS, "mismatches": mismatches}))


if __name__ == "__main__":
    _child_main(*sys.argv[1:4])
