"""The ablation's statistics, collapse rules and task reward against numbers worked out by hand."""

import math

import numpy as np
import pytest

from ablations import statistics as st
from ablations.collapse import CollapseRule, collapse_iteration
from ablations.task import BOS, DIGIT0, EOS, EQUALS, PLUS, AdditionTask, answer_reward


def test_ratio_summary_by_hand():
    s = st.ratio_summary([0.5, 1.0, 1.5, 2.0])
    assert s["count"] == 4 and s["mean"] == 1.25 and s["min"] == 0.5 and s["max"] == 2.0
    assert s["std"] == pytest.approx(math.sqrt(1.25 / 4))  # deviations 0.75, 0.25, 0.25, 0.75
    assert s["q0.5"] == 1.25
    assert all(math.isnan(v) for k, v in st.ratio_summary([]).items() if k != "count")


def test_buckets_edges_and_per_bucket_statistics():
    assert st.bucket_indices([0, 5e-5, 1e-4, 5e-3, 1e-2, 0.3, 0.5, 1.0]).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    b = st.ratio_by_bucket([1.0, 2.0, 3.0, 4.0], [5e-5, 0.6, 0.7, 1e-3])
    assert list(b) == ["<1e-4", "1e-4..1e-2", "1e-2..0.5", ">0.5"]
    assert b["<1e-4"]["count"] == 1 and b["<1e-4"]["mean"] == 1.0
    assert b["1e-4..1e-2"]["mean"] == 4.0
    assert b["1e-2..0.5"]["count"] == 0 and math.isnan(b["1e-2..0.5"]["mean"])
    assert b[">0.5"]["mean"] == 2.5 and b[">0.5"]["std"] == 0.5


def test_outside_and_clip_fractions():
    out = st.outside_fraction([0.7, 0.9, 1.0, 1.2, 1.3, 1.5], 0.2, 0.28)
    assert out["below"] == pytest.approx(1 / 6) and out["above"] == pytest.approx(2 / 6)
    assert out["outside"] == pytest.approx(0.5)
    # the clip binds low only where A < 0, high only where A > 0
    clip = st.clip_fractions([0.7, 0.7, 1.5, 1.5], [-1.0, 1.0, 1.0, -1.0], 0.2, 0.28)
    assert clip == {"low": 0.25, "high": 0.25}


def test_kl_estimators_by_hand():
    kl = st.kl_estimators(np.log([0.5, 0.25]), np.log([0.25, 0.5]))  # r = 0.5 and 2
    assert kl["k1"] == pytest.approx(0.0, abs=1e-12)
    assert kl["k3"] == pytest.approx(((0.5 - 1 - math.log(0.5)) + (2 - 1 - math.log(2))) / 2)
    assert kl["k3"] == pytest.approx(0.25)


def test_correlation_explained_variance_length_clip():
    assert st.probability_correlation(np.log([0.1, 0.2, 0.3]), np.log([0.2, 0.4, 0.6])) == pytest.approx(1.0)
    assert st.probability_correlation(np.log([0.1, 0.2, 0.3]), np.log([0.3, 0.1, 0.2])) == pytest.approx(-0.5)
    assert math.isnan(st.probability_correlation(np.log([0.2, 0.2]), np.log([0.1, 0.3])))
    # residual [0, 0, 0, -1]: variance 0.1875; returns' variance 1.25 (the critic's own statistic, which
    # the ablation records)
    from policy_jax.rl.metrics import explained_variance

    ones = np.ones((1, 4))
    assert float(explained_variance(np.array([[1., 2, 3, 5]]), np.array([[1., 2, 3, 4]]), ones)) == pytest.approx(
        1 - 0.1875 / 1.25)
    assert math.isnan(float(explained_variance(np.array([[1., 2]]), np.array([[3., 3]]), np.ones((1, 2)))))
    assert st.length_clip_ratio([True, False, False, True]) == 0.5


def test_seed_spread_and_verdicts():
    s = st.seed_spread([1.0, 2.0, 3.0, float("nan")])
    assert (s["mean"], s["std"], s["min"], s["max"], s["n"]) == (2.0, 1.0, 1.0, 3.0, 3.0)
    assert st.difference_verdict([1, 2], [3, 4]) == "exceeds"
    assert st.difference_verdict([1, 3], [2, 4]) == "within"
    assert st.difference_verdict([1], [2, 3]) == "one seed"


def _records(rewards, stds, stopped_at=None):
    out = [{"iteration": i, "reward_mean": r, "update": {"ratio": {"std": s}}, "mismatch": {"ratio": {"std": 0.0}}}
           for i, (r, s) in enumerate(zip(rewards, stds))]
    if stopped_at is not None:
        out[stopped_at] = {"iteration": stopped_at, "stopped": "non-finite loss"}
    return out


def test_collapse_rules():
    rewards = [0.1, 0.4, 0.5, 0.2, 0.1]  # best before iteration 3 is 0.5; 0.2 < 0.25
    assert collapse_iteration(_records(rewards, [0.2] * 5), CollapseRule(rule="reward_drop")) == 3
    quiet = [0.2, 0.2, 0.2, 0.05, 0.2]  # the ratio std is small when the reward first drops
    assert collapse_iteration(_records(rewards, quiet), CollapseRule()) == 4
    assert collapse_iteration(_records(rewards, quiet), CollapseRule(ratio_of="mismatch")) is None
    assert collapse_iteration(_records(rewards, [0.2] * 5), CollapseRule(patience=2)) == 3
    assert collapse_iteration(_records([0.5, 0.2, 0.5], [0.2] * 3), CollapseRule(patience=2)) is None
    assert collapse_iteration(_records([0.05, 0.0, 0.0], [1.0] * 3), CollapseRule()) is None  # best below 0.1
    assert collapse_iteration(_records(rewards, [0.0] * 5, stopped_at=2), CollapseRule()) == 2
    with pytest.raises(ValueError, match="collapse.rule"):
        CollapseRule(rule="vibes")


def test_addition_task_and_its_reward():
    problems = AdditionTask(max_operand=9).problems(np.random.default_rng(0), 50)
    for p in problems:
        a = p.prompt[1] - DIGIT0
        b = p.prompt[3] - DIGIT0
        assert p.prompt == (BOS, DIGIT0 + a, PLUS, DIGIT0 + b, EQUALS)
        assert p.answer == tuple(DIGIT0 + int(c) for c in str(a + b))
    answer = (DIGIT0 + 1, DIGIT0 + 2)  # "12"
    assert answer_reward([*answer, EOS], answer) == 1.0
    assert answer_reward(list(answer), answer) == 0.5  # cut at the length limit
    assert answer_reward([*answer, PLUS], answer) == 0.5
    assert answer_reward([*answer, DIGIT0], answer) == 0.0  # "120" is another number
    assert answer_reward([DIGIT0 + 1, EOS], answer) == 0.0
    assert answer_reward([], answer) == 0.0


def test_a_log_scaled_figure_with_nothing_positive_is_drawn_on_a_linear_axis(tmp_path):
    """A probability bucket no token fell in has no ratio std (null in every record), and matched engines give
    exactly 0: such a panel must still be drawn (on a log axis matplotlib raised and no report was written)."""
    pytest.importorskip("matplotlib")
    from ablations.plots import figure

    empty = {"bf16": {0: [{"std": None}, {"std": None}]}, "fp32": {0: [{"std": None}], 1: [{"std": None}]}}
    zeros = {"matched": {0: [{"std": 0.0}, {"std": 0.0}]}}
    some = {"bf16": {0: [{"std": 0.5}, {"std": None}]}, **zeros}
    for name, runs in (("empty.png", empty), ("zeros.png", zeros), ("some.png", some)):
        assert figure(tmp_path, name, runs, [("p < 1e-4", ("std",))], "ratio std", log_y=True) == name
        assert (tmp_path / name).stat().st_size > 0
