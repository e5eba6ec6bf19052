"""The host-backend example solutions, judged by the project's evaluator (one build path).

Each host solution is evaluated with the verdict only (`profile: False`) in the one run of
`cuda-agent bench examples/tasks --solutions examples/solutions --backend host` that
tests/conftest.py makes for this file and tests/test_evaluator_examples.py: the evaluator builds
it (cuda_agent/templates/binding.cpp + kernels/*.cpp into the one module `cuda_extension`, cached
by content hash), runs the task's Model and the candidate's ModelNew in separate processes on 5
fresh input sets with a shared state_dict, and compares at atol = rtol = 1e-2. The honest
solutions must come back `correct`; the deliberately wrong one `incorrect` with reward -1.
(Workspace jobs through `evaluator_cuda.service.evaluate_job` are covered by the service tests of
tests/test_evaluator_pipeline.py and by the evaluator workers behind the bridge.)

Cold, on a 2-core machine, the evaluations take about a minute, hence `slow`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
HOST_SOLUTIONS = EXAMPLES / "solutions" / "host"


def task_for(solution: Path) -> Path:
    """`<stem>` or `<stem>__<variant>` -> examples/tasks/<stem>.py."""
    return EXAMPLES / "tasks" / f"{solution.name.split('__')[0]}.py"


SOLUTIONS = sorted(p for p in HOST_SOLUTIONS.iterdir() if p.is_dir())
HONEST = [p for p in SOLUTIONS if "__" not in p.name]
WRONG = [p for p in SOLUTIONS if p.name.endswith("__wrong")]


@pytest.fixture(scope="module")
def records(host_examples_bench) -> dict[str, dict]:
    """Each solution folder's record in the bench run (a `<stem>__<variant>` folder is `<stem>[<variant>]` there)."""
    from evaluator_cuda.solutions import read_solution

    by_candidate = {r["candidate"]: r for r in host_examples_bench.records}
    return {p.name: by_candidate[read_solution(p).label] for p in SOLUTIONS}


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
    assert record["judged_on"] == "cpu"  # the host backend's outputs are compared on the CPU
    split = record["calls_split_us"]  # the five check calls: the child's phases lie inside each round trip
    assert set(split) == {"inputs", "setup", "call", "checks", "copy_out", "digest", "round_trip", "channel"}
    assert split["channel"] >= 0 and split["round_trip"] >= split["call"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", [p.name for p in WRONG])
def test_wrong_host_solution_is_incorrect_with_reward_minus_one(records, name):
    record = records[name]
    # It builds and runs: the bug is numerical, so the verdict must be `incorrect`, not a crash.
    assert record["status"] == "incorrect", (record["status"], record["message"])
    assert record["reward"] == -1
    assert "differ" in record["message"] or "not close" in record["message"], record["message"]
