"""`cuda-agent solve` / `rollout`: user errors give one clear line and exit 2, before any fleet starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cuda_agent.cli import app

REPO = Path(__file__).resolve().parent.parent
runner = CliRunner()


def invoke(*args):
    result = runner.invoke(app, list(args))
    output = (result.stdout or "") + (getattr(result, "stderr", "") or "")
    return result.exit_code, output, result.exception


@pytest.mark.parametrize(
    "args, message",
    [
        (("solve", "no/such/task.py"), "task file not found: no/such/task.py"),
        (("solve", str(REPO / "examples/tasks/elementwise_chain.py"), "--policy", "bogus"), "unknown policy 'bogus'"),
        (("solve", str(REPO / "examples/tasks/elementwise_chain.py"), "--config", "no_such_config"), "agent config not found"),
        (("solve", str(REPO / "examples/tasks/elementwise_chain.py"), "--policy", "openai"), "--policy openai needs --base-url and --model"),
        (("solve", str(REPO / "examples/tasks/elementwise_chain.py"), "--solutions", "/nonexistent"), "no scripted solution for task elementwise_chain"),
        (("solve", str(REPO / "examples/tasks/elementwise_chain.py"), "--tokenizer", "/nonexistent/tok.json"), "tokenizer not found"),
        (("rollout", "no/such/dir"), "task not found: no/such/dir"),
    ],
)
def test_user_errors_are_one_line(args, message):
    code, output, exception = invoke(*args)
    assert code == 2, (output, exception)
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], output
    assert "Traceback" not in output
