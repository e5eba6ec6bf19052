"""Small outputs are scored at their own scale, so every task with a meaningful output can be
scored: the elementwise atol of a tensor follows its reference's magnitude, the relative-norm
check stands beside it, and only outputs that ignore the inputs or differ between two runs of the
reference are task errors."""

import pytest
import torch

from evaluator_cuda.evaluation import evaluate
from evaluator_cuda.verdict.verify import SCALE_ATOL_FRACTION, compare_outputs, criterion_of, tensor_atol
from evaluator_helpers import build_cache, host, small_output_cases  # noqa: F401  (build_cache is a fixture)

CPU = {"cls": "Tensor", "device": "cpu"}


def _problem(expected, actual, norm_rtol=1e-2):
    return compare_outputs(expected, actual, [CPU], "cpu", 1e-2, 1e-2, norm_rtol=norm_rtol)


def test_tensor_atol_is_the_papers_atol_or_a_fraction_of_the_peak_whichever_is_smaller():
    assert tensor_atol(torch.tensor([3.0, -200.0]), 1e-2) == 1e-2
    assert tensor_atol(torch.tensor([2e-4, -5e-4, float("inf")]), 1e-2) == pytest.approx(SCALE_ATOL_FRACTION * 5e-4)
    assert tensor_atol(torch.zeros(3), 1e-2) == 0.0  # exact: an all-zero reference is matched only by zeros
    assert tensor_atol(torch.tensor([1, 2]), 1e-2) == 1e-2  # integers: unchanged


def test_wide_softmax_by_hand_honest_passes_and_each_wrong_answer_fails_its_criterion():
    """A softmax over 262,144 columns: every value near 4e-6, far below the paper's atol of 1e-2."""
    torch.manual_seed(0)
    x = torch.randn(4, 262_144)
    ref = torch.softmax(x, dim=-1)
    honest = torch.softmax(x.double(), dim=-1).float()  # another summation order: rounding only
    assert _problem(ref, honest) is None
    wrong = {
        "zeros": torch.zeros_like(ref),
        "constant": torch.full_like(ref, 1 / 262_144),
        "permuted rows": ref.flip(0),
        "0.5x": ref * 0.5,
    }
    for name, actual in wrong.items():
        problem = _problem(ref, actual)
        assert problem is not None, name
        assert criterion_of(problem) == "elementwise_scaled", (name, problem)
        # Under the paper's absolute atol alone every one of them would have passed.
        assert compare_outputs(ref, actual, [CPU], "cpu", 1e-2, 1e-2) is not None
        assert torch.allclose(actual, ref, atol=1e-2, rtol=1e-2), name


def test_relative_norm_catches_what_the_elementwise_check_lets_through():
    """Most of a heavy-tailed tensor lies below 1 % of its peak: zeroing that part passes the
    elementwise check at the scaled atol, but not the whole-tensor relative norm."""
    ref = torch.full((40_000,), 1e-4)  # tail norm 2e-2 against a peak of 1
    ref[0] = 1.0
    cut = ref.clone()
    cut[1:] = 0
    problem = _problem(ref, cut)
    assert criterion_of(problem) == "relative_norm", problem
    assert _problem(ref, cut, norm_rtol=None) is None


@pytest.mark.parametrize("case", small_output_cases("host", wide_cols=65_536, honest_runs=2), ids=lambda c: c[0].replace(" ", "-"))
def test_small_output_table_on_the_host_backend(case, build_cache):  # noqa: F811
    """Honest wide softmax over many seeds (5 per evaluation) correct; zeros, a constant, permuted
    rows and a 0.5x output incorrect; a reference that ignores its inputs a task error."""
    label, task, solution, expected = case
    record = evaluate(task, solution, host(build_cache))
    assert record["status"] == expected, (label, record["message"])
    if expected == "incorrect":
        assert record["reward"] == -1 and record["failed_criterion"] in ("elementwise_scaled", "relative_norm", "constant_output"), record
    if expected == "correct":
        assert record["tolerance"]["scaled"] is True and record["tolerance"]["tensor_atol"][0] < 1e-3  # far below the paper's 1e-2
    if expected == "task_error":
        assert "does not depend on the inputs" in record["message"]
