"""On CUDA a time is the median of the means of consecutive pairs of calls (timing/profile.py
summarize_times): even and odd calls of a small kernel can run at two speeds, and the plain median of
such calls lands on the inner edge of whichever mode has one call more."""

from __future__ import annotations

import types

import pytest

from evaluator_cuda.evaluation import times as evaluation_times
from evaluator_cuda.roles import reference
from evaluator_cuda.settings import EvalSettings
from evaluator_cuda.timing import profile
from evaluator_cuda.timing.stability import baseline_protocol

# 35 timed calls (the candidate's 5 checks and 30 repeats) alternating between 10 and 12 µs, the first
# and last at 10: 18 calls at 10 µs, 17 at 12 µs.
ALTERNATING = [10.0, 12.0] * 17 + [10.0]


def test_the_median_of_pair_means_lies_between_two_alternating_speeds():
    plain = profile.summarize_times(ALTERNATING)
    paired = profile.summarize_times(ALTERNATING, pairs=True)
    assert plain["median_us"] == 10.0  # the 18th of 35 sorted calls: the faster mode's edge
    assert paired["median_us"] == 11.0 and paired["call_median_us"] == 10.0
    assert paired["median_rel_se"] == 0.0  # every pair's mean is 11: the alternation is not noise
    assert paired["statistic"] == "median_of_pair_means" and "statistic" not in plain
    # one call fewer tips the plain median to the other mode; the pairs' median does not move
    assert profile.summarize_times(ALTERNATING[1:])["median_us"] == 11.0  # 17 and 17: between them
    assert profile.summarize_times(ALTERNATING[2:])["median_us"] == 10.0
    assert profile.summarize_times(ALTERNATING[1:] + [12.0])["median_us"] == 12.0
    for calls in (ALTERNATING[1:], ALTERNATING[2:], ALTERNATING[1:] + [12.0]):
        assert profile.summarize_times(calls, pairs=True)["median_us"] == 11.0
    # the summary of the calls themselves is the same either way
    for key in ("mean_us", "min_us", "max_us", "p25_us", "p75_us", "n"):
        assert paired[key] == plain[key]


def test_a_candidate_that_alternates_fast_and_slow_calls_pays_for_the_slow_ones():
    calls = [1.0, 9.0] * 10 + [1.0]
    assert profile.summarize_times(calls)["median_us"] == 1.0
    assert profile.summarize_times(calls, pairs=True)["median_us"] == 5.0


def test_pair_means_and_their_standard_error():
    assert profile.pair_means([1.0, 3.0, 5.0, 9.0, 100.0]) == [2.0, 7.0]  # the odd last call left out
    assert profile.pair_means([4.0]) == [4.0] and profile.pair_means([]) == []
    # noise that is not an alternation stays noise: pairs of (100, 100), (50, 150) ... give means 100 and 100,
    # but (50, 50), (150, 150) give 50 and 150
    assert profile.summarize_times([50.0, 50.0, 150.0, 150.0] * 5, pairs=True)["median_rel_se"] > 0.2
    one = profile.summarize_times([7.0], pairs=True)
    assert one["median_us"] == 7.0 and one["median_rel_se"] is None


def test_the_candidate_and_the_baselines_are_summarized_alike_on_cuda(monkeypatch):
    candidate = evaluation_times.valid_times(ALTERNATING, [20.0, 30.0] * 17 + [20.0], pairs=True)
    assert candidate["median_us"] == 11.0 and candidate["wall_median_us"] == 25.0

    def fake_time_forward(calls, warmup, repeats, device_type, l2_flush_bytes=0, prepare=None):
        return list(ALTERNATING), None

    monkeypatch.setattr(profile, "time_forward", fake_time_forward)
    kwargs = dict(warmup=5, repeats=35, l2_flush_bytes=0)
    calls = types.SimpleNamespace(prepare=None)
    on_cuda = reference._timed_until_stable(calls, {**kwargs, "device_type": "cuda"}, 0.025, 0.0)
    on_host = reference._timed_until_stable(calls, {**kwargs, "device_type": "cpu"}, 0.025, 0.0)
    assert on_cuda["median_us"] == 11.0 and on_cuda["rounds"] == 1
    assert on_host["median_us"] == 10.0


@pytest.mark.parametrize("backend, statistic", [("cuda", "median_of_pair_means"), ("host", None)])
def test_the_statistic_keys_the_baseline_cache(backend, statistic):
    # baselines cached under the plain median are not read as pair medians
    assert baseline_protocol(EvalSettings.for_backend(backend)).get("statistic") == statistic
