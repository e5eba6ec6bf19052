"""The command line a newcomer meets: one default backend, refusals up front, plain help, exit codes, progress."""

import re
from pathlib import Path

import click
import pytest
import typer
from typer.testing import CliRunner

from cuda_agent import contracts
from cuda_agent.cli import app

runner = CliRunner()
TYPE_LABEL = re.compile(r"<(?:bool|str|int|float|path|file|directory|list\[[^\]]*\])>")


def _commands(group: click.Command, path=()):
    yield path, group
    for name, command in getattr(group, "commands", {}).items():
        yield from _commands(command, (*path, name))


COMMANDS = list(_commands(typer.main.get_command(app)))


@pytest.mark.parametrize("path,command", COMMANDS, ids=[" ".join(p) or "root" for p, _ in COMMANDS])
def test_help_has_descriptions_no_type_labels_and_a_readable_usage(path, command):
    result = runner.invoke(app, [*path, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert not TYPE_LABEL.search(result.output), result.output
    usage = next(line for line in result.output.splitlines() if "Usage:" in line)
    assert "{" not in usage and "}" not in usage, usage
    for param in command.params:
        if isinstance(param, click.Option):
            assert param.help, f"{' '.join(path)} {param.opts[0]} has no description"


def test_every_backend_option_defaults_to_auto():
    found = {" ".join(path): p.default for path, c in COMMANDS for p in c.params if p.name == "backend"}
    assert {"bench", "evaluate", "fast-build", "submit", "solve", "rollout"} <= set(found)
    from agent.config import AgentConfig, load_agent_config

    for name, default in found.items():  # the agent's commands take the config's backend when not given
        assert default == "auto" or (default is None and name in ("solve", "rollout")), (name, default)
    assert AgentConfig().backend == "auto"
    assert load_agent_config("agent").backend == "auto" == load_agent_config("agent_eval").backend


def test_auto_resolves_and_cuda_without_a_gpu_is_refused():
    assert contracts.resolve_backend("auto", gpu_count=lambda: 0) == "host"
    assert contracts.resolve_backend("auto", gpu_count=lambda: 2) == "cuda"
    assert contracts.resolve_backend("host", gpu_count=lambda: 0) == "host"
    with pytest.raises(contracts.BackendError, match="needs an NVIDIA GPU"):
        contracts.resolve_backend("cuda", gpu_count=lambda: 0)
    assert contracts.check_job_settings({"backend": "auto"}) == {"backend": "auto"}


def _no_gpu() -> bool:
    import torch

    return not torch.cuda.is_available()


@pytest.mark.skipif(not _no_gpu(), reason="this machine has a GPU")
@pytest.mark.parametrize("argv", [
    ["bench", "examples/tasks/row_l2_norm.py", "--backend", "cuda"],
    ["evaluate", "examples/tasks/row_l2_norm.py", "examples/solutions/host/row_l2_norm", "--backend", "cuda"],
    ["solve", "examples/tasks/row_l2_norm.py", "--backend", "cuda"],
    ["rollout", "examples/tasks/row_l2_norm.py", "--backend", "cuda"],
])
def test_a_backend_this_machine_cannot_run_is_refused_in_one_line(argv):
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: backend cuda needs an NVIDIA GPU"), lines


def test_fast_build_refuses_cuda_without_a_cuda_toolkit(monkeypatch):
    from evaluator_cuda.extension.fast import toolchain

    monkeypatch.setattr(toolchain, "find_cuda_home", lambda: None)
    toolchain.find_toolchain.cache_clear()
    try:
        result = runner.invoke(app, ["fast-build", "examples/solutions/cuda/layernorm", "--backend", "cuda"])
    finally:
        toolchain.find_toolchain.cache_clear()
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: backend cuda: no CUDA toolkit found (set CUDA_HOME; nvcc and include/cuda_runtime_api.h needed)"]


def test_exit_codes_tell_verdicts_usage_refusals_and_infrastructure_apart():
    from evaluator_cuda import exit_codes

    assert exit_codes.exit_code(["correct", "correct"]) == exit_codes.OK == 0
    assert exit_codes.exit_code(["correct", "incorrect"]) == exit_codes.VERDICT_FAILURE == 1
    assert exit_codes.exit_code(["correct"], refused_tasks=1) == exit_codes.TASK_REFUSED == 3
    assert exit_codes.exit_code(["compile_error", "infra_error"], refused_tasks=1) == exit_codes.INFRA_FAILURE == 4
    assert exit_codes.USAGE_ERROR == 2
    for command in ("bench", "evaluate"):
        help_text = " ".join(runner.invoke(app, [command, "--help"], terminal_width=200).output.split())
        assert "Exit codes: 0" in help_text and "4 infrastructure failure" in help_text


def _short_call_limits(monkeypatch) -> None:
    """The command's settings with 2 s, not the defaults' 5 and 10 s, added to a call's limit (for real
    candidates' first calls on a GPU): the hanging candidate below waits about 4 s instead of 15 s."""
    import dataclasses

    from evaluator_cuda import cli as evaluator_cli

    settings = evaluator_cli._settings
    monkeypatch.setattr(evaluator_cli, "_settings", lambda *args, **kwargs: dataclasses.replace(
        settings(*args, **kwargs), call_timeout_extra_s=2.0, first_call_extra_s=2.0))


@pytest.mark.slow
def test_evaluate_says_each_step_and_its_timeout_stops_a_hanging_candidate(tmp_path, monkeypatch):
    """--timeout caps every request to the children; each candidate call's own limit (a multiple of the
    reference's call, a few seconds here) stays below it. 30 s leaves the reference child's requests
    room on a loaded machine (a 2 s cap cut them there). The task is row_l2_norm at a small size: at its
    own (a second per reference call here, input generation included) the call's limit was the 30 s cap."""
    _short_call_limits(monkeypatch)
    task = tmp_path / "row_l2_norm.py"
    source = (Path(__file__).resolve().parents[1] / "examples" / "tasks" / "row_l2_norm.py").read_text()
    task.write_text(source.replace("\nROWS = 8192\n", "\nROWS = 64\n").replace("\nCOLS = 4096\n", "\nCOLS = 256\n"))
    assert "ROWS = 64" in task.read_text() and "COLS = 256" in task.read_text()
    hang = tmp_path / "hang.py"
    hang.write_text("import time\n\nimport torch\n\n\nclass ModelNew(torch.nn.Module):\n"
                    "    def __init__(self, *args):\n        super().__init__()\n\n"
                    "    def forward(self, x):\n        time.sleep(1000)\n        return x\n")
    result = runner.invoke(app, ["evaluate", str(task), str(hang), "--backend", "host",
                                 "--no-profile", "--timeout", "30", "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code == 1, result.output  # a verdict failure
    import json

    from evaluator_cuda.cli import _settings
    from evaluator_cuda.evaluation import call_timeout

    record = json.loads(result.stdout)
    settings = _settings("host", None, None, False, None, timeout=30.0)
    assert settings.child_timeout_s == 30.0 and settings.first_call_extra_s == 2.0
    limit = call_timeout(record["reference_call_s"], settings)
    assert limit <= 30.0 and record["call_timeout_s"] == pytest.approx(limit, abs=2e-3)
    said = re.search(r"gave no answer within (\d+) s", record["message"])
    assert record["status"] == "runtime_error" and said and int(said[1]) <= 30  # the first call: a little more
    steps = [line.split("] ", 1)[1] for line in result.stderr.splitlines() if line.startswith("[")]
    assert steps[0] == "starting the sandboxed children ..."
    assert "running the candidate's calls ..." in steps


def test_help_paragraphs_are_rewrapped_but_examples_and_lists_keep_their_lines():
    from cuda_agent.cli_style import unwrap_paragraphs

    doc = "First line\nof the summary.\n\nResumable: a run\nthat stops resumes.\n\n" \
          "    cuda-agent bench a\n    cuda-agent bench b\n\n- one\n- two"
    assert unwrap_paragraphs(doc) == ("First line of the summary.\n\nResumable: a run that stops resumes.\n\n"
                                      "    cuda-agent bench a\n    cuda-agent bench b\n\n- one\n- two")
    out = CliRunner().invoke(app, ["ablate", "importance-ratio", "--help"], env={"COLUMNS": "200"}).output
    assert "the states are checkpointed every `checkpoint_every` iterations (config); running" in out
