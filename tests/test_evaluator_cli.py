"""`cuda-agent workspace init`, and the one-line errors of the evaluator's commands."""

import os
import stat
import textwrap

from typer.testing import CliRunner

from cuda_agent.cli import app

TASK = textwrap.dedent(
    """
    import torch

    class Model(torch.nn.Module):
        def __init__(self, features: int, eps: float = 1e-5):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(features))

        def forward(self, x, residual):
            return x * self.weight + residual

    def get_inputs():
        return [torch.randn(2, 8), torch.randn(2, 8)]

    def get_init_inputs():
        return [8]
    """
)

runner = CliRunner()


def test_workspace_init_lays_out_a_workspace(tmp_path):
    task = tmp_path / "scale.py"
    task.write_text(TASK)
    ws = tmp_path / "ws"
    result = runner.invoke(app, ["workspace", "init", str(task), str(ws)])
    assert result.exit_code == 0, result.output
    assert (ws / "model.py").read_text() == TASK
    assert not os.stat(ws / "model.py").st_mode & stat.S_IWUSR  # read-only
    assert (ws / "kernels").is_dir()
    skill = (ws / "SKILL.md").read_text()
    assert "torch.compile" in skill and "kernels/" in skill
    assert "REGISTER_BINDING" in (ws / "binding_registry.h").read_text()
    starter = (ws / "model_new.py").read_text()
    assert "def __init__(self, features: int, eps: float=1e-05):" in starter
    assert "def forward(self, x, residual):" in starter
    compile(starter, "model_new.py", "exec")
    again = runner.invoke(app, ["workspace", "init", str(task), str(ws)])
    assert again.exit_code == 2
    assert again.output.strip().splitlines() == [f"error: workspace {ws} exists and is not empty"]


def test_user_errors_are_one_line(tmp_path):
    missing = tmp_path / "nope.py"
    result = runner.invoke(app, ["bench", str(missing)])
    assert result.exit_code == 2 and result.output.strip() == f"error: no such task file or folder: {missing}"
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nclass Model(torch.nn.Module):\n    pass\n")
    result = runner.invoke(app, ["workspace", "init", str(bad), str(tmp_path / "w")])
    assert result.exit_code == 3  # a refused task, not a usage error
    assert result.output.strip() == "refused: task bad: missing get_inputs(), get_init_inputs()"
    good = tmp_path / "good.py"
    good.write_text(TASK)
    result = runner.invoke(app, ["evaluate", str(good), str(tmp_path / "no_solution")])
    assert result.exit_code == 2 and "no such file or folder" in result.output and len(result.output.strip().splitlines()) == 1
    result = runner.invoke(app, ["bench", str(good), "--backend", "tpu"])
    assert result.exit_code == 2
    assert result.output.strip() == "error: unknown backend 'tpu' (expected one of auto, cuda, host)"
