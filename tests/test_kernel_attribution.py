"""The kernel trace's bookkeeping and the attribution of GPU work, on hand-made traces: which
activity belongs to which call and which operator launched it, whose work it is, and when the
times are not believed. (The GPU side of the trace needs a GPU: scripts/check_hardening_gpu.py.)"""

import contextlib
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from evaluator_cuda.timing.kernel_trace import RANGE_PREFIX, summarize
from evaluator_cuda.verdict.attribution import (attribution_problem, classify, is_own_kernel, kernel_base_name,
                                                span_disagreement)
from evaluator_cuda.verdict.record import finish


@dataclass
class Event:
    """What torch's kineto events answer, for the fields the trace reads."""
    label: str
    gpu: bool
    corr: int
    start: int
    end: int
    thread: int = 1

    def name(self): return self.label
    def device_type(self): return "DeviceType.CUDA" if self.gpu else "DeviceType.CPU"
    def correlation_id(self): return self.corr
    def start_ns(self): return self.start
    def end_ns(self): return self.end
    def start_thread_id(self): return self.thread


OWN = "(anonymous namespace)::axpy_kernel(float const*, float*, int)"
GEMM = "sm90_xmma_gemm_f32f32_tn_n_tilesize64x64x8"
FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >(int, float)"
SYMBOLS = "000000000001bf00 t __device_stub__ZN50_GLOBAL__N__e82054c3_4_axpy_cu_7e47f4ee11axpy_kernelEPKfPfi\n"


def _trace_events():
    """Call 0 (CPU 1000-2000): a fill under aten::zeros, the own kernel, a gemm under aten::mm.
    Between the calls the harness's flush (aten::zero_ at 2500, outside every call). Call 1
    (3000-4000): the own kernel only. GPU timestamps are on their own axis (from 100000)."""
    return [
        Event(RANGE_PREFIX + "0", False, 1, 1000, 2000),
        Event("aten::zeros", False, 2, 1100, 1300),
        Event("aten::fill_", False, 3, 1150, 1290),
        Event("cudaLaunchKernel", False, 50, 1200, 1210),
        Event("cudaLaunchKernel", False, 51, 1400, 1410),
        Event("aten::mm", False, 4, 1500, 1900),
        Event("cudaLaunchKernelExC", False, 52, 1600, 1610),
        Event("aten::zero_", False, 5, 2500, 2600),
        Event("cudaLaunchKernel", False, 53, 2550, 2560),
        Event(RANGE_PREFIX + "1", False, 6, 3000, 4000),
        Event("cudaLaunchKernel", False, 54, 3100, 3110),
        Event(FILL, True, 50, 100_000, 101_000),
        Event(OWN, True, 51, 101_000, 111_000),
        Event(GEMM, True, 52, 111_000, 141_000),
        Event(FILL, True, 53, 150_000, 151_000),
        Event(OWN, True, 54, 200_000, 210_000),
        Event(OWN, True, 99, 300_000, 301_000),  # no launch record
    ]


def test_each_activity_goes_to_the_call_that_launched_it_with_its_innermost_operator():
    trace = summarize(_trace_events())
    assert trace["unlaunched"] == 1
    assert set(trace["calls"]) == {"0", "1"}  # the flush between the calls belongs to none
    first = {(name, op): (count, total) for name, kind, op, count, total in trace["calls"]["0"]["items"]}
    assert first == {(FILL, "aten::fill_"): (1, 1.0), (OWN, None): (1, 10.0), (GEMM, "aten::mm"): (1, 30.0)}
    assert trace["calls"]["0"]["span_us"] == 41.0  # 100000 -> 141000 ns
    assert trace["calls"]["1"] == {"span_us": 10.0, "items": [[OWN, "kernel", None, 1, 10.0]], "truncated": False}


def test_kernel_names_reduce_to_their_identifier():
    assert kernel_base_name(OWN) == "axpy_kernel"
    assert kernel_base_name("void row_norm<false, 4>(float const*, float*, int)") == "row_norm"
    assert kernel_base_name(FILL) == "vectorized_elementwise_kernel"
    assert kernel_base_name(GEMM) == GEMM


def test_a_kernel_is_the_candidates_own_only_when_its_extension_defines_it():
    assert is_own_kernel(OWN, SYMBOLS)
    assert not is_own_kernel(GEMM, SYMBOLS)
    assert not is_own_kernel("void kernel<1>(int)", SYMBOLS)  # a suffix of axpy_kernel is not the name
    assert is_own_kernel("plain_kernel", "0000000000001000 t plain_kernel\n")  # extern "C"
    # the H200's elementwise_chain example: its anonymous namespace's name ends in a digit
    chain = ("0000 t __device_stub__ZN50_GLOBAL__N__7d1c2a45_20_elementwise_chain_cu_3f9a1245"
             "29elementwise_chain_vec4_kernelEPK6float4\n")
    assert is_own_kernel("(anonymous namespace)::elementwise_chain_vec4_kernel(float4 const*)", chain)
    assert is_own_kernel(GEMM, None)  # no symbol table: only the launching operator decides


def test_compute_launched_by_a_torch_operator_is_foreign_and_named():
    summary = classify(summarize(_trace_events()), SYMBOLS)
    assert summary["own_us"] == 20.0 and summary["data_us"] == 1.0
    assert summary["foreign"] == [f"{GEMM} (launched by aten::mm)"]
    reason, message = attribution_problem(summary, 0.5, calls_expected=2)
    assert reason == "foreign_kernels" and GEMM in message


def test_a_library_kernel_launched_from_the_extension_is_foreign():
    events = [Event(RANGE_PREFIX + "0", False, 1, 0, 100), Event("cudaLaunchKernel", False, 7, 10, 20),
              Event(GEMM, True, 7, 1000, 2000)]
    summary = classify(summarize(events), SYMBOLS)
    assert summary["foreign"] == [f"{GEMM} (not built by the extension)"]


def test_own_work_passes_and_data_movement_is_bounded():
    own = {"calls": {"0": {"span_us": 12.0, "items": [[OWN, "kernel", None, 1, 10.0],
                                                     ["Memset (Device)", "memset", None, 1, 2.0]]}}}
    assert attribution_problem(classify(own, SYMBOLS), 0.5, calls_expected=1) is None
    copies = {"calls": {"0": {"span_us": 12.0, "items": [[OWN, "kernel", None, 1, 1.0],
                                                        ["Memcpy DtoD (Device -> Device)", "memcpy", None, 1, 9.0]]}}}
    assert attribution_problem(classify(copies, SYMBOLS), 0.5, calls_expected=1)[0] == "data_movement"
    nothing = {"calls": {"0": {"span_us": 2.0, "items": [[FILL, "kernel", "aten::fill_", 1, 2.0]]}}}
    assert attribution_problem(classify(nothing, SYMBOLS), 0.9, calls_expected=1)[0] == "no_own_kernel"


def test_times_are_not_believed_when_the_gpu_work_outspans_the_events():
    # median span 100 µs against median event time 10 µs: work ran after the end event
    assert "outside the timed window" in span_disagreement([100.0, 100.0, 90.0], [10.0, 11.0, 9.0], 0.10, 5.0)
    # honest: the work fits inside the events (span 20 vs 21 µs; 27 <= 21 * 1.1 + 5 also passes)
    assert span_disagreement([20.0, 20.0, 20.0], [21.0, 21.0, 21.0], 0.10, 5.0) is None
    assert span_disagreement([27.0] * 3, [21.0] * 3, 0.10, 5.0) is None
    assert span_disagreement([28.2] * 3, [21.0] * 3, 0.10, 5.0) is not None


def _correct_record(withheld=None):
    record = {"status": None, "message": "", "diagnostics": [], "reward": None, "margin": 0.05,
              "speedup": {}, "times_us": {"candidate": {"median_us": 10.0}, "eager": {"median_us": 50.0},
                                          "compile": {"median_us": 40.0}}}
    if withheld:
        record["speedup_withheld"] = withheld
    return finish(record, "correct")


def test_withheld_times_earn_no_speed_up_reward():
    assert _correct_record()["reward"] == 3
    record = _correct_record(["the GPU work spanned longer than the events"])
    assert record["reward"] == 1 and record["speedup"]["eager"] == 5.0


def test_the_trace_switch_reaches_a_jailed_candidate_and_the_parents_environment_does_not():
    """A jailed child's environment is fixed: the switch that starts the trace before candidate code
    loads must be among what is kept (without it, every cuda evaluation had no trace)."""
    from evaluator_cuda.isolation import sandbox
    from evaluator_cuda.timing.kernel_trace import TRACE_ENV

    spec = sandbox._jail_spec({"enabled": True}, {TRACE_ENV: "1", "SECRET_TOKEN": "x"}, (), None)
    assert spec.env.get(TRACE_ENV) == "1" and "SECRET_TOKEN" not in spec.env


def test_the_trace_crosses_the_childs_channel():
    """The report goes over the wire (JSON header, no pickle): string keys, plain values only."""
    from evaluator_cuda.isolation.wire import decode_value, encode_value

    trace = summarize(_trace_events())
    blobs: list = []
    assert decode_value(encode_value({"trace": trace}, blobs), blobs)["trace"] == trace


def test_the_self_check_runs_untraced_and_a_candidate_stays_traced(tmp_path, monkeypatch):
    """The trace is started before the load request says what loads; for the task's own Model (the harness
    self-check) the candidate role stops it, for candidate code it keeps running."""
    from evaluator_cuda.roles.candidate import CandidateRole
    from evaluator_cuda.timing import kernel_trace

    source = (Path(__file__).resolve().parents[1] / "examples" / "tasks" / "row_l2_norm.py").read_text()
    monkeypatch.setattr(sys, "path", list(sys.path))  # the role puts the solution folder on the path
    warnings.filterwarnings("ignore", "CUDA is not available")  # this machine's torch may lack CUDA: CPU trace only
    try:
        for fmt, traced in (("reference", False), ("workspace", True)):
            kernel_trace.start_trace()
            assert kernel_trace.active()
            role = CandidateRole()
            request = {"device": "cpu", "block_torch": False, "solution_dir": str(tmp_path), "format": fmt,
                       "entry": "model_new.py", "task_name": "row_l2_norm", "task_source": source}
            (tmp_path / "model_new.py").write_text("import torch\nclass ModelNew(torch.nn.Module):\n    pass\n")
            role.do_load(request)
            assert kernel_trace.active() is traced
            assert isinstance(kernel_trace.call_range(0), contextlib.nullcontext) is not traced
    finally:
        kernel_trace.discard_trace()
        sys.modules.pop("model_new", None)
    assert kernel_trace.collect()["error"] == "the trace was not started"


class _ReplyingWith:
    """A candidate child that answers the trace request with `answer`."""

    def __init__(self, answer: dict):
        self.answer = answer

    def request(self, message, timeout, tensor_meta=None):
        assert message == {"cmd": "kernel_trace"}
        return self.answer


@pytest.mark.parametrize("trace, message", [
    ({"error": "CUPTI said no"}, "the kernel trace in the candidate's process failed: CUPTI said no"),
    (["not", "a", "mapping"], "malformed kernel trace: TypeError"),
    ({"calls": {"0": {"items": [["kernel", "kernel"]]}}}, "malformed kernel trace: ValueError"),
    ({"calls": "everything"}, "malformed kernel trace: AttributeError"),
])
def test_a_trace_the_candidate_process_breaks_or_fails_is_its_runtime_error(trace, message):
    """The trace is collected in the candidate's process: a failed or malformed one is that process's doing
    (docs/cheats.md #25), a runtime_error, never an infra_error that would take the episode out of training."""
    from evaluator_cuda.gpu_work import attribute_kernels
    from evaluator_cuda.settings import EvalSettings
    from evaluator_cuda.solutions import Solution
    from evaluator_cuda.verdict.fault import Verdict

    solution = Solution("workspace", {"model_new.py": b""}, "model_new.py", "axpy")
    with pytest.raises(Verdict) as raised:
        attribute_kernels(_ReplyingWith({"ok": True, "trace": trace}), solution, None, EvalSettings.for_backend("cuda"), {})
    assert raised.value.status == "runtime_error" and message in raised.value.message, raised.value.message


@pytest.mark.parametrize("solution_format, traced",
                         [("reference", False), ("workspace", True), ("kernelbench", True)])
def test_a_self_checks_children_start_untraced_and_a_candidates_traced(monkeypatch, solution_format, traced):
    """The switch that starts the trace is in the environment the evaluation's children are started with;
    a self-check's pair never starts it, so its calls are timed as the baselines' are."""
    from evaluator_cuda import evaluation
    from evaluator_cuda.settings import EvalSettings
    from evaluator_cuda.solutions import Solution
    from evaluator_cuda.tasks import load_tasks
    from evaluator_cuda.timing.kernel_trace import TRACE_ENV

    started_with = []

    def take(env, guard, device_type):
        started_with.append(dict(env))
        raise RuntimeError("no children in this test")

    monkeypatch.setattr(evaluation._STANDBY, "take", take)
    task = load_tasks(Path(__file__).resolve().parents[1] / "examples" / "tasks" / "row_l2_norm.py").tasks[0]
    solution = Solution(solution_format, {}, "", "row_l2_norm")
    for backend, trace_expected in (("cuda", traced), ("host", False)):
        record = evaluation.evaluate(task, solution, EvalSettings.for_backend(backend))
        assert record["status"] == "infra_error" and "no children in this test" in record["message"]
        assert (started_with.pop().get(TRACE_ENV) == "1") is trace_expected


def test_the_trace_order_setting_reaches_the_childs_environment():
    from evaluator_cuda.gpu_work import trace_env
    from evaluator_cuda.settings import EvalSettings
    from evaluator_cuda.timing.kernel_trace import TRACE_BEFORE_CONTEXT, TRACE_ENV

    after = EvalSettings.for_backend("cuda")
    before = EvalSettings.for_backend("cuda", kernel_trace_start="before_context")
    assert trace_env(after, "workspace") == {TRACE_ENV: "1"}
    assert trace_env(before, "workspace") == {TRACE_ENV: TRACE_BEFORE_CONTEXT}
    assert trace_env(before, "reference") == {} and trace_env(EvalSettings.for_backend("host"), "workspace") == {}
    with pytest.raises(ValueError, match="kernel_trace_start must be one of after_context, before_context"):
        EvalSettings.for_backend("cuda", kernel_trace_start="later")


@pytest.mark.cuda
@pytest.mark.parametrize("order", ["before_context", "after_context"])
def test_cuda_a_trace_started_either_side_of_the_context_sees_the_candidates_kernels(order):
    """The honest example is correct (with torch compute refused, a trace without its kernels would be a
    no_own_kernel rejection), its own kernels are counted, and the start marks follow the order."""
    from evaluator_cuda.evaluation import evaluate
    from evaluator_cuda.settings import EvalSettings
    from evaluator_helpers import example

    task, solution = example("row_l2_norm")
    record = evaluate(task, solution, EvalSettings.for_backend("cuda", profile=False, kernel_trace_start=order))
    assert record["status"] == "correct", record["message"]
    assert record["kernels"]["own_kernels"] and not record["kernels"]["foreign"], record["kernels"]
    marks = record["children_start_s"]["candidate"]
    assert (marks["trace"] < marks["warm"]) is (order == "before_context"), marks
