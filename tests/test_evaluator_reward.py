"""The milestone reward (docs/paper.md §6) on a table of hand-derived cases, and the bench metrics."""

import math

import pytest

from cuda_agent.contracts import beats, milestone_reward
from evaluator_cuda.bench.metrics import bench_metrics, fast_p, geometric_mean
from evaluator_cuda.settings import EvalSettings
from evaluator_cuda.verdict.record import finish, new_record

# (correct, t, t_eager, t_compile, expected) — b(t, t0) = (t0 - t)/t0 > 0.05
CASES = [
    (False, 1.0, 100.0, 100.0, -1),  # incorrect: -1 whatever the speed
    (True, 50.0, 100.0, 100.0, 3),  # 50% faster than both
    (True, 94.0, 100.0, 100.0, 3),  # 6% faster than both
    (True, 95.0, 100.0, 100.0, 1),  # exactly 5%: not more than 5%
    (True, 96.0, 100.0, 100.0, 1),  # 4% faster: no milestone
    (True, 50.0, 100.0, 40.0, 2),  # faster than eager, slower than compile
    (True, 50.0, 100.0, 52.0, 2),  # 3.8% faster than compile only: eager milestone only
    (True, 50.0, 40.0, 100.0, 1),  # faster than compile only: the formula gives 1
    (True, 200.0, 100.0, 100.0, 1),  # slower than both but correct
    (True, 10.0, 100.0, None, 2),  # compile baseline failed: eager milestone at most
]


@pytest.mark.parametrize("correct,t,t_eager,t_compile,expected", CASES)
def test_milestone_reward_table(correct, t, t_eager, t_compile, expected):
    assert milestone_reward(correct, t, t_eager, t_compile) == expected


def test_margin_is_a_parameter():
    # 8% faster than both: a 10% margin gives 1, the paper's 5% gives 3.
    assert milestone_reward(True, 92.0, 100.0, 100.0, margin=0.10) == 1
    assert milestone_reward(True, 92.0, 100.0, 100.0) == 3
    assert beats(89.0, 100.0, 0.10) and not beats(90.0, 100.0, 0.10)


def test_infrastructure_failures_are_not_scored():
    settings = EvalSettings.for_backend("host")
    for status in ("infra_error", "task_error"):
        record = finish(new_record("t", "c", "workspace", settings), status, "worker crashed")
        assert record["reward"] is None
    for status in ("compile_error", "runtime_error", "incorrect"):
        assert finish(new_record("t", "c", "workspace", settings), status, "x")["reward"] == -1


def test_record_reward_follows_times():
    settings = EvalSettings.for_backend("host")
    record = new_record("t", "c", "workspace", settings)
    record["times_us"] = {"candidate": {"median_us": 40.0}, "eager": {"median_us": 100.0}, "compile": {"median_us": 80.0}}
    finish(record, "correct")
    assert record["reward"] == 3
    assert record["speedup"] == {"eager": pytest.approx(2.5), "compile": pytest.approx(2.0)}


def _rec(status, eager=None, compile=None):
    return {"status": status, "speedup": {"eager": eager, "compile": compile}, "reward": None}


def test_bench_metrics_by_hand():
    records = [_rec("correct", 2.0, 0.5), _rec("correct", 0.5, 0.25), _rec("incorrect"), _rec("correct", 1.6, 1.2)]
    m = bench_metrics(records)
    assert m["pass_rate"] == pytest.approx(3 / 4)
    assert m["faster_rate_vs_eager"] == pytest.approx(2 / 4)  # 2.0 and 1.6
    assert m["faster_rate_vs_compile"] == pytest.approx(1 / 4)  # 1.2
    assert m["geomean_speedup_vs_eager"] == pytest.approx((2.0 * 0.5 * 1.6) ** (1 / 3))
    assert m["fast_p_vs_eager"]["0.0"] == pytest.approx(3 / 4)
    assert m["fast_p_vs_eager"]["1.5"] == pytest.approx(2 / 4)
    assert m["fast_p_vs_eager"]["2.0"] == pytest.approx(0.0)  # strictly faster than 2x
    assert fast_p(records, "compile", 0.4) == pytest.approx(2 / 4)
    assert geometric_mean([]) is None
    assert math.isclose(geometric_mean([4.0, 1.0]), 2.0)
