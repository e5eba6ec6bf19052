"""A C++ mistake is named with its file and line: a typo in a torch name is an unknown name, not forbidden compute."""

import shutil
from pathlib import Path

import pytest

from evaluator_cuda.extension.diagnostics import parse_compiler_output
from evaluator_cuda.isolation.static_checks import check_cpp_source, check_solution_sources

REPO = Path(__file__).resolve().parents[1]
WORKSPACE = REPO / "examples" / "solutions" / "host" / "row_l2_norm"
TASK = REPO / "examples" / "tasks" / "row_l2_norm.py"


@pytest.mark.parametrize("output", [
    "/b/src/kernels/op_binding.cpp:13:12: error: ‘emptyy’ is not a member of ‘torch’; did you mean ‘empty’?",
    "/b/src/kernels/op_binding.cpp:13:12: error: no member named 'emptyy' in namespace 'torch'",
    '/b/src/kernels/op_binding.cpp(13): error: namespace "torch" has no member "emptyy"',
])
def test_compilers_messages_about_a_missing_torch_name_read_as_an_unknown_name(output):
    [diagnostic] = parse_compiler_output(output, roots=["/b/src"])
    assert (diagnostic["file"], diagnostic["line"]) == ("kernels/op_binding.cpp", 13)
    assert diagnostic["message"].startswith("unknown name torch::emptyy: not a torch function; did you mean torch::empty?")


def test_a_real_torch_name_missing_from_a_header_is_left_as_the_compiler_said():
    [diagnostic] = parse_compiler_output("/b/k.cpp:3:1: error: ‘matmul’ is not a member of ‘at’", roots=["/b"])
    assert diagnostic["message"] == "‘matmul’ is not a member of ‘at’"


def test_static_checks_tell_a_typo_from_torch_compute_and_carry_file_and_line():
    [typo] = check_cpp_source("kernels/b.cpp", "auto y = torch::emptyy({4}, x.options());\n")
    [compute] = check_cpp_source("kernels/b.cpp", "\nauto y = torch::matmul(a, b);\n")
    assert typo.reason == "unknown_torch_name" and compute.reason == "torch_compute_cpp"
    assert compute.message.startswith("kernels/b.cpp:2: torch::matmul is not allowed")


def _typo_workspace(tmp_path: Path) -> Path:
    workspace = tmp_path / "typo"
    shutil.copytree(WORKSPACE, workspace)
    binding = workspace / "kernels" / "row_l2_norm_binding.cpp"
    text = binding.read_text()
    assert text.count("torch::empty(") == 1
    binding.write_text(text.replace("torch::empty(", "torch::emptyy("))
    return workspace


def _line_of(workspace: Path, needle: str) -> int:
    lines = (workspace / "kernels" / "row_l2_norm_binding.cpp").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if needle in line)


def test_the_fast_build_reports_a_typo_in_a_binding_itself_with_file_and_line(tmp_path):
    from evaluator_cuda.extension.fast.builder import build_fast

    workspace = _typo_workspace(tmp_path)
    result = build_fast(workspace, backend="host", cache_dir=tmp_path / "cache")
    assert result.status == "compile_error" and not result.fallback_reason
    first = result.diagnostics[0]
    assert (first["file"], first["line"]) == ("kernels/row_l2_norm_binding.cpp", _line_of(workspace, "emptyy"))
    assert first["message"].startswith("unknown name torch::emptyy")


def test_evaluate_gives_a_typo_as_a_compile_error_with_file_and_line(tmp_path):
    from evaluator_cuda.evaluation import evaluate
    from evaluator_cuda.settings import EvalSettings
    from evaluator_cuda.solutions import read_solution
    from evaluator_cuda.tasks import load_tasks

    workspace = _typo_workspace(tmp_path)
    settings = EvalSettings.for_backend("host", profile=False, cache_dir=str(tmp_path / "cache"))
    record = evaluate(load_tasks(TASK).tasks[0], read_solution(workspace), settings)
    assert record["status"] == "compile_error" and not record.get("rejected")
    first = record["diagnostics"][0]
    assert (first["file"], first["line"]) == ("kernels/row_l2_norm_binding.cpp", _line_of(workspace, "emptyy"))
    assert "torch compute" not in record["message"] and record["message"].startswith("unknown name torch::emptyy")


def test_a_rejection_by_the_static_checks_has_file_and_line(tmp_path):
    from evaluator_cuda.evaluation.before import check_sources
    from evaluator_cuda.settings import EvalSettings
    from evaluator_cuda.solutions import read_solution
    from evaluator_cuda.verdict.fault import Verdict

    workspace = tmp_path / "threads"
    shutil.copytree(WORKSPACE, workspace)
    kernel = workspace / "kernels" / "row_l2_norm.cpp"
    kernel.write_text("#include <thread>\n" + kernel.read_text())
    assert check_solution_sources({"kernels/row_l2_norm.cpp": kernel.read_bytes()})
    with pytest.raises(Verdict) as raised:
        check_sources(read_solution(workspace), EvalSettings.for_backend("host"))
    assert raised.value.diagnostics[0]["file"] == "kernels/row_l2_norm.cpp"
    assert raised.value.diagnostics[0]["line"] == 1
