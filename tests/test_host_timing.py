"""Host timings that hold on a shared machine: both children on one CPU with a fixed thread count,
a candidate that changes either rejected, imprecise medians earning no speed-up reward and noisy
baselines never cached."""

import os
import subprocess
import sys

import pytest

from cuda_agent.contracts import PAPER_MARGIN
from evaluator_cuda.evaluation import evaluate
from evaluator_cuda.settings import HOST_MARGIN, HOST_TIMING_ROUNDS_S, EvalSettings, host_cache_flush_bytes
from evaluator_cuda.solutions import reference_solution
from evaluator_cuda.timing.profile import median_rel_se, summarize_times
from evaluator_cuda.timing.stability import (baseline_protocol, baseline_recheck, drift_reason, eager_drift,
                                             unstable_times)
from evaluator_cuda.verdict.more_rounds import fresh_sets_left, less_precise_than, plan_round
from evaluator_helpers import AXPY_TASK, build_cache, host, model_new_with, workspace  # noqa: F401

MANY_CPUS = hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) >= 2


def test_the_medians_standard_error_follows_the_spread_and_the_count():
    # IQR 10 around a median of 100 from 36 samples: 1.2533 * 10 / 1.349 / 6 / 100
    assert median_rel_se(10.0, 100.0, 36) == pytest.approx(0.0154843, rel=1e-4)
    assert median_rel_se(10.0, 100.0, 1) is None and median_rel_se(1.0, 0.0, 10) is None
    steady = summarize_times([100.0] * 20)
    noisy = summarize_times([50.0, 150.0] * 10)
    assert steady["median_rel_se"] == 0.0 and noisy["median_rel_se"] > 0.2
    assert unstable_times({"eager": steady, "candidate": noisy}, 0.025).startswith("timing unstable")
    assert "candidate" in unstable_times({"eager": steady, "candidate": noisy}, 0.025)
    assert unstable_times({"eager": steady, "compile": None, "planted": {"median_us": 1.0}}, 0.025) is None


def test_the_host_rewards_beyond_its_own_margin_and_keeps_the_papers_precision_bound():
    host_settings, cuda_settings = EvalSettings.for_backend("host"), EvalSettings.for_backend("cuda")
    assert cuda_settings.margin == PAPER_MARGIN == 0.05 and HOST_MARGIN == 0.25
    assert host_settings.margin == HOST_MARGIN and host_settings.timing_se_bound == PAPER_MARGIN / 2
    assert EvalSettings.for_backend("host", margin=0.1).margin == 0.1  # an explicit margin wins
    assert EvalSettings.from_dict(host_settings.to_dict()) == host_settings


def test_a_cached_eager_time_is_stale_beyond_the_margin_and_three_standard_errors():
    # quiet: both medians known to 1 %, so the 5 % margin decides
    quiet = lambda us: {"median_us": us, "median_rel_se": 0.01}  # noqa: E731
    assert baseline_recheck(quiet(100.0), quiet(104.0), 0.05)["stale"] is False
    assert baseline_recheck(quiet(100.0), quiet(106.0), 0.05)["stale"] is True
    assert baseline_recheck(quiet(100.0), quiet(94.0), 0.05)["stale"] is True  # ln(0.94) = -0.0619
    # noisy: 3 x hypot(0.04, 0.03) = 0.15 allowed in log ratio; 1.15 (0.1398) passes, 1.2 (0.1823) does not
    cached = {"median_us": 100.0, "median_rel_se": 0.04}
    check = baseline_recheck(cached, {"median_us": 115.0, "median_rel_se": 0.03}, 0.05)
    assert check["stale"] is False and check["allowed_log_ratio"] == pytest.approx(0.15)
    assert baseline_recheck(cached, {"median_us": 120.0, "median_rel_se": 0.03}, 0.05)["stale"] is True
    # a sample too noisy to confirm anything (3 x 0.3 = 0.9 > ln 2) sends the baselines to be measured again;
    # the cached median's own noise does not (it was bounded when it was stored)
    check = baseline_recheck(cached, {"median_us": 100.0, "median_rel_se": 0.3}, 0.05)
    assert check["stale"] is True and check["too_noisy"] is True
    assert baseline_recheck(cached, {"median_us": 100.0, "median_rel_se": 0.2}, 0.05)["too_noisy"] is False
    check = baseline_recheck({"median_us": 100.0, "median_rel_se": 0.5}, quiet(100.0), 0.05)
    assert check["stale"] is False and check["too_noisy"] is False
    # a summary without the figure counts as exact
    assert baseline_recheck({"median_us": 1e9}, quiet(50.0), 0.05)["ratio"] == pytest.approx(5e-8)


def test_eager_before_and_after_the_calls_disagree_beyond_the_margin_and_their_noise():
    quiet = lambda us, se=0.005: {"median_us": us, "median_rel_se": se}  # noqa: E731
    assert eager_drift(quiet(100.0), quiet(104.0), 0.05)["moved"] is False
    assert eager_drift(quiet(100.0), quiet(200.0), 0.05)["moved"] is True
    assert eager_drift(quiet(100.0, 0.2), quiet(200.0, 0.2), 0.05)["moved"] is False  # 3 x 28 % allows 2x
    assert drift_reason(eager_drift(quiet(100.0), quiet(104.0), 0.05)) is None
    assert "100.0 µs per call before the candidate's calls and 200.0 µs after" in drift_reason(
        eager_drift(quiet(100.0), quiet(200.0), 0.05))


def test_both_children_time_on_one_cpu_with_the_set_thread_count(build_cache, tmp_path):
    settings = host(build_cache, profile=True, repeats=5, warmup=1)
    record = evaluate(AXPY_TASK, reference_solution("axpy"), settings)
    assert record["status"] == "correct", record["message"]
    pinning = record["host_timing"]
    assert pinning["host_threads"] == 1
    assert pinning["host_cpu"] in os.sched_getaffinity(0)


@pytest.mark.skipif(not MANY_CPUS, reason="needs two CPUs to widen the affinity")
@pytest.mark.parametrize("change", ["os.sched_setaffinity(0, set(range(os.cpu_count())))", "torch.set_num_threads(2)"])
def test_a_candidate_that_changes_threads_or_cpus_is_rejected(build_cache, change):
    settings = host(build_cache, profile=True, repeats=3, warmup=1, static_checks=False)
    solution = workspace(model_new=model_new_with(f"{change}\nreturn cuda_extension.axpy_forward(x, y, float(self.alpha))",
                                                  prelude="import os"))
    record = evaluate(AXPY_TASK, solution, settings)
    assert record["status"] == "incorrect" and record["rejected"] == "timing_setting", record["message"]


def test_imprecise_times_earn_no_speed_up_and_are_not_cached(build_cache, tmp_path):
    """A bound no measurement meets: the reward is 1 whatever the times, and the baselines are
    measured again by the next evaluation."""
    settings = host(str(tmp_path), profile=True, repeats=5, warmup=1, timing_se_bound=0.0, baseline_budget_s=0.0,
                    timing_rounds_budget_s=0.2)
    first = evaluate(AXPY_TASK, reference_solution("axpy"), settings)
    assert first["status"] == "correct" and first["reward"] == 1, first["message"]
    assert any(r.startswith("timing unstable") for r in first["speedup_withheld"])
    assert first["timing_rounds"]["still_imprecise"]  # further rounds cannot meet a bound of 0 either
    assert first["baseline_not_cached"].startswith("timing unstable")
    second = evaluate(AXPY_TASK, reference_solution("axpy"), settings)
    assert second["baseline_cache_hit"] is False


def test_the_unchanged_reference_earns_no_speed_up_under_load(build_cache, tmp_path):
    """Self-check beside a busy process on every CPU: the reference against itself is never scored
    faster than eager (the noise either stays inside the host's margin or withholds the reward). Its
    speed-up over paired eager has ranged 0.96-1.21 here, so only the reward is asserted."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        settings = host(str(tmp_path), profile=True, timing_rounds_budget_s=HOST_TIMING_ROUNDS_S)  # as in use
        record = evaluate(AXPY_TASK, reference_solution("axpy"), settings)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert record["status"] == "correct", record["message"]
    assert record["reward"] == 1, (record["speedup"], record.get("speedup_withheld"))
    assert record["margin"] == HOST_MARGIN and "timing_rounds" in record
    times = record["times_us"]  # eager was timed call by call beside the candidate's calls
    assert times["eager"]["paired"] and times["eager"]["n"] == times["candidate"]["n"]
    assert times["eager_baseline"]["median_us"] > 0


class _DriftingMachine:
    """Two fake children on one machine that becomes twice as slow after `fast_requests` requests to
    either child: every call, eager or candidate, takes 100 µs times the machine's slowness then."""

    def __init__(self, fast_requests: int):
        self.fast_requests, self.requests = fast_requests, []

    def child(self, role: str):
        machine = self

        class Fake:
            def request(self, message, timeout, tensor_meta=None):
                machine.requests.append(role)
                time_us = 100.0 * (1.0 if len(machine.requests) <= machine.fast_requests else 2.0)
                if role == "reference":
                    assert message["cmd"] == "time_call" and message["which"] == "eager"
                    return {"ok": True, "time_us": time_us}
                return {"ok": True, "output": None, "output_meta": [], "time_us": time_us, "wall_us": time_us,
                        "split_us": {}, "l2_resets": 0}

        return Fake()


def test_host_calls_are_paired_with_eager_calls_on_the_same_machine_moment():
    """Profiled on the host, every call after the warm-up has one eager call right before or right after
    it, in turn: a machine that halves its speed halfway through leaves the ratio at exactly 1, where
    eager timed in a round before the calls (at the fast speed) would make the candidate 0.67x."""
    from evaluator_cuda import evaluation

    settings = EvalSettings.for_backend("host", profile=True, checks=2, warmup=2, repeats=8)
    timed = evaluation.loading.TimedSets(seeds=[1, 2], inputs=[[], []], calls=settings.warmup + settings.repeats, set_bytes=0)
    machine = _DriftingMachine(fast_requests=2 + 2 * 5)  # the warm-up calls, then five pairs at full speed
    calls, _ = evaluation.calls.run_calls(machine.child("candidate"), machine.child("reference"), [[], []], [1, 2], timed, settings, {})
    assert machine.requests[:2] == ["candidate", "candidate"]  # the warm-up calls are not paired
    pairs = [machine.requests[i:i + 2] for i in range(2, len(machine.requests), 2)]
    assert pairs == [["reference", "candidate"], ["candidate", "reference"]] * 5  # before, after, in turn
    assert len(calls.paired_eager) == len(calls.times) == 10
    eager, candidate = summarize_times(calls.paired_eager), summarize_times(calls.times)
    assert eager["median_us"] / candidate["median_us"] == 1.0
    assert 100.0 / candidate["median_us"] < 0.7  # the fast machine's eager time against these calls


def _times(candidate: float, eager: float, compile_us: float | None, errors: tuple) -> dict:
    names = ("candidate", "eager", "compile")
    values = (candidate, eager, compile_us)
    return {n: {"median_us": v, "median_rel_se": e} for n, v, e in zip(names, values, errors) if v is not None}


def test_the_reward_imprecise_times_cannot_have_made():
    """Hand-computed on the log scale: margin 5 % (ln 1.05 = 0.049), three standard errors of each pair."""
    from evaluator_cuda.timing.stability import reward_noise_cannot_make as cap

    # maxpool2d's host solution: eager 163.3 ms, candidate 33.3 ms, errors 9.3 % and 3 %: ln 4.90 - 0.049 =
    # 1.54 > 3 x 0.098; compile 28.5 ms at 2 %: ln 0.855 - 0.049 = -0.205, within 3 x 0.095 = 0.285
    assert cap(_times(33330, 163265, 28510, (0.093, 0.030, 0.02)), 0.05) == 2
    # the same against a compile time of 120 ms: clearly faster than both, the medians decide
    assert cap(_times(33330, 163265, 120000, (0.093, 0.030, 0.02)), 0.05) == 3
    # ... and of 10 ms: clearly slower than compile, the medians decide (reward 2)
    assert cap(_times(33330, 163265, 10000, (0.093, 0.030, 0.02)), 0.05) == 3
    # the unchanged reference at 1.15x with 3 % errors: 0.140 - 0.049 = 0.091 < 3 x 0.042 = 0.127
    assert cap(_times(1000, 1150, None, (0.03, 0.03, None)), 0.05) == 1
    # clearly slower than eager: nothing to withhold, the instability stays on the record
    assert cap(_times(2000, 1000, None, (0.09, 0.09, None)), 0.05) == 1


def test_imprecise_times_withhold_only_the_reward_the_noise_could_have_made():
    """The same imprecise times (above the 2.5 % bound) earn reward 2 at 4.9x eager (against compile the
    noise decides) and 3 at 4.9x eager and 3.6x compile; at 1.15x eager they earn no speed-up."""
    from types import SimpleNamespace

    from evaluator_cuda.gpu_work import withhold_unbelievable_times
    from evaluator_cuda.verdict.record import finish, new_record

    settings = EvalSettings.for_backend("host", profile=True, margin=PAPER_MARGIN)  # the figures are for 5 %
    calls = SimpleNamespace(outside=[], walls=[], times=[], timed_positions=[])
    records = []
    for eager, compiled in ((163265, 28510), (163265, 120000), (38330, 28510)):
        record = new_record("task", "candidate", "workspace", settings)
        record["times_us"].update(_times(33330, eager, compiled, (0.093, 0.030, 0.02)))
        withhold_unbelievable_times(calls, None, settings, record)
        records.append(finish(record, "correct"))
    assert [r["reward"] for r in records] == [2, 3, 1]
    assert all(r["noise_outweighed"].startswith("timing unstable") for r in records[:2])
    assert not records[0].get("speedup_withheld") and records[0]["reward_cap"] == 2
    assert records[2]["speedup_withheld"][0].startswith("timing unstable")


@pytest.mark.parametrize("sizes, expected_mib", [
    ({"index0": "32K", "index2": "1024K", "index3": "32768K"}, 64),  # twice a 32 MiB last-level cache
    ({"index0": "48K", "index3": "1G"}, 256),                         # at most 256 MiB
    ({"index0": "32K", "index2": "1024K"}, 8),                        # at least 8 MiB
    ({}, 64),                                                         # nothing readable: 64 MiB
])
def test_the_host_flush_is_twice_the_last_level_cache(tmp_path, sizes, expected_mib):

    for index, size in sizes.items():
        (tmp_path / index).mkdir()
        (tmp_path / index / "size").write_text(size + "\n")
    assert host_cache_flush_bytes(str(tmp_path)) == expected_mib << 20


def test_host_baselines_and_candidate_calls_flush_the_same_bytes_before_each_call():
    """Both children zero the settings' buffer before every timed call: the baselines' requests carry
    its size, and a host evaluation's settings have one (twice the last-level cache)."""
    from evaluator_cuda.timing import host_baselines
    from evaluator_cuda.timing.profile import flush_buffer

    settings = EvalSettings.for_backend("host", repeats=3, warmup=1)
    assert settings.l2_flush_bytes == host_cache_flush_bytes() > 0
    sent = []

    class Reference:  # answers each time_call request as the reference child does
        def request(self, message, timeout, tensor_meta=None):
            sent.append(message)
            return {"ok": True, "time_us": 10.0}

    host_baselines.host_eager_sample(Reference(), settings)
    assert len(sent) == 4 and all(m["l2_flush_bytes"] == settings.l2_flush_bytes for m in sent)
    buffer = flush_buffer(settings.l2_flush_bytes, "cpu")
    assert buffer.device.type == "cpu" and buffer.numel() * buffer.element_size() == settings.l2_flush_bytes
    assert flush_buffer(0, "cpu") is None


def test_further_rounds_are_planned_on_new_sets_with_a_secret_sample_checked():
    steady, noisy = [100.0] * 10, [50.0, 150.0] * 5
    assert less_precise_than({"candidate": noisy, "eager": steady, "none": []}, 0.025) == ["candidate"]
    assert less_precise_than({"candidate": [100.0]}, 0.025) == ["candidate"]  # one sample: cannot be told
    assert fresh_sets_left(7, 1024, 10 * 1024) == 3 and fresh_sets_left(12, 1024, 10 * 1024) == 0
    calls, sampled = plan_round(5, 3, first_set=7)
    assert calls == [("timed", 7), ("timed", 8), ("timed", 9), ("timed", 10), ("timed", 11)]
    assert len(sampled) == 3 and sampled <= set(range(5))
    assert len({frozenset(plan_round(5, 2, 0)[1]) for _ in range(40)}) > 1  # not the same sample every time


# Every other call of this binding spins for a while (a bimodal time no number of calls makes precise);
# with WRONG_AFTER set, every call after that many gives a wrong first element.
NOISY_BODY = """
static long calls = 0;
++calls;
for (volatile long i = 0; i < (calls % 2 ? 2000000 : 0); ++i) {}
if (calls > WRONG_AFTER) out.data_ptr<float>()[0] += 1.0f;
"""


def test_imprecise_candidate_times_get_further_rounds_within_the_budget(build_cache):
    settings = dict(profile=True, repeats=5, warmup=1)
    honest = workspace(binding_body=NOISY_BODY.replace("WRONG_AFTER", str(10**9)))
    without = evaluate(AXPY_TASK, honest, host(build_cache, **settings, timing_rounds_budget_s=0.0))
    assert without["status"] == "correct", without["message"]
    base_times = without["times_us"]["candidate"]["n"]
    assert "timing_rounds" not in without and base_times == without["checks"] + settings["repeats"]
    record = evaluate(AXPY_TASK, honest, host(build_cache, **settings, timing_rounds_budget_s=1.0))
    assert record["status"] == "correct", record["message"]
    rounds = record["timing_rounds"]
    assert rounds["extra_rounds"] >= 1 and rounds["extra_calls"] == 5 * rounds["extra_rounds"]
    assert record["times_us"]["candidate"]["n"] == base_times + rounds["extra_calls"]
    assert record["times_us"]["eager"]["n"] == record["times_us"]["candidate"]["n"]  # each call paired
    assert len(record["seeds"]["timed"]) == settings["warmup"] + settings["repeats"] + rounds["extra_calls"]
    assert rounds["seconds"] < 1.0 + 5.0  # the budget is checked before each round; a round is 5 calls


def test_wrong_outputs_in_the_further_rounds_are_caught(build_cache):
    """A candidate right in every call of the schedule and wrong in every later one: each further
    round checks a secret sample of its outputs."""
    settings = host(build_cache, profile=True, repeats=5, warmup=1, timing_rounds_budget_s=1.0)
    base_calls = settings.checks + settings.warmup + settings.repeats
    cheat = workspace(binding_body=NOISY_BODY.replace("WRONG_AFTER", str(base_calls)))
    record = evaluate(AXPY_TASK, cheat, settings)
    assert record["status"] == "incorrect" and record["reward"] == -1, record["message"]
    assert record["message"].startswith("output of a timed call") and record["timing_rounds"]["extra_rounds"] == 0
    wrong = evaluate(AXPY_TASK, workspace("-"), settings)  # wrong from the start: judged before any round
    assert wrong["status"] == "incorrect" and "timing_rounds" not in wrong


def test_each_baseline_call_is_prepared_as_a_candidate_call_is(monkeypatch):
    """Every eager or compile baseline call, warm-up included, gets fresh copies of the inputs and the
    freed blocks of the last output's size poisoned before it, as each candidate call does."""
    import torch

    from evaluator_cuda.roles.reference import CandidateLikeCalls
    from evaluator_cuda.timing import profile

    inputs = [torch.arange(6.0), 3]
    seen, poisoned = [], []

    def model(x, k):
        seen.append((x.data_ptr(), x.clone(), k))
        return x * k

    calls = CandidateLikeCalls(model, inputs, "cpu")
    monkeypatch.setattr(profile, "poison_allocator",
                        lambda sizes, parity, device: poisoned.append((list(sizes), parity)))
    samples, out = profile.time_forward(calls, warmup=2, repeats=3, device_type="cpu", prepare=calls.prepare)
    assert len(samples) == 3 and len(seen) == 5 and torch.equal(out, inputs[0] * 3)
    assert all(ptr != inputs[0].data_ptr() and torch.equal(x, inputs[0]) and k == 3 for ptr, x, k in seen)
    assert poisoned == [([], 0)] + [([6 * 4], p % 2) for p in range(1, 5)]  # the output's bytes from the first call on
    assert baseline_protocol(host(".")).get("calls") == "prepared_as_candidate_one_output_block"  # old cached baselines are not reused


def test_a_baseline_call_frees_the_last_copies_before_making_new_ones(monkeypatch):
    """As in the candidate child, whose call's copies end with the call: a baseline that made its new copies
    while the last ones were alive would swap two blocks call by call (two placements the candidate never
    sees)."""
    import torch

    from evaluator_cuda.roles.reference import CandidateLikeCalls

    calls = CandidateLikeCalls(lambda x: x * 2.0, [torch.randn(64)], "cpu")
    alive_while_copying = []
    clone = torch.Tensor.clone

    def watched_clone(tensor, *args, **kwargs):
        alive_while_copying.append(len(calls.args))
        return clone(tensor, *args, **kwargs)

    calls.prepare(0)
    calls()
    monkeypatch.setattr(torch.Tensor, "clone", watched_clone)
    calls.prepare(1)
    monkeypatch.undo()
    assert alive_while_copying == [0] and calls.output is None
    assert torch.equal(calls(), calls.inputs[0] * 2.0)


def test_the_timing_loop_frees_each_output_before_the_next_preparation():
    """As a candidate child's call frees its output (a local of the call): an output held through the next
    call would make the outputs take two blocks in turn, two placements the candidate's calls never see."""
    import weakref

    import torch

    from evaluator_cuda.timing.profile import time_forward

    made, alive_at_prepare = [], []

    def call():
        out = torch.randn(64)
        made.append(weakref.ref(out))
        return out

    def prepare(position):
        alive_at_prepare.append(sum(ref() is not None for ref in made))

    samples, last = time_forward(call, warmup=2, repeats=3, device_type="cpu", prepare=prepare)
    assert alive_at_prepare == [0] * 5 and len(samples) == 3
    assert last is made[-1]() and last is not None  # the last output is still returned
