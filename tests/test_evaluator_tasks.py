"""Tasks load from a .py file, a KernelBench-style folder and a parquet `code` column; each
malformed task gives one line naming it and its problem, and the run goes on."""

import io
import re
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
    """Rows without a name column are named from their class and a short hash of their source, not their index."""
    pa = pytest.importorskip("pyarrow")
    import hashlib

    import pyarrow.parquet as pq

    sources = [GOOD.format(scale=1.0), SYNTAX_ERROR, GOOD.format(scale=5.0)]
    table = pa.table({"code": sources, "ops": ["a", "b", "c"], "data_source": ["x", "y", "z"]})
    pq.write_table(table, tmp_path / "ops6k.parquet")
    loaded = load_tasks(tmp_path / "ops6k.parquet")
    short = [hashlib.sha256(s.encode()).hexdigest()[:8] for s in sources]
    assert [t.name for t in loaded.tasks] == [f"ops6k/Model_{short[0]}", f"ops6k/Model_{short[2]}"]
    assert "5.0" in loaded.tasks[1].source and loaded.tasks[1].origin.endswith("#row2")
    assert [str(p) for p in loaded.problems] == [f"task ops6k/Model_{short[1]}: syntax error at line 9: expected ':'"]


def test_parquet_name_column_and_repeated_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"code": [GOOD.format(scale=1.0)] * 2, "name": ["scale_add", "scale_add"]}),
                   tmp_path / "named.parquet")
    assert [t.name for t in load_tasks(tmp_path / "named.parquet").tasks] == ["scale_add", "scale_add_2"]
    pq.write_table(pa.table({"code": [GOOD.format(scale=1.0)] * 2}), tmp_path / "same.parquet")
    first, second = (t.name for t in load_tasks(tmp_path / "same.parquet").tasks)
    assert second == f"{first}_2" and first.startswith("same/Model_")


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


def test_refused_tasks_are_in_the_summary_the_report_and_the_plot(tmp_path):
    """A malformed task and a good one: the console summary and report.md count and name the refused task with
    its reason, and the plot has a labelled place for it."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "1_missing.py").write_text(MISSING_GET_INPUTS)
    (tasks / "2_good.py").write_text(GOOD.format(scale=2.0))
    from rich.console import Console

    console = Console(record=True, width=200)
    settings = EvalSettings.for_backend("host", profile=False, cache_dir=str(tmp_path / "cache"))
    result = run_bench(tasks, None, settings, tmp_path / "out", console=console)
    assert result.metrics["refused"] == 1 and [r["task"] for r in result.refused] == ["1_missing"]
    printed = console.export_text()
    assert "refused (not scored): 1_missing: missing get_inputs()" in printed
    assert re.search(r"tasks scored\s+│\s+1\s+│", printed) and re.search(r"tasks refused\s+│\s+1\s+│", printed)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| tasks scored | 1 |" in report and "| tasks refused | 1 |" in report
    assert "## Refused tasks (not scored)" in report and "- **1_missing**: missing get_inputs()" in report
    assert "| 1_missing | refused |" in report
    from evaluator_cuda.bench.plot import speedup_figure

    ax = speedup_figure(result.main_records + result.refused, "title").axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["2_good", "1_missing"]
    assert "refused" in [t.get_text() for t in ax.texts]
    assert (tmp_path / "out" / "speedups.png").exists()


def test_a_task_set_with_nothing_to_evaluate_still_names_backend_device_and_versions(tmp_path):
    from typer.testing import CliRunner

    from cuda_agent.cli import app

    task = tmp_path / "broken.py"
    task.write_text(SYNTAX_ERROR)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["bench", str(task), "--backend", "host", "--no-profile", "--out", str(out),
                                      "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code == 3, result.output  # a refused task
    import torch

    report = (out / "report.md").read_text()
    header = report.splitlines()[2]
    assert header.startswith("Backend `host` on cpu") and f"torch {torch.__version__}" in header
    assert "python " in header and "unknown" not in header and "None" not in header
    assert "- **broken**: syntax error at line 9: expected ':'" in report
    assert "refused (not scored): broken: syntax error at line 9" in result.output


def test_a_refresh_measures_each_tasks_baselines_once_per_run(monkeypatch):
    """With --refresh-baselines a task's candidates after the one that measured its baselines read them from
    the cache; a candidate that failed before its baselines leaves the refresh to the next one."""
    from rich.console import Console

    from evaluator_cuda.bench import run
    from evaluator_cuda.tasks import Task

    seen = []

    def record_of(task, path, solutions_path, settings):
        seen.append((task.name, path, settings.refresh_baselines))
        measured = settings.refresh_baselines and path != "fails_to_build"
        return {"task": task.name, "candidate": f"{task.name}/{path}", "status": "correct", "reward": 1,
                "wall_s": {"total": 0.1, **({"baselines": 0.05} if measured else {})}}

    monkeypatch.setattr(run, "_record_of", record_of)
    a, b = Task("a", ""), Task("b", "")
    plan = [(a, "fails_to_build", True), (a, "first", False), (a, "second", False), (b, "only", True)]
    settings = EvalSettings.for_backend("host", refresh_baselines=True)
    run._evaluate_plan(plan, None, settings, Console(file=io.StringIO()), [], [])
    assert seen == [("a", "fails_to_build", True), ("a", "first", True), ("a", "second", False), ("b", "only", True)]
