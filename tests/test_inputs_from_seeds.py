"""Input sets made from seeds in the candidate child (settings.inputs_from_seeds): the same bits as the
reference child's, no input bytes sent, a fresh set for every call, the sets sent instead when the task's
get_inputs is not reproducible, and a candidate that meddles with the making found wrong."""

import textwrap

import pytest
import torch

from evaluator_cuda.evaluation import evaluate
from evaluator_cuda.roles.inputs import inputs_from_seed, same_inputs
from evaluator_cuda.solutions import reference_solution
from evaluator_cuda.tasks import Task, exec_task
from evaluator_cuda.verdict.schedule import CallRequests, call_schedule

from evaluator_helpers import AXPY_TASK, build_cache, example, host, model_new_with, workspace  # noqa: F401  (fixture)

UNSEEDED_TASK = Task(name="unseeded_axpy", source=AXPY_TASK.source.replace(
    "return [torch.randn(4096), torch.randn(4096)]",
    "import random\n    return [torch.randn(4096) + random.random(), torch.randn(4096)]"))


def test_a_set_made_from_a_seed_is_the_same_in_a_fresh_run_of_the_source():
    first = exec_task("axpy", AXPY_TASK.source, module_name="seed_test_a")["get_inputs"]
    again = exec_task("axpy", AXPY_TASK.source, module_name="seed_test_b")["get_inputs"]
    made = inputs_from_seed("axpy", first, 1234, on_device=False)
    torch.manual_seed(1234)  # what the reference did before: seed, then the task's own factory calls
    expected = [torch.randn(4096), torch.randn(4096)]
    assert all(torch.equal(m, e) for m, e in zip(made, expected))
    assert same_inputs(made, inputs_from_seed("axpy", again, 1234, on_device=False))
    assert not same_inputs(made, inputs_from_seed("axpy", again, 1235, on_device=False))


def test_same_inputs_compares_bits():
    nan = torch.tensor([float("nan"), 1.0])
    assert same_inputs([nan, 3], [nan.clone(), 3])
    assert not same_inputs([torch.tensor([0.0])], [torch.tensor([-0.0])])  # equal values, other bits
    assert not same_inputs([torch.zeros(2)], [torch.zeros(2, dtype=torch.float64)])
    assert not same_inputs([torch.zeros(2), 3], [torch.zeros(2), 4])
    assert not same_inputs([torch.zeros(2)], [torch.zeros(2), 1])


def test_calls_by_seed_carry_no_input_bytes():
    schedule, _ = call_schedule(3, 6, 6, 2)
    seeds = {"check": [11, 12, 13], "timed": [21, 22, 23, 24, 25, 26]}
    requests = CallRequests(schedule, [["check bytes"]] * 3, [["timed bytes"]] * 6, 0, seeds=seeds,
                            generated_on="cpu")
    messages = [requests.request(k, call) for k, call in enumerate(schedule)]
    assert not requests.keep_sets
    assert all("inputs" not in m and "set" not in m and "keep_as" not in m for m in messages)
    assert [m["seed"] for m in messages] == [seeds[kind][index] for kind, index in schedule]
    assert {m["generated_on"] for m in messages} == {"cpu"}


def test_made_sets_are_fresh_for_every_call_where_sent_sets_rotate(build_cache):
    budget = {"profile": True, "fresh_input_bytes": 3 * 2 * 4096 * 4}  # three sets' bytes
    settings = host(build_cache, **budget)
    made = evaluate(AXPY_TASK, workspace("+"), settings)
    sent = evaluate(AXPY_TASK, workspace("+"), host(build_cache, inputs_from_seeds=False, **budget))
    assert made["status"] == sent["status"] == "correct", (made["message"], sent["message"])
    assert made["inputs_by_seed"] and not sent["inputs_by_seed"]
    timed_calls = settings.warmup + settings.repeats
    assert made["fresh_inputs_per_call"] and len(set(made["seeds"]["timed"])) == timed_calls
    assert not sent["fresh_inputs_per_call"] and len(sent["seeds"]["timed"]) == 3


def test_a_task_whose_inputs_are_not_reproducible_has_its_sets_sent(build_cache):
    record = evaluate(UNSEEDED_TASK, reference_solution(UNSEEDED_TASK.stem), host(build_cache))
    assert record["status"] == "correct", record["message"]
    assert record["inputs_by_seed"] is False
    assert "same set twice" in record["inputs_sent_because"]


def test_a_candidate_that_meddles_with_the_making_of_its_inputs_is_incorrect(build_cache):
    forward = "return cuda_extension.axpy_forward(x, y, float(self.alpha))"
    meddling = model_new_with(forward, prelude=textwrap.dedent("""
        torch.manual_seed = lambda seed: None  # every set made from the generator's running state
    """))
    record = evaluate(AXPY_TASK, workspace("+", model_new=meddling), host(build_cache, static_checks=False))
    assert record["inputs_by_seed"]
    assert record["status"] == "incorrect" and record["reward"] == -1, record["message"]
    honest = evaluate(AXPY_TASK, workspace("+", model_new=model_new_with(forward)),
                      host(build_cache, static_checks=False))
    assert honest["status"] == "correct", honest["message"]


def test_a_candidate_that_breaks_the_making_of_its_inputs_is_a_runtime_error(build_cache):
    forward = "return cuda_extension.axpy_forward(x, y, float(self.alpha))"
    breaking = model_new_with(forward, prelude="torch.manual_seed = None  # the harness's call to it raises\n")
    record = evaluate(AXPY_TASK, workspace("+", model_new=breaking), host(build_cache, static_checks=False))
    assert record["status"] == "runtime_error" and record["reward"] == -1, record["message"]
    assert "making the call's inputs from its seed raised TypeError" in record["message"]


# --- on the GPU (scripts/gpu_check.sh runs these) ---------------------------------------------------------

DEVICE_FAILING_TASK = Task(name="host_made_axpy", source=AXPY_TASK.source.replace(
    "return [torch.randn(4096), torch.randn(4096)]",
    "x = torch.randn(4096)\n    return [x, torch.from_numpy(x.numpy() * 0.5)]  # .numpy() fails on the device"))


def test_baseline_calls_make_a_fresh_set_each_when_asked_and_free_the_last_one_first():
    """CandidateLikeCalls with make_inputs: each prepare makes a new set (the last one released before),
    and the call gets clones of it, as the candidate child's call does."""
    import gc
    import weakref

    import torch

    from evaluator_cuda.roles.reference import CandidateLikeCalls

    made, alive_at_make = [], []

    def make():
        gc.collect()
        alive_at_make.append(sum(ref() is not None for ref in made))
        values = [torch.randn(8, generator=torch.Generator().manual_seed(len(made)))]
        made.append(weakref.ref(values[0]))
        return values

    calls = CandidateLikeCalls(lambda x: x * 2, [torch.zeros(8)], "cpu", make_inputs=make)
    outputs = []
    for position in range(3):
        calls.prepare(position)
        assert calls.args[0] is not calls.inputs[0] and torch.equal(calls.args[0], calls.inputs[0])
        outputs.append(calls().clone())
    assert len(made) == 3 and alive_at_make == [0, 0, 0]  # the previous set was gone before each new one
    assert not torch.equal(outputs[0], outputs[1])  # each call its own set
    fixed = CandidateLikeCalls(lambda x: x * 2, [torch.ones(8)], "cpu")
    fixed.prepare(0)
    assert torch.equal(fixed(), torch.full((8,), 2.0))


def test_the_baseline_protocol_makes_sets_per_call_only_on_cuda_with_sets_made_from_seeds():
    """The protocol (and so the cache key) says so: on cuda when the candidate child makes its sets,
    the baseline loop does too; not on the host, not without sets by seed, not timed per request."""
    from evaluator_cuda.roles.errors import HandlerError
    from evaluator_cuda.roles.reference import ReferenceRole
    from evaluator_cuda.settings import EvalSettings
    from evaluator_cuda.timing.stability import baseline_protocol

    cuda = EvalSettings.for_backend("cuda")
    assert baseline_protocol(cuda, True)["inputs"] == "made_per_call"
    assert "inputs" not in baseline_protocol(cuda, False) and "inputs" not in baseline_protocol(cuda)
    assert "inputs" not in baseline_protocol(EvalSettings.for_backend("host"), True)
    assert "inputs" not in baseline_protocol(EvalSettings.for_backend("cuda", baselines_per_request=True), True)
    role = ReferenceRole()
    assert role._fresh_set_maker({}) is None
    with pytest.raises(HandlerError, match="not made from seeds"):
        role._fresh_set_maker({"inputs": "made_per_call"})


@pytest.mark.cuda
def test_cuda_baselines_on_sets_made_per_call_give_the_honest_example_its_verdict():
    """Profiled, with the sets made from seeds: the baselines' calls make theirs per call too."""
    from evaluator_cuda.settings import EvalSettings

    task, solution = example("row_l2_norm")
    record = evaluate(task, solution, EvalSettings.for_backend("cuda", profile=True))
    assert record["status"] == "correct", record["message"]
    assert record["inputs_by_seed"] and record["baseline_inputs"] == "made_per_call"
    assert record["speedup"]["eager"] > 0 and record["reward"] >= 1


@pytest.mark.cuda
def test_cuda_sets_made_on_the_device_give_the_honest_example_its_verdict():
    """The 64 MiB layernorm example: every set made on the GPU in the candidate child from its seed, none sent."""
    from evaluator_cuda.settings import EvalSettings

    task, solution = example("layernorm")
    record = evaluate(task, solution, EvalSettings.for_backend("cuda", profile=False))
    assert record["status"] == "correct", record["message"]
    assert record["inputs_by_seed"] and record["inputs_generated_on"] == "cuda"


@pytest.mark.cuda
def test_cuda_a_task_whose_sets_cannot_be_made_on_the_device_has_them_sent():
    """get_inputs() fails under torch.device("cuda"): the reference child makes its sets on the host, and
    sends them rather than have the candidate child make them elsewhere."""
    from evaluator_cuda.settings import EvalSettings

    record = evaluate(DEVICE_FAILING_TASK, reference_solution(DEVICE_FAILING_TASK.stem),
                      EvalSettings.for_backend("cuda", profile=False))
    assert record["status"] == "correct", record["message"]
    assert record["inputs_generated_on"] == "cpu" and record["inputs_by_seed"] is False
    assert "failed on the device" in record["inputs_sent_because"]
