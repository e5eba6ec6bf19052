"""Whole episodes through the real chain: tools -> bridge client -> broker -> evaluator worker (host backend).

Needs the evaluator's bridge handlers (evaluator_cuda.bridge_handlers), the bridge and the
example tasks/solutions. The first run builds the example's extension (about half a minute
on a 2-core machine); later runs hit the evaluator's build cache. The episodes solve the
GEMM example, the lightest of the examples to verify and profile on the host (elementwise_chain's
64 MiB tensors took three times as long, for the same path through the chain).
"""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TASK_FILE = REPO / "examples" / "tasks" / "gemm_bias_gelu.py"
SOLUTION_DIR = REPO / "examples" / "solutions" / "host" / "gemm_bias_gelu"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("evaluator_cuda.bridge_handlers") is None, reason="evaluator bridge handlers not landed"),
    pytest.mark.skipif(importlib.util.find_spec("zmq") is None, reason="pyzmq missing"),
    pytest.mark.skipif(not SOLUTION_DIR.is_dir(), reason="example host solution missing"),
]


@pytest.fixture(scope="module")
def endpoint():
    from agent.fleet import local_fleet

    with local_fleet(backend="host", fast_heartbeats=True) as address:
        yield address


@pytest.fixture
def episodes_dir():
    path = Path(tempfile.mkdtemp(prefix="agent-e2e-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_with_bridge(endpoint, policy, tokenizer, workspace):
    from bridge.client import BridgeClient

    from agent.config import load_agent_config
    from agent.episode import load_task, run_episode

    config = load_agent_config("agent_tiny")

    async def go():
        with BridgeClient(endpoint) as client:
            return await run_episode(load_task(TASK_FILE), policy, tokenizer, config, client, workspace)

    return asyncio.run(go())


@pytest.fixture(scope="module")
def tokenizer():
    from agent.chat import TokenizerAdapter
    from agent.demo_tokenizer import demo_tokenizer

    return TokenizerAdapter(demo_tokenizer())


def test_scripted_policy_solves_an_example_task(endpoint, tokenizer, episodes_dir):
    from agent.policy import ScriptedPolicy
    from agent.scripted import honest_solver_turns, read_solution_dir

    policy = ScriptedPolicy(honest_solver_turns(read_solution_dir(SOLUTION_DIR)), tokenizer)
    result = run_with_bridge(endpoint, policy, tokenizer, episodes_dir / "honest")
    responses = [m["content"] for m in result.trajectory.messages if m["role"] == "tool"]
    assert any(r.startswith("compile: built") for r in responses), responses
    assert any(r.startswith("verify: correct") for r in responses), responses
    assert any(r.startswith("profile: correct") for r in responses), responses
    assert result.final_status == "correct" and result.reward is not None and result.reward >= 1
    assert result.best_speedup_vs_compile is not None and result.best_speedup_vs_compile > 0
    assert result.schema_violations == 0 and result.end_reason == "agent_finished"
    # The final solution is the workspace's files, byte for byte.
    assert result.final_solution["model_new.py"] == (SOLUTION_DIR / "model_new.py").read_bytes()
    assert result.evaluator_seconds > 0 and result.evaluator_seconds <= result.wall_seconds


def test_cheating_policy_gets_minus_one(endpoint, tokenizer, episodes_dir):
    from agent.policy import ScriptedPolicy
    from agent.scripted import cheating_turns

    task_source = TASK_FILE.read_text()
    policy = ScriptedPolicy(cheating_turns(task_source), tokenizer)
    result = run_with_bridge(endpoint, policy, tokenizer, episodes_dir / "cheat")
    responses = [m["content"] for m in result.trajectory.messages if m["role"] == "tool"]
    assert "read-only" in responses[0]  # the Write to model.py was refused
    assert (result.workspace / "model.py").read_text() == task_source  # and Bash could not change it either
    assert result.reward == -1, (result.final_status, result.final_record)
    assert result.final_status in ("incorrect", "runtime_error", "compile_error")


def test_torch_fallback_with_real_kernels_gets_minus_one(endpoint, tokenizer, episodes_dir):
    from agent.policy import ScriptedPolicy
    from agent.scripted import read_solution_dir, torch_fallback_turns

    policy = ScriptedPolicy(torch_fallback_turns(TASK_FILE.read_text(), read_solution_dir(SOLUTION_DIR)), tokenizer)
    result = run_with_bridge(endpoint, policy, tokenizer, episodes_dir / "fallback")
    responses = [m["content"] for m in result.trajectory.messages if m["role"] == "tool"]
    assert any(r.startswith("compile: built") for r in responses), responses  # the kernels do build
    assert result.reward == -1 and result.final_status == "incorrect", (result.final_status, result.final_record)


def test_cli_solve_and_rollout_through_a_given_bridge(endpoint, episodes_dir):
    from typer.testing import CliRunner

    from agent.trajectory import read_trajectories
    from cuda_agent.cli import app

    runner = CliRunner()
    out = episodes_dir / "solve"
    result = runner.invoke(app, ["solve", str(TASK_FILE), "--policy", "cheat", "--bridge", endpoint, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"{TASK_FILE.stem}: reward -1.0" in result.output
    transcript = (out / "transcript.md").read_text()
    assert "## [2] assistant" in transcript and "read-only" in transcript
    assert (out / "workspace" / "model.py").is_file() and (out / "result.json").is_file()

    parquet = episodes_dir / "traj.parquet"
    tasks_dir = REPO / "examples" / "tasks"
    result = runner.invoke(
        app,
        ["rollout", str(tasks_dir / "elementwise_chain.py"), str(tasks_dir / "row_softmax.py"), "--policy", "cheat",
         "--bridge", endpoint, "--config", "agent_tiny", "--out", str(parquet), "--episodes-dir", str(episodes_dir / "roll")],
    )
    assert result.exit_code == 0, result.output
    rows = read_trajectories(parquet)
    assert [r["task"] for r in rows] == ["elementwise_chain", "row_softmax"]
    assert all(r["reward"] == -1 for r in rows)
    assert all(len(r["tokens"]) == len(r["loss_mask"]) == len(r["rollout_logprobs"]) > 0 for r in rows)
