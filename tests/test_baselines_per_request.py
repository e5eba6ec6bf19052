"""The baselines timed one request per call (timing/host_baselines.py) or in a loop in the reference child:
the host's default, CUDA's default, the switch, and the cache key."""

from evaluator_cuda import evaluation
from evaluator_cuda.evaluation import evaluate
from evaluator_cuda.settings import EvalSettings
from evaluator_cuda.solutions import reference_solution
from evaluator_cuda.timing.stability import baseline_protocol

from evaluator_helpers import AXPY_TASK, host


def test_the_host_times_baselines_per_request_cuda_in_a_loop_unless_told():
    assert EvalSettings.for_backend("host").time_baselines_per_request()
    assert not EvalSettings.for_backend("cuda").time_baselines_per_request()
    switched = EvalSettings.for_backend("cuda", baselines_per_request=True)
    assert switched.time_baselines_per_request()
    assert baseline_protocol(switched)["calls"] == "one_request_each"
    assert baseline_protocol(EvalSettings.for_backend("cuda"))["calls"] == "prepared_as_candidate"
    assert not EvalSettings.for_backend("host", baselines_per_request=False).time_baselines_per_request()


def test_each_way_of_timing_the_baselines_is_the_one_taken(tmp_path, monkeypatch):
    taken = []
    looped, per_request = evaluation._measure_baselines, evaluation.host_baselines

    def spy_requests(*args):
        taken.append("per request")
        return per_request(*args)

    monkeypatch.setattr(evaluation, "host_baselines", spy_requests)
    for switch, expected in ((False, []), (True, ["per request"])):
        taken.clear()
        settings = host(str(tmp_path / str(switch)), profile=True, baselines_per_request=switch)
        record = evaluate(AXPY_TASK, reference_solution("axpy"), settings)
        assert record["status"] == "correct", record["message"]
        assert record["times_us"]["eager_baseline"]["median_us"] > 0 and taken == expected
    assert looped is evaluation._measure_baselines
