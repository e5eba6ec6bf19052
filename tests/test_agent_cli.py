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
        (("solve", str(REPO / "examples/tasks/elementwise_chain.py"), "--policy", "jax", "--model-dir", "/nonexistent",
          "--run-config", str(REPO / "configs/no_such_run.yaml")), "no_such_run.yaml"),
    ],
)
def test_user_errors_are_one_line(args, message):
    code, output, exception = invoke(*args)
    assert code == 2, (output, exception)
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], output
    assert "Traceback" not in output


# --- per-episode evaluator salt ------------------------------------------------------------

TASK_FILE = REPO / "examples" / "tasks" / "elementwise_chain.py"


class RecordingEvaluator:
    """An evaluator gateway (no broker): answers every job and records its service, solution and salt."""

    def __init__(self):
        self.jobs = []  # (service, files digest, salt); salt None when the caller passed none

    async def submit(self, service, job, timeout=None, salt=None):
        from agent.evaluator_report import files_digest

        self.jobs.append((service, files_digest(job["solution"]["files"]), salt))
        if service == "compile":
            return {"status": "built"}
        return {"status": "correct", "reward": 2.0, "times_us": {"candidate": {"median_us": 10.0}, "eager": {"median_us": 30.0}, "compile": {"median_us": 20.0}},
                "speedup": {"eager": 3.0, "compile": 2.0}}


def rollout_jobs(monkeypatch, episodes_dir, *flags):
    """Two scripted episodes of one task (byte-identical solutions) through `cuda-agent rollout`."""
    import agent.cli

    gateway = RecordingEvaluator()

    async def with_evaluator(bridge, backend, log_dir, run):
        return await run(gateway)

    monkeypatch.setattr(agent.cli, "_with_evaluator", with_evaluator)
    code, output, exception = invoke(
        "rollout", str(TASK_FILE), "--policy", "scripted", "--config", "agent_tiny", "--episodes-per-task", "2",
        "--out", str(episodes_dir.parent / f"{episodes_dir.parent.name}.parquet"), "--episodes-dir", str(episodes_dir), *flags,
    )
    assert code == 0, (output, exception)
    assert "statuses {'correct': 2}" in output, output
    return gateway.jobs


def jobs_by_salt(jobs):
    grouped = {}
    for service, digest, salt in jobs:
        grouped.setdefault(salt, []).append((service, digest))
    return grouped


@pytest.mark.skipif(not (REPO / "examples/solutions/host/elementwise_chain/model_new.py").is_file(), reason="example host solution missing")
def test_rollout_gives_each_episode_its_own_salt_by_default(monkeypatch, tmp_path):
    jobs = rollout_jobs(monkeypatch, tmp_path / "first" / "roll")
    assert {digest for _, digest, _ in jobs} and len({digest for _, digest, _ in jobs}) == 1  # identical solutions
    grouped = jobs_by_salt(jobs)
    assert len(grouped) == 2 and None not in grouped and all(isinstance(salt, str) and salt for salt in grouped)
    first, second = grouped.values()
    assert first == second == [("compile", jobs[0][1]), ("evaluate", jobs[0][1]), ("evaluate", jobs[0][1])]
    # A later batch in a directory of the same name does not reuse those salts (a broker keeps results).
    again = jobs_by_salt(rollout_jobs(monkeypatch, tmp_path / "second" / "roll", "--salt-per-episode"))
    assert len(again) == 2 and not set(again) & set(grouped)


@pytest.mark.skipif(not (REPO / "examples/solutions/host/elementwise_chain/model_new.py").is_file(), reason="example host solution missing")
def test_rollout_without_salt_lets_identical_solutions_share_evaluations(monkeypatch, tmp_path):
    jobs = rollout_jobs(monkeypatch, tmp_path / "roll", "--no-salt-per-episode")
    assert len(jobs) == 6 and {salt for _, _, salt in jobs} == {None}
    assert len({digest for _, digest, _ in jobs}) == 1


def test_rollout_help_explains_the_salt_option():
    code, output, _ = invoke("rollout", "--help")
    assert code == 0 and "--salt-per-episode" in output and "--no-salt-per-episode" in output


def test_train_loop_refuses_a_model_smaller_than_the_tokenizer(tmp_path):
    config = tmp_path / "small.yaml"
    config.write_text((REPO / "configs" / "tiny_loop.yaml").read_text().replace("vocab_size: 523 ", "vocab_size: 100 "))
    code, output, exception = invoke("train-loop", str(TASK_FILE), "--config", str(config), "--episodes-dir", str(tmp_path / "eps"))
    assert code == 2, (output, exception)
    assert "the tokenizer has 523 tokens, more than the model's vocab_size=100" in output


def test_train_loop_refuses_an_episodes_folder_of_an_earlier_run(tmp_path):
    (tmp_path / "eps" / "iteration-0000").mkdir(parents=True)
    code, output, exception = invoke("train-loop", str(TASK_FILE), "--config", str(REPO / "configs" / "tiny_loop.yaml"),
                                     "--episodes-dir", str(tmp_path / "eps"))
    assert code == 2, (output, exception)
    said = f"{tmp_path / 'eps'} already holds the episodes of a run (iteration-0000); give an empty --episodes-dir"
    assert said in " ".join(output.split())


def test_train_loop_refuses_more_devices_than_there_are(tmp_path):
    import jax

    code, output, exception = invoke("train-loop", str(TASK_FILE), "--config", str(REPO / "configs" / "tiny_loop.yaml"),
                                     "--episodes-dir", str(tmp_path / "eps"), "--devices", str(jax.device_count() + 1))
    assert code == 2, (output, exception)
    assert f"--devices must be between 1 and {jax.device_count()}" in output
    assert not (tmp_path / "eps").exists()  # refused before anything was made
