"""Tasks load from a .py file, a KernelBench-style folder and a parquet `code` column; each
malformed task gives one line naming it and its problem, and the run goes on."""

import textwrap

import pytest

from evaluator_cuda.bench.run import run_bench
from evaluator_cuda.settings import EvalSettings
from evaluator_cuda.tasks import TaskError, load_tasks

GOOD = textwrap.dedent(
    """
    import torch

    class Model(torch.nn.Module):
        def __init__(self, scale):
            super().__init__()
            self.scale = scale

        def forward(self, x):
            return x * self.scale + 1.0

    def get_inputs():
        return [torch.randn(8, 16)]

    def get_init_inputs():
        return [{scale}]
    """
)

SYNTAX_ERROR = GOOD.format(scale=2.0).replace("def forward(self, x):", "def forward(self, x)")
MISSING_GET_INPUTS = GOOD.format(scale=2.0).replace("def get_inputs():", "def make_inputs():")
GET_INPUTS_RAISES = GOOD.format(scale=2.0).replace("return [torch.randn(8, 16)]", "raise ValueError('no data here')")
WRONG_RETURN_TYPE = GOOD.format(scale=2.0).replace("return [torch.randn(8, 16)]", "return {'x': torch.randn(8, 16)}")


def test_single_file(tmp_path):
    path = tmp_path / "scale_add.py"
    path.write_text(GOOD.format(scale=3.0))
    loaded = load_tasks(path)
    assert [t.name for t in loaded.tasks] == ["scale_add"] and not loaded.problems
    assert "x * self.scale" in loaded.tasks[0].source


def test_kernelbench_folder_in_level_order(tmp_path):
    for level, names in {"level1": ["10_B", "2_A"], "level2": ["1_C"]}.items():
        (tmp_path / level).mkdir()
        for i, name in enumerate(names):
            (tmp_path / level / f"{name}.py").write_text(GOOD.format(scale=float(i + 1)))
    loaded = load_tasks(tmp_path)
    assert [t.name for t in loaded.tasks] == ["level1/2_A", "level1/10_B", "level2/1_C"]
    assert loaded.tasks[0].stem == "2_A"


def test_parquet_code_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({"code": [GOOD.format(scale=1.0), SYNTAX_ERROR, GOOD.format(scale=5.0)], "ops": ["a", "b", "c"], "data_source": ["x", "y", "z"]})
    pq.write_table(table, tmp_path / "ops6k.parquet")
    loaded = load_tasks(tmp_path / "ops6k.parquet")
    assert [t.name for t in loaded.tasks] == ["ops6k/0", "ops6k/2"]
    assert "5.0" in loaded.tasks[1].source
    assert [str(p) for p in loaded.problems] == ["task ops6k/1: syntax error at line 9: expected ':'"]


def test_parquet_without_code_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["x"]}), tmp_path / "bad.parquet")
    with pytest.raises(TaskError, match="no `code` column"):
        load_tasks(tmp_path / "bad.parquet")


def test_static_problems_name_the_task(tmp_path):
    (tmp_path / "1_syntax.py").write_text(SYNTAX_ERROR)
    (tmp_path / "2_missing.py").write_text(MISSING_GET_INPUTS)
    (tmp_path / "3_good.py").write_text(GOOD.format(scale=2.0))
    loaded = load_tasks(tmp_path)
    assert [t.name for t in loaded.tasks] == ["3_good"]
    assert [str(p) for p in loaded.problems] == [
        "task 1_syntax: syntax error at line 9: expected ':'",
        "task 2_missing: missing get_inputs()",
    ]


def test_malformed_tasks_give_their_line_and_the_run_goes_on(tmp_path):
    """Static and runtime problems alike; the good task is still evaluated (self-check, verdict only)."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "1_syntax.py").write_text(SYNTAX_ERROR)
    (tasks / "2_missing.py").write_text(MISSING_GET_INPUTS)
    (tasks / "3_raises.py").write_text(GET_INPUTS_RAISES)
    (tasks / "4_wrong_type.py").write_text(WRONG_RETURN_TYPE)
    (tasks / "5_good.py").write_text(GOOD.format(scale=2.0))
    from rich.console import Console

    console = Console(record=True, width=200)
    settings = EvalSettings.for_backend("host", profile=False, cache_dir=str(tmp_path / "cache"))
    result = run_bench(tasks, None, settings, tmp_path / "out", console=console)
    assert result.problems == [
        "task 1_syntax: syntax error at line 9: expected ':'",
        "task 2_missing: missing get_inputs()",
        "task 3_raises: get_inputs() raised ValueError: no data here",
        "task 4_wrong_type: get_inputs() returned dict, expected a list or tuple",
    ]
    printed = console.export_text()
    for line in result.problems:
        assert line in printed
    assert [(r["task"], r["status"]) for r in result.records] == [("5_good", "correct")]
    assert result.metrics["tasks"] == 1 and result.metrics["pass_rate"] == 1.0
    assert (tmp_path / "out" / "report.json").exists() and (tmp_path / "out" / "report.md").exists()
