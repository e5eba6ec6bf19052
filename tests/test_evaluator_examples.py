"""The bundled examples through the evaluator: every honest solution is correct and every
deliberately wrong one is `incorrect` with reward -1 — on the GPU (cuda-marked) and through
the main command on the host backend (slow: seven torch-header builds when the cache is cold)."""

from pathlib import Path

import pytest

from evaluator_cuda.evaluation import evaluate
from evaluator_cuda.settings import EvalSettings
from evaluator_cuda.solutions import read_solution
from evaluator_cuda.tasks import load_tasks

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CUDA_SOLUTIONS = sorted(p for p in (EXAMPLES / "solutions" / "cuda").glob("*") if p.is_dir()) if (EXAMPLES / "solutions" / "cuda").is_dir() else []


def _task(stem: str):
    return {t.stem: t for t in load_tasks(EXAMPLES / "tasks").tasks}[stem]


@pytest.mark.cuda
@pytest.mark.parametrize("solution_dir", CUDA_SOLUTIONS, ids=[p.name for p in CUDA_SOLUTIONS])
def test_cuda_example_verdict(solution_dir):
    solution = read_solution(solution_dir)
    record = evaluate(_task(solution.stem), solution, EvalSettings.for_backend("cuda", profile=False))
    if solution.variant:
        assert record["status"] == "incorrect" and record["reward"] == -1, record["message"]
    else:
        assert record["status"] == "correct", (record["message"], record["diagnostics"][:3])
        assert record["reward"] == 1 and record["backend"] == "cuda"


@pytest.mark.cuda
def test_cuda_profiled_evaluation_has_times_and_a_reward():
    honest = [p for p in CUDA_SOLUTIONS if "__" not in p.name][0]
    solution = read_solution(honest)
    settings = EvalSettings.for_backend("cuda", repeats=10)
    record = evaluate(_task(solution.stem), solution, settings)
    assert record["status"] == "correct", record["message"]
    # Every candidate call after the warm-up is timed, the checked ones too (one call path). A baseline is
    # timed in rounds of `repeats` calls until its median is precise (or its budget is spent).
    expected_n = {"candidate": 10 + settings.checks, "eager": 10, "compile": 10}
    for key, n in expected_n.items():
        times = record["times_us"][key]
        rounds = times.get("rounds", 1) if key != "candidate" else 1
        assert rounds >= 1 and times["n"] == n * rounds, (key, times["n"], rounds)
        assert 0 < times["min_us"] <= times["median_us"] <= times["max_us"]
    assert record["reward"] in (1, 2, 3)
    assert record["persisting_l2_reset"] is True  # the driver demoted persisting L2 lines before every call
    assert record["baseline_persisting_l2_reset"] is True  # and before every baseline call
    assert record["inputs_generated_on"] == "cuda"  # get_inputs() ran under torch.device("cuda")


@pytest.mark.slow
def test_main_command_on_host_examples(host_examples_bench):
    """`cuda-agent bench examples/tasks --solutions examples/solutions --backend host` (verdicts only;
    run once in tests/conftest.py, whose records tests/test_examples_host.py checks one by one)."""
    result = host_examples_bench
    assert not result.problems
    by_name = {r["candidate"]: r for r in result.records}
    stems = sorted(p.stem for p in (EXAMPLES / "tasks").glob("*.py"))
    assert len(stems) >= 6
    for stem in stems:
        assert by_name[stem]["status"] == "correct", (stem, by_name[stem]["message"])
    wrong = [r for name, r in by_name.items() if "[" in name]
    assert wrong and all(r["status"] == "incorrect" and r["reward"] == -1 for r in wrong)
    assert result.metrics["tasks"] == len(stems) and result.metrics["pass_rate"] == 1.0
