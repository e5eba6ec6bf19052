"""The host-backend example solutions, judged by the project's evaluator (one build path).

Each host solution goes through `evaluator_cuda.service.evaluate_job` with the verdict only
(`profile: False`): the evaluator builds it (cuda_agent/templates/binding.cpp + kernels/*.cpp into the one
module `cuda_extension`, cached by content hash), runs the task's Model and the candidate's
ModelNew in separate processes on 5 fresh input sets with a shared state_dict, and compares at
atol = rtol = 1e-2. The honest solutions must come back `correct`; the deliberately wrong one
`incorrect` with reward -1.

Cold, on a 2-core machine, the seven torch-header builds alone take several minutes (cached
afterwards under ~/.cache/cuda-agent/build/), hence `slow`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
HOST_SOLUTIONS = EXAMPLES / "solutions" / "host"


def task_for(solution: Path) -> Path:
    """`<stem>` or `<stem>__<variant>` -> examples/tasks/<stem>.py."""
    return EXAMPLES / "tasks" / f"{solution.name.split('__')[0]}.py"


def evaluate_host_solution(solution: Path) -> dict:
    from evaluator_cuda.service import evaluate_job

    files = {str(p.relative_to(solution)): p.read_bytes() for p in sorted(solution.rglob("*")) if p.is_file()}
    task = task_for(solution)
    job = {
        "task": {"name": task.stem, "source": task.read_text()},
        "solution": {"format": "workspace", "files": files},
        "settings": {"backend": "host", "profile": False},
    }
    return evaluate_job(job)


SOLUTIONS = sorted(p for p in HOST_SOLUTIONS.iterdir() if p.is_dir())
HONEST = [p for p in SOLUTIONS if "__" not in p.name]
WRONG = [p for p in SOLUTIONS if p.name.endswith("__wrong")]


@pytest.fixture(scope="module")
def records() -> dict[str, dict]:
    pytest.importorskip("torch")
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip([p.name for p in SOLUTIONS], pool.map(evaluate_host_solution, SOLUTIONS)))


def test_every_task_has_an_honest_host_solution_and_one_wrong_one():
    tasks = sorted(p.stem for p in (EXAMPLES / "tasks").glob("*.py"))
    assert len(tasks) >= 6
    assert [p.name for p in HONEST] == tasks
    assert len(WRONG) >= 1 and all(task_for(p).exists() for p in WRONG)


@pytest.mark.slow
@pytest.mark.parametrize("name", [p.name for p in HONEST])
def test_honest_host_solution_is_correct(records, name):
    record = records[name]
    assert record["status"] == "correct", (record["status"], record["message"], record["diagnostics"][:3])
    assert record["reward"] == 1  # correctness milestone; profiling is off
    assert len(record["seeds"]["inputs"]) == 5


@pytest.mark.slow
@pytest.mark.parametrize("name", [p.name for p in WRONG])
def test_wrong_host_solution_is_incorrect_with_reward_minus_one(records, name):
    record = records[name]
    # It builds and runs: the bug is numerical, so the verdict must be `incorrect`, not a crash.
    assert record["status"] == "incorrect", (record["status"], record["message"])
    assert record["reward"] == -1
    assert "differ" in record["message"] or "not close" in record["message"], record["message"]
