"""The example tasks are well-formed and not degenerate; the solutions' model_new.py obey the rules.

Degenerate (docs/cheats.md #4/#17): outputs that do not depend on the inputs, that are constant, or that
sit below the verifier's tolerance so an all-zero kernel would pass. Each task is checked against
such planted trivial candidates with the verifier's own comparison.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
TASKS = sorted((REPO / "examples" / "tasks").glob("*.py"))
MODEL_FILES = sorted((REPO / "examples" / "solutions").glob("*/*/model_new.py"))
TOLERANCE = 1e-2
ALLOWED_PLAIN_CALLS = {"float", "int", "len", "tuple", "super"}


def load_task(path: Path):
    spec = importlib.util.spec_from_file_location(f"example_task_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_task(task, init_seed: int, input_seed: int) -> torch.Tensor:
    torch.manual_seed(init_seed)
    model = task.Model(*task.get_init_inputs())
    torch.manual_seed(input_seed)
    with torch.no_grad():
        return model(*task.get_inputs())


def test_the_six_named_examples_exist():
    names = {p.stem for p in TASKS}
    assert {"elementwise_chain", "row_softmax", "layernorm", "gemm_bias_gelu", "maxpool2d"} <= names
    assert len(names) >= 6


@pytest.mark.parametrize("path", TASKS, ids=lambda p: p.stem)
def test_task_is_fp32_input_dependent_and_not_below_tolerance(path):
    task = load_task(path)
    inputs = task.get_inputs()
    assert isinstance(inputs, list) and all(t.dtype == torch.float32 for t in inputs)
    assert all(t.numel() >= 1_000_000 for t in inputs), "inputs too small to time meaningfully"
    first = run_task(task, init_seed=0, input_seed=1)
    second = run_task(task, init_seed=0, input_seed=2)
    assert first.dtype == torch.float32
    assert not torch.allclose(first, second, atol=TOLERANCE, rtol=TOLERANCE), "output ignores its input"
    for trivial in (torch.zeros_like(first), torch.full_like(first, first.mean().item())):
        assert not torch.allclose(trivial, first, atol=TOLERANCE, rtol=TOLERANCE), "a trivial kernel would pass"
    # Most outputs must be individually checkable: above the absolute tolerance.
    assert (first.abs() > TOLERANCE).float().mean().item() > 0.5


@pytest.mark.parametrize("path", TASKS, ids=lambda p: p.stem)
def test_task_parameters_reach_the_output(path):
    task = load_task(path)
    torch.manual_seed(0)
    model = task.Model(*task.get_init_inputs())
    if not list(model.parameters()):
        pytest.skip("task has no parameters")
    baseline = run_task(task, init_seed=0, input_seed=1)
    changed = run_task(task, init_seed=7, input_seed=1)
    assert not torch.allclose(baseline, changed, atol=TOLERANCE, rtol=TOLERANCE)


def forward_violations(source: str) -> list[str]:
    """Calls inside ModelNew.forward that are neither cuda_extension.* nor a few plain builtins."""
    tree = ast.parse(source)
    problems = []
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"):
        for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward"):
            for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
                f = call.func
                if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "cuda_extension":
                    continue
                if isinstance(f, ast.Name) and f.id in ALLOWED_PLAIN_CALLS:
                    continue
                problems.append(ast.unparse(call))
    return problems


def test_forward_check_catches_torch_compute():
    planted = "class ModelNew:\n    def forward(self, x):\n        return cuda_extension.f(x.exp()) + torch.relu(x)\n"
    assert len(forward_violations(planted)) == 2


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_model_new_forward_only_calls_the_extension(path):
    assert forward_violations(path.read_text()) == []


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_model_new_mirrors_the_reference_state_dict(path, monkeypatch):
    """ModelNew(*init) has exactly the reference's state_dict keys and shapes (strict load works)."""
    task = load_task(REPO / "examples" / "tasks" / f"{path.parent.name.split('__')[0]}.py")
    # forward is never called here, so an empty module stands in for the built extension
    monkeypatch.setitem(sys.modules, "cuda_extension", type(sys)("cuda_extension"))
    spec = importlib.util.spec_from_file_location(f"model_new_{path.parent.parent.name}_{path.parent.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    reference = task.Model(*task.get_init_inputs())
    candidate = module.ModelNew(*task.get_init_inputs())
    candidate.load_state_dict(reference.state_dict(), strict=True)
    assert {k: v.shape for k, v in candidate.state_dict().items()} == {
        k: v.shape for k, v in reference.state_dict().items()
    }
