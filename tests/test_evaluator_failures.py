"""Failure paths and who is blamed: harness failures are infra_error (never -1), candidate
failures are compile_error / runtime_error / incorrect with reward -1, each with a clear line."""

import textwrap

import pytest

from evaluator_cuda.extension.build import build_workspace
from evaluator_cuda.evaluation import evaluate
from evaluator_cuda.settings import EvalSettings
from evaluator_cuda.solutions import Solution, SolutionError, read_solution
from evaluator_cuda.tasks import Task

SCALE_TASK = textwrap.dedent(
    """
    import torch

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(16))

        def forward(self, x):
            BODY
            return x * self.weight

    def get_inputs():
        return [torch.randn(4, 16)]

    def get_init_inputs():
        return []
    """
)


def task(body: str = "pass") -> Task:
    return Task(name="scale", source=SCALE_TASK.replace("BODY", body))


def candidate(source: str) -> Solution:
    return Solution("kernelbench", {"cand.py": textwrap.dedent(source).encode()}, "cand.py", "scale")


def host(tmp_path, **overrides) -> EvalSettings:
    return EvalSettings.for_backend("host", cache_dir=str(tmp_path), profile=False, **overrides)


def test_reference_process_crash_is_infra_error_not_minus_one(tmp_path):
    """The reference child is harness: its death says nothing about the candidate."""
    record = evaluate(task("import os; os._exit(3)"), candidate("class ModelNew: pass"), host(tmp_path))
    assert record["status"] == "infra_error" and record["reward"] is None
    assert record["message"] == "reference process exited with status 3"


def test_state_dict_mismatch_is_incorrect(tmp_path):
    source = """
    import torch

    class ModelNew(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.randn(16))

        def forward(self, x):
            return x
    """
    record = evaluate(task(), candidate(source), host(tmp_path))
    assert record["status"] == "incorrect" and record["reward"] == -1
    assert record["message"].startswith("ModelNew does not take the reference's state_dict")


def test_syntax_error_in_model_new_is_a_compile_error_with_line(tmp_path):
    record = evaluate(task(), candidate("import torch\n\nclass ModelNew(torch.nn.Module)\n    pass\n"), host(tmp_path))
    assert record["status"] == "compile_error" and record["reward"] == -1
    assert record["diagnostics"][0]["file"] == "cand.py" and record["diagnostics"][0]["line"] == 3


@pytest.mark.slow
def test_missing_model_new_class_is_runtime_error(tmp_path):
    record = evaluate(task(), candidate("import torch\n"), host(tmp_path))
    assert record["status"] == "runtime_error" and record["message"] == "cand.py defines no ModelNew"


def test_workspace_without_binding_is_a_compile_error(tmp_path):
    files = {"model_new.py": b"import cuda_extension\n", "kernels/op.cpp": b"int f() { return 1; }\n"}
    result = build_workspace(files, host(tmp_path))
    assert result.status == "compile_error"
    assert "no kernels/*_binding.cpp" in result.diagnostics[0]["message"]


def test_unreadable_solutions_give_one_line(tmp_path):
    (tmp_path / "ws").mkdir()
    with pytest.raises(SolutionError, match=r"workspace has no model_new.py"):
        read_solution(tmp_path / "ws")
    with pytest.raises(SolutionError, match="no such file or folder"):
        read_solution(tmp_path / "absent")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(SolutionError, match="expected a .py file"):
        read_solution(tmp_path / "notes.txt")


def test_backend_files_are_selected_per_backend():
    from evaluator_cuda.extension.sources import select_sources

    files = {f"kernels/{n}": b"" for n in ("op.cu", "op.cpp", "op_binding.cpp", "common.cuh", "binding_registry.h", "binding.cpp")}
    files["model_new.py"] = b""
    assert sorted(select_sources(files, "cuda")) == ["kernels/common.cuh", "kernels/op.cu", "kernels/op_binding.cpp"]
    assert sorted(select_sources(files, "host")) == ["kernels/common.cuh", "kernels/op.cpp", "kernels/op_binding.cpp"]
