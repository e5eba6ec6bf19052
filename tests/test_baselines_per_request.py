"""The baselines timed one request per call (timing/host_baselines.py) or in a loop in the reference child:
the host's default, CUDA's default, the switch, and the cache key."""

from evaluator_cuda.evaluation import times as evaluation_times
from evaluator_cuda.evaluation import evaluate
from evaluator_cuda.settings import EvalSettings
from evaluator_cuda.solutions import reference_solution
from evaluator_cuda.timing.stability import baseline_protocol

from evaluator_helpers import AXPY_TASK, FakeCudaEvent, host


def test_the_host_times_baselines_per_request_cuda_in_a_loop_unless_told():
    assert EvalSettings.for_backend("host").time_baselines_per_request()
    assert not EvalSettings.for_backend("cuda").time_baselines_per_request()
    switched = EvalSettings.for_backend("cuda", baselines_per_request=True)
    assert switched.time_baselines_per_request()
    assert baseline_protocol(switched)["calls"] == "one_request_each"
    assert baseline_protocol(EvalSettings.for_backend("cuda"))["calls"] == "prepared_as_candidate_one_output_block"
    assert not EvalSettings.for_backend("host", baselines_per_request=False).time_baselines_per_request()


def test_each_way_of_timing_the_baselines_is_the_one_taken(tmp_path, monkeypatch):
    taken = []
    looped, per_request = evaluation_times.measure_baselines, evaluation_times.host_baselines

    def spy_requests(*args):
        taken.append("per request")
        return per_request(*args)

    monkeypatch.setattr(evaluation_times, "host_baselines", spy_requests)
    for switch, expected in ((False, []), (True, ["per request"])):
        taken.clear()
        settings = host(str(tmp_path / str(switch)), profile=True, baselines_per_request=switch)
        record = evaluate(AXPY_TASK, reference_solution("axpy"), settings)
        assert record["status"] == "correct", record["message"]
        assert record["times_us"]["eager_baseline"]["median_us"] > 0 and taken == expected
    assert looped is evaluation_times.measure_baselines


def test_the_launch_pad_setting_reaches_both_sides_and_keys_the_cache(monkeypatch):
    import torch

    from evaluator_cuda.timing import profile
    from evaluator_cuda.verdict.schedule import CallRequests

    slept = []
    timing = (FakeCudaEvent, FakeCudaEvent.record, FakeCudaEvent.elapsed_time, lambda: None, slept.append)
    monkeypatch.setattr(profile, "_cuda_timing", timing)
    profile.time_one_call(lambda: "out", "cuda", pad_cycles=16_000_000)
    profile.time_one_call(lambda: "out", "cuda")
    assert slept == [16_000_000, profile.LAUNCH_PAD_CYCLES]
    monkeypatch.setattr(torch.cuda, "_sleep", slept.append)
    monkeypatch.setattr(torch.cuda, "Event", FakeCudaEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    slept.clear()
    profile.time_forward(lambda: "out", warmup=0, repeats=2, device_type="cuda", pad_cycles=8_000_000)
    assert slept == [8_000_000, 8_000_000]
    # the candidate's call requests and the baselines' cache key
    settings = EvalSettings.for_backend("cuda", launch_pad_cycles=16_000_000)
    requests = CallRequests([("check", 0)], [[]], [], 0, settings.launch_pad_cycles)
    assert profile.requested_pad(requests.request(0, ("check", 0))) == 16_000_000
    assert profile.requested_pad(CallRequests([("check", 0)], [[]], [], 0).request(0, ("check", 0))) is None
    assert baseline_protocol(settings)["launch_pad_cycles"] == 16_000_000
    assert "launch_pad_cycles" not in baseline_protocol(EvalSettings.for_backend("cuda"))

