"""One planted cheat per class of docs/cheats.md (1-20), each shown rejected (status incorrect, a
named `rejected` reason where there is one, reward -1) or shown to have no effect, plus honest
controls that still pass. Host backend (C++ kernels on the CPU through the fast build) or
KernelBench-style files, so CI runs them; CUDA-only forms are marked `cuda`."""

import os
import socket
import textwrap
import time

import pytest

from evaluator_cuda.evaluation import evaluate
from evaluator_cuda.isolation.sandbox import network_namespace_prefix
from evaluator_cuda.solutions import Solution, reference_solution
from evaluator_cuda.tasks import Task
from evaluator_helpers import AXPY_TASK, L2_KERNEL, STREAM_KERNEL, build_cache, host, kernel_with, kernelbench, model_new_with, workspace  # noqa: F401

HONEST_CALL = "return cuda_extension.axpy_forward(x, y, float(self.alpha))"


def rejected(record: dict, reason: str | None = None, needle: str | None = None) -> None:
    assert record["status"] == "incorrect", (record["status"], record["message"])
    assert record["reward"] == -1
    if reason:
        assert record.get("rejected") == reason, record["message"]
    if needle:
        assert needle in record["message"], record["message"]


def task_like_axpy(name: str, expression: str) -> Task:
    return Task(name=name, source=AXPY_TASK.source.replace("return self.alpha * x + y", f"return {expression}"))


# --- honest controls --------------------------------------------------------------------------


def test_honest_workspace_profiled_is_correct_and_unflagged(build_cache):
    record = evaluate(AXPY_TASK, workspace("+"), host(build_cache, profile=True))
    assert record["status"] == "correct", record["message"]
    assert record["reward"] in (1, 2, 3)
    extra = record.get("timing_rounds", {}).get("extra_calls", 0)  # further rounds while the median is imprecise
    checked = record["checked_calls"]
    assert checked["checks"] == 5 and checked["calls"] == 12 + extra and checked["timed"] >= 4  # 5 checks + 2 warm-up + 5 timed
    assert record["fresh_inputs_per_call"] is True and len(set(record["seeds"]["timed"])) == 7 + extra
    assert record["precision"]["downgrade_suspected"] is False and record["precision"]["relative_error"] < 1e-6
    assert record["sol_violation"] is False
    # bytes bound by hand: x, y and out are 4096 float32 each, read/written once at 4.3 TB/s
    assert record["sol_bound_us"] == pytest.approx(3 * 4096 * 4 / 4.3e12 * 1e6)
    assert record["sandbox"]["process_group"] is True


# --- 1, 14: output memory reuse, uninitialised memory ----------------------------------------


def test_1_14_output_left_unwritten_is_incorrect(build_cache):
    """Writes only the even elements of an empty_like output: the odd ones hold poison."""
    record = evaluate(AXPY_TASK, workspace(kernel=kernel_with("for (int64_t i = 0; i < n; i += 2) out[i] = a * x[i] + y[i];")), host(build_cache))
    rejected(record, needle="values differ")


# --- 2: tiny and constant outputs ------------------------------------------------------------

TINY_PART_TASK = Task(name="axpy_and_tiny", source=AXPY_TASK.source.replace("return self.alpha * x + y", "return self.alpha * x + y, x * 1e-4"))


def test_2_zeros_for_a_tiny_output_fail_the_scale_check(build_cache):
    """The second output's values are all below atol: zeros pass the paper's atol/rtol, not the
    elementwise check at the output's own scale."""
    first = HONEST_CALL.removeprefix("return ")
    honest = model_new_with(f"return {first}, cuda_extension.axpy_forward(x, torch.zeros_like(x), 1e-4)")
    record = evaluate(TINY_PART_TASK, workspace(model_new=honest), host(build_cache))
    assert record["status"] == "correct", record["message"]
    zeros = model_new_with(f"return {first}, torch.zeros_like(x)")
    rejected(evaluate(TINY_PART_TASK, workspace(model_new=zeros), host(build_cache)), needle="values differ at the output's scale")


def test_2_scale_check_and_input_dependence_by_hand():
    import torch

    from evaluator_cuda.verdict.verify import compare_outputs, outputs_ignore_inputs, relative_error

    ref = torch.tensor([3e-3, -4e-3])  # norm 5e-3, every value below atol 1e-2
    cpu = [{"cls": "Tensor", "device": "cpu"}]
    assert torch.allclose(torch.zeros(2), ref, atol=1e-2, rtol=1e-2)  # the paper's atol/rtol alone pass zeros
    assert "values differ at the output's scale" in compare_outputs(ref, torch.zeros(2), cpu, "cpu", 1e-2, 1e-2)
    assert "wrong at the tensor's scale" in compare_outputs(ref, ref * (1 + 2e-2), cpu, "cpu", 1e-2, 1e-1, norm_rtol=1e-2)
    assert relative_error(ref, torch.tensor([3e-3, -4e-3 + 5e-5])) == pytest.approx(5e-5 / 5e-3, rel=1e-4)
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([2.0, 1.0])
    assert outputs_ignore_inputs([a, b], [a, a]) is True
    assert outputs_ignore_inputs([a, b], [a, b]) is False
    assert outputs_ignore_inputs([a, a], [a, a]) is False  # the reference itself is constant: a task problem, not this check


# --- 3: input mutation -----------------------------------------------------------------------


def test_3_mutating_an_input_is_rejected(build_cache):
    body = "for (int64_t i = 0; i < n; ++i) { out[i] = a * x[i] + y[i]; ((float*)y)[i] = 0.0f; }"
    rejected(evaluate(AXPY_TASK, workspace(kernel=kernel_with(body)), host(build_cache)), "mutated_inputs")


# --- 4, 19: side streams, persisting L2 (static; CUDA forms) ----------------------------------

@pytest.mark.parametrize("kernel,reason", [(STREAM_KERNEL, "side_stream"), (L2_KERNEL, "persisting_l2")])
def test_4_19_side_streams_and_l2_persistence_are_rejected_before_building(tmp_path, kernel, reason):
    solution = workspace()
    files = dict(solution.files)
    files["kernels/axpy.cu"] = kernel.encode()
    del files["kernels/axpy.cpp"]
    record = evaluate(AXPY_TASK, Solution("workspace", files, "model_new.py", "axpy"), host(str(tmp_path)))
    rejected(record, reason)
    assert record["build"]["key"] is None  # nothing was built


def test_4_python_side_stream_is_rejected(tmp_path):
    rejected(evaluate(AXPY_TASK, kernelbench("s = torch.cuda.Stream()\nreturn x"), host(str(tmp_path))), "side_stream")


@pytest.mark.cuda
@pytest.mark.parametrize("kernel,reason", [(STREAM_KERNEL, "side_stream"), (L2_KERNEL, "persisting_l2")])
def test_4_19_cuda_forms_are_rejected(tmp_path, kernel, reason):
    from evaluator_cuda.settings import EvalSettings

    files = dict(workspace().files)
    files["kernels/axpy.cu"] = kernel.encode()
    del files["kernels/axpy.cpp"]
    record = evaluate(AXPY_TASK, Solution("workspace", files, "model_new.py", "axpy"), EvalSettings.for_backend("cuda", cache_dir=str(tmp_path)))
    rejected(record, reason)


# --- 5: background threads -------------------------------------------------------------------


def test_5_threads_in_sources_are_rejected(tmp_path):
    kernel = "#include <thread>\n" + kernel_with("std::thread t([]{}); t.join(); for (int64_t i = 0; i < n; ++i) out[i] = a * x[i] + y[i];")
    rejected(evaluate(AXPY_TASK, workspace(kernel=kernel), host(str(tmp_path))), "threads")
    rejected(evaluate(AXPY_TASK, kernelbench("return x", prelude="import threading"), host(str(tmp_path))), "threads")


def test_5_thread_started_at_run_time_is_rejected(build_cache):
    """Hidden from the static check; the candidate process's thread count gives it away."""
    body = 'mod = importer("thr" + "eading")\nmod.Thread(target=importer("time").sleep, args=(30,), daemon=True).start()\n' + HONEST_CALL
    source = model_new_with(body, prelude="import importlib as _i\nimporter = _i.import_module")
    rejected(evaluate(AXPY_TASK, workspace(model_new=source), host(build_cache, static_checks=False)), "threads")


# --- 6: lazy / fake tensors -------------------------------------------------------------------


def test_6_tensor_subclass_output_is_rejected(build_cache):
    prelude = "class Lazy(torch.Tensor):\n    pass\n"
    body = "out = " + HONEST_CALL.removeprefix("return ") + "\nreturn torch.Tensor._make_subclass(Lazy, out)"
    record = evaluate(AXPY_TASK, workspace(model_new=model_new_with(body, prelude=prelude)), host(build_cache))
    assert record["status"] == "incorrect" and record["reward"] == -1
    assert "expected exactly torch.Tensor" in record["message"] or "not allowed" in record["message"], record["message"]


# --- 7, 8, 12: the verdict lives in another process ------------------------------------------


def test_7_patching_the_checker_changes_nothing(build_cache):
    prelude = "import torch.testing\ntorch.testing.assert_close = lambda *a, **k: None\n"
    record = evaluate(AXPY_TASK, workspace("-", model_new=model_new_with(HONEST_CALL, prelude=prelude)), host(build_cache, static_checks=False))
    rejected(record, needle="values differ")


def test_7_patching_the_clock_does_not_change_the_times(build_cache):
    prelude = "import time\ntime.perf_counter_ns = lambda: 0\ntime.perf_counter = lambda: 0.0\ntime.monotonic_ns = lambda: 0\n"
    record = evaluate(AXPY_TASK, workspace("+", model_new=model_new_with(HONEST_CALL, prelude=prelude)), host(build_cache, profile=True, static_checks=False))
    assert record["status"] == "correct", record["message"]
    assert record["times_us"]["candidate"]["median_us"] > 0.0
    assert record["times_us"]["candidate"]["min_us"] > 0.0


def test_7_patching_torch_timing_is_rejected_before_anything_runs(tmp_path):
    prelude = "torch.cuda.Event.elapsed_time = lambda self, end: 1e-3\ntorch.cuda.synchronize = lambda *a: None\n"
    record = evaluate(AXPY_TASK, workspace("+", model_new=model_new_with(HONEST_CALL, prelude=prelude)), host(str(tmp_path), profile=True))
    rejected(record, "monkeypatch")
    assert "build" not in record["wall_s"]  # rejected from the sources, before the build


def test_7_harness_import_is_rejected(tmp_path):
    rejected(evaluate(AXPY_TASK, kernelbench("return x", prelude="import evaluator_cuda.timing.profile as p"), host(str(tmp_path))), "harness")


def test_8_forged_output_and_channel_writes_do_not_pass(build_cache):
    """Prints PASS and writes a well-formed 'ok' frame to every open descriptor; the output is wrong."""
    prelude = textwrap.dedent(
        """
        import json, os, struct
        print("PASS"); print('{"status": "correct", "reward": 3}')
        frame = json.dumps({"body": {"__dict__": {"ok": True}}, "blobs": []}).encode()
        for fd in range(3, 64):
            try:
                os.write(fd, struct.pack(">I", len(frame)) + frame)
            except OSError:
                pass
        """
    )
    record = evaluate(AXPY_TASK, workspace("-", model_new=model_new_with(HONEST_CALL, prelude=prelude)), host(build_cache, static_checks=False))
    assert record["status"] in ("incorrect", "runtime_error"), record["message"]
    assert record["reward"] == -1
    rejected(evaluate(AXPY_TASK, kernelbench("return x", prelude="import os\nos.write(3, b'ok')"), host(build_cache)), "channel")


def test_12_no_reference_output_in_the_candidate_process(build_cache):
    """Searches gc for any float tensor of the output's shape that is not an input, returns it."""
    body = textwrap.dedent(
        """
        import gc
        cuda_extension.axpy_forward(x, y, 0.0)
        found = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.shape == x.shape and o is not x and o is not y]
        return found[0] if found else x
        """
    )
    record = evaluate(AXPY_TASK, workspace(model_new=model_new_with(body)), host(build_cache, static_checks=False))
    rejected(record, needle="values differ")
    rejected(evaluate(AXPY_TASK, kernelbench("return x", prelude="import gc"), host(build_cache)), "introspection")


# --- 9, 10, 11: caching, batch-and-skip, warm-up detection -----------------------------------


def test_9_replaying_a_cached_output_is_incorrect(build_cache):
    body = "if self.cache is None:\n    self.cache = " + HONEST_CALL.removeprefix("return ") + "\nreturn self.cache"
    source = model_new_with(body, init_extra="self.cache = None")
    rejected(evaluate(AXPY_TASK, workspace(model_new=source), host(build_cache, profile=True)))


def test_10_11_honest_for_the_first_calls_then_fast_and_wrong_is_caught(build_cache):
    """Honest for as many calls as there are checks, then returns its input: the checks are
    spread over the schedule and a secret sample of timed calls is checked, so it is caught."""
    body = "self.calls += 1\nif self.calls > 5:\n    cuda_extension.axpy_forward(x, y, 0.0)\n    return y\n" + HONEST_CALL
    source = model_new_with(body, init_extra="self.calls = 0")
    rejected(evaluate(AXPY_TASK, workspace(model_new=source), host(build_cache, profile=True)), needle="values differ")


def test_11_checks_and_timed_calls_look_the_same_to_the_candidate(build_cache):
    """Raises if any call's context (guard modes, grad mode, argument layout, poison-free
    inputs' type) differs from the first call's: the evaluation stays correct, so it never did."""
    body = textwrap.dedent(
        """
        from torch.overrides import _get_current_function_mode_stack
        ctx = (len(_get_current_function_mode_stack()), torch.is_grad_enabled(), self.training,
               tuple((tuple(a.shape), a.stride(), a.dtype, a.device.type, type(a).__name__, a.is_contiguous()) for a in (x, y)))
        if self.first is None:
            self.first = ctx
        if ctx != self.first:
            raise RuntimeError(f"distinguishable call: {ctx} != {self.first}")
        """
    ) + HONEST_CALL
    # static checks off: reading torch's private mode stack is refused from the sources (torch_private)
    settings = host(build_cache, profile=True, static_checks=False)
    record = evaluate(AXPY_TASK, workspace(model_new=model_new_with(body, init_extra="self.first = None")), settings)
    assert record["status"] == "correct", record["message"]
    assert record["checked_calls"]["calls"] == 12 + record.get("timing_rounds", {}).get("extra_calls", 0)


def _candidate_messages(monkeypatch) -> list:
    """Record every message the verdict process sends to a candidate child."""
    from evaluator_cuda.isolation import sandbox

    sent, submit = [], sandbox.Child.submit

    def recording(self, message):
        if self.role == "candidate":
            sent.append(dict(message))
        return submit(self, message)

    monkeypatch.setattr(sandbox.Child, "submit", recording)
    return sent


@pytest.mark.parametrize("fresh_input_bytes", [1024**3, 4096 * 4 * 2 * 3], ids=["fresh_per_call", "rotating_3_sets"])
def test_10_no_input_set_reaches_the_candidate_before_its_call(build_cache, monkeypatch, fresh_input_bytes):
    """Batch-and-skip needs later calls' inputs ahead of time: no message carries more than the
    set of its own call, and nothing but calls carries inputs. Sets reused by rotation are kept
    under an id then (every set alike, check sets too) and named, not sent again."""
    sent = _candidate_messages(monkeypatch)
    record = evaluate(AXPY_TASK, workspace(), host(build_cache, profile=True, fresh_input_bytes=fresh_input_bytes,
                                                   inputs_from_seeds=False))
    assert record["status"] == "correct", record["message"]
    calls = [m for m in sent if m["cmd"] == "call"]
    assert [m["cmd"] for m in sent if m["cmd"] != "call"] == ["ready", "load", "prepare"] and len(calls) == record["checked_calls"]["calls"]
    assert all(("inputs" in m) != ("set" in m) for m in calls)
    first_uses = [m for m in calls if "inputs" in m]
    if record["fresh_inputs_per_call"]:
        assert len(first_uses) == len(calls) and not any("keep_as" in m for m in calls)
    else:
        assert len(first_uses) == 5 + 3  # the check sets and three rotating timed sets, each sent once
        assert all("keep_as" in m for m in first_uses)
        named = [m["set"] for m in calls if "set" in m]
        kept_before = set()
        for m in calls:  # a set is named only after the call that brought it
            if "set" in m:
                assert m["set"] in kept_before
            else:
                kept_before.add(m["keep_as"])
        assert named and set(named) <= kept_before


def test_10_no_seed_reaches_the_candidate_before_its_call(build_cache, monkeypatch):
    """Sets made from seeds in the candidate child: every call carries one seed, its own, used by no other
    call (no byte budget: a tiny one changes nothing), and no message before the call names it."""
    sent = _candidate_messages(monkeypatch)
    record = evaluate(AXPY_TASK, workspace(), host(build_cache, profile=True, fresh_input_bytes=1))
    assert record["status"] == "correct" and record["inputs_by_seed"], record["message"]
    calls = [m for m in sent if m["cmd"] == "call"]
    assert all("seed" in m and "inputs" not in m and "set" not in m for m in calls)
    seeds = [m["seed"] for m in calls]
    assert sorted(seeds) == sorted(record["seeds"]["inputs"] + record["seeds"]["timed"]) and len(set(seeds)) == len(seeds)
    for position, message in enumerate(sent):
        if message["cmd"] == "call":
            assert message["seed"] not in _numbers(sent[:position])


def _numbers(value) -> set:
    """Every int in a nested message (the keys' values, at any depth)."""
    if isinstance(value, bool):
        return set()
    if isinstance(value, int):
        return {value}
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return set().union(*(_numbers(v) for v in value)) if value else set()
    return set()


# --- 13: predictable seeds -------------------------------------------------------------------


def test_13_outputs_precomputed_from_guessed_seeds_are_incorrect(build_cache):
    prelude = textwrap.dedent(
        """
        GUESSES = {}
        for seed in (0, 1, 42, 1234):
            torch.manual_seed(seed)
            a, b = torch.randn(4096), torch.randn(4096)
            GUESSES[seed] = 2.5 * a + b
        """
    )
    body = "cuda_extension.axpy_forward(x, y, 0.0)\nreturn GUESSES[42]"
    record = evaluate(AXPY_TASK, workspace(model_new=model_new_with(body, prelude=prelude)), host(build_cache))
    rejected(record, needle="values differ")
    assert not {0, 1, 42, 1234} & set(record["seeds"]["inputs"])


# --- 15: precision downgrade -----------------------------------------------------------------

BF16_BODY = textwrap.dedent(
    """
    for (int64_t i = 0; i < n; ++i) {
      float v = a * x[i] + y[i];
      uint32_t bits; std::memcpy(&bits, &v, 4); bits &= 0xFFFF0000u; std::memcpy(&v, &bits, 4);
      out[i] = v;
    }
    """
)


def test_15_bf16_rounding_of_a_float32_task_is_flagged_or_rejected(build_cache):
    kernel = "#include <cstring>\n" + kernel_with(BF16_BODY)
    flagged = evaluate(AXPY_TASK, workspace(kernel=kernel), host(build_cache))
    assert flagged["status"] == "correct", flagged["message"]  # within atol/rtol 1e-2 ...
    assert flagged["precision"]["downgrade_suspected"] is True  # ... but far above float32 precision
    assert 2e-4 < flagged["precision"]["relative_error"] < 4e-3  # bf16 truncation: < 2^-8 per element
    rejected(evaluate(AXPY_TASK, workspace(kernel=kernel), host(build_cache, reject_precision_downgrade=True)), "precision_downgrade")


# --- 16: no real kernel ----------------------------------------------------------------------


def test_16_static_no_kernel_forms_are_rejected(tmp_path):
    settings = host(str(tmp_path))
    rejected(evaluate(AXPY_TASK, workspace(binding_body="out = torch::relu(out);"), settings), "torch_compute_cpp")
    rejected(evaluate(AXPY_TASK, kernelbench("try:\n    return ext(x)\nexcept Exception:\n    return x"), settings), "fallback")
    inherit = "import torch\nclass Model(torch.nn.Module):\n    pass\nclass ModelNew(Model):\n    pass\n"
    rejected(evaluate(AXPY_TASK, Solution("kernelbench", {"c.py": inherit.encode()}, "c.py", "axpy"), settings), "inherits_reference")
    rejected(evaluate(AXPY_TASK, kernelbench("return Model(self.alpha)(x, y)", prelude="from model import Model"), settings), "reference_import")


def test_16_aten_ops_from_python_are_refused(tmp_path):
    record = evaluate(AXPY_TASK, kernelbench("return torch.ops.aten.add.Tensor(x, y)"), host(str(tmp_path)))
    rejected(record, needle="not allowed")


COPY_TASK = Task(
    name="transpose_copy",
    source=textwrap.dedent(
        """
        import torch

        class Model(torch.nn.Module):
            def __init__(self, alpha):
                super().__init__()

            def forward(self, x, y):
                return x.view(64, 64).t().contiguous()

        def get_inputs():
            return [torch.randn(4096), torch.randn(4096)]

        def get_init_inputs():
            return [2.5]
        """
    ),
)


def test_16_extension_never_called_is_rejected(build_cache):
    """A copy-only task solved with allowed view/copy ops alone: the extension never runs."""
    source = model_new_with("return x.view(64, 64).t().contiguous()")
    rejected(evaluate(COPY_TASK, workspace(model_new=source), host(build_cache)), "no_kernel")


# --- 17: degenerate tasks --------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression,needle",
    [("torch.zeros_like(x) + 1.0", "does not depend on the inputs"), ("x + torch.randn_like(x)", "random")],
)
def test_17_degenerate_tasks_are_task_errors(tmp_path, expression, needle):
    from evaluator_cuda.evaluation import check_task_degenerate
    from evaluator_cuda.tasks import degenerate_reason

    task = task_like_axpy("degenerate", expression)
    record = evaluate(task, reference_solution("degenerate"), host(str(tmp_path)))
    assert record["status"] == "task_error" and record["reward"] is None
    assert needle in record["task_degenerate"] and "degenerate" in record["message"]
    assert degenerate_reason([__import__("torch").tensor([1.0, 2.0])] * 1, None, 1e-2, 1e-2) is None
    assert needle in check_task_degenerate(task, host(str(tmp_path)))


def test_17_small_outputs_are_scored_not_refused(tmp_path):
    """Every value below atol is no longer a degenerate task: it is checked at its own scale."""
    from evaluator_cuda.evaluation import check_task_degenerate

    task = task_like_axpy("tiny", "x * 1e-5")
    assert check_task_degenerate(task, host(str(tmp_path))) is None
    record = evaluate(task, reference_solution("tiny"), host(str(tmp_path)))
    assert record["status"] == "correct" and record["tolerance"]["scaled"] is True, record["message"]


# --- 18: speed-of-light ----------------------------------------------------------------------


def test_18_speedup_beyond_the_bandwidth_bound_is_flagged(build_cache):
    """With a planted bandwidth of 1 MB/s the 48 KiB of traffic cannot take under ~49 ms."""
    record = evaluate(AXPY_TASK, workspace("+"), host(build_cache, profile=True, peak_bandwidth=1e6))
    assert record["status"] == "correct", record["message"]
    assert record["sol_bound_us"] == pytest.approx(3 * 4096 * 4 / 1e6 * 1e6)
    assert record["sol_violation"] is True


# --- 20: sandbox -----------------------------------------------------------------------------


@pytest.mark.skipif(not network_namespace_prefix(), reason="unshare -n is not permitted here")
def test_20_no_network_from_the_candidate(build_cache):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.1)
    port = listener.getsockname()[1]
    body = f'sock = importer("soc" + "ket").create_connection(("127.0.0.1", {port}), timeout=2)\n' + HONEST_CALL
    source = model_new_with(body, prelude="import importlib as _i\nimporter = _i.import_module")
    record = evaluate(AXPY_TASK, workspace(model_new=source), host(build_cache, static_checks=False))
    assert record["status"] == "runtime_error" and record["reward"] == -1, record["message"]
    assert record["sandbox"]["network"].startswith("namespace")
    with pytest.raises(socket.timeout):
        listener.accept()
    listener.close()


def test_20_memory_limit_applies(build_cache):
    body = "big = torch.empty(6 * 1024**3, dtype=torch.uint8)\n" + HONEST_CALL
    record = evaluate(AXPY_TASK, workspace(model_new=model_new_with(body)), host(build_cache, child_memory_bytes=4 * 1024**3))
    assert record["status"] == "runtime_error" and record["reward"] == -1, record["message"]
    assert record["sandbox"]["memory_bytes"] == 4 * 1024**3


def test_20_whole_process_group_killed_on_timeout(build_cache, tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    body = textwrap.dedent(
        f"""
        import os, time
        if os.fork() == 0:
            open({str(pid_file)!r}, "w").write(str(os.getpid()))
            time.sleep(600)
        time.sleep(600)
        """
    )
    # 15 s per request: the reference child's first request waits for its `import torch`.
    # The unjailed path (jail_children=False): the jail's form, where the candidate cannot write
    # where the test looks, is tests/test_evaluator_jail.py::test_a_setsid_child_does_not_outlive_the_evaluation.
    # The call's limit: 100 x the reference's call + 2 s, + 2 s for a first call (the candidate sleeps through it).
    settings = host(build_cache, static_checks=False, child_timeout_s=15.0, jail_children=False,
                    call_timeout_extra_s=2.0, first_call_extra_s=2.0)
    record = evaluate(AXPY_TASK, workspace(model_new=model_new_with(body)), settings)
    assert record["status"] == "runtime_error" and "gave no answer" in record["message"]
    pid = int(pid_file.read_text())
    deadline = time.time() + 5
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split()[2] == "Z":
                break
        time.sleep(0.1)
    else:
        pytest.fail("the candidate's grandchild survived the timeout")


def test_20_changing_its_copy_of_the_task_changes_nothing(build_cache):
    prelude = textwrap.dedent(
        """
        try:
            open("model.py", "w").write("import torch\\nclass Model(torch.nn.Module):\\n    def forward(self, x, y):\\n        return x\\n")
        except OSError:
            pass
        """
    )
    # static checks off: the try/except is refused from the sources (fallback); the write must fail at run time
    record = evaluate(AXPY_TASK, workspace("-", model_new=model_new_with(HONEST_CALL, prelude=prelude)),
                      host(build_cache, static_checks=False))
    rejected(record, needle="values differ")


def test_20_cuda_error_marks_the_worker_for_recycling(tmp_path):
    record = evaluate(AXPY_TASK, kernelbench("raise RuntimeError('CUDA error: an illegal memory access was encountered')"), host(str(tmp_path)))
    assert record["status"] == "runtime_error" and record["reward"] == -1
    assert record["needs_recycle"] is True
