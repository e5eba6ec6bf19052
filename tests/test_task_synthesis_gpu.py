"""Task synthesis on a shared GPU, tested on the CPU: the worker checks the planned memory before anything moves
to the device, holds the measured peak to the bound and releases its GPU memory on every way out (a fake
torch.cuda surface stands in for the device); an out-of-memory error is tried again later, at most
`oom_retries` times, and decided once; a candidate below the window is drawn again with its batch multiplied,
the shapes re-inferred for the larger batch."""

import math
import re
import weakref
from concurrent.futures import Future

import pytest
import torch

import task_synthesis.filter.execution as execution
import task_synthesis.pipeline.run as run_module
from evaluator_cuda.tasks import exec_task
from task_synthesis.catalogue import store
from task_synthesis.compose.composer import compose
from task_synthesis.compose.render import render
from task_synthesis.config import SynthesisConfig
from task_synthesis.filter.execution import Rejected, run_checks
from task_synthesis.filter.replies import MalformedReply, checked_verdict
from task_synthesis.filter.worker import filter_candidate
from task_synthesis.pipeline.journal import Journal, journal_path
from task_synthesis.pipeline.outputs import second_tries
from task_synthesis.pipeline.run import RunOptions, Synthesis
from task_synthesis.pipeline.second_tries import Requeue, batch_factor

from synthesis_helpers import checks_in_this_process  # noqa: F401 (a fixture)

# The worker's logic with patched checks: each candidate's checks in this process, not in a zygote's child.
pytestmark = pytest.mark.usefixtures("checks_in_this_process")

OPERATORS = store.load()["operators"]
MiB = 2**20

TASK = '''import torch
import torch.nn as nn

BATCH_SIZE = 4


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        FORWARD
        return torch.tanh(self.proj(x))


def get_inputs():
    return [torch.randn(BATCH_SIZE, 8)]


def get_init_inputs():
    return []
'''


def _task(forward: str = "pass") -> str:
    return TASK.replace("FORWARD", forward)


def _job(key: str = "2:0", source: str | None = None, **extra) -> dict:
    return {"key": key, "name": f"synth_{key.replace(':', '_')}", "source": source or _task(),
            "expected_shape": [4, 8], "shapes": [[4, 8], [4, 8]], "window_ms": (0.0, 1e6), "memory_bytes": 2**30,
            "evaluator": None, **extra}


class FakeCuda:
    """torch.cuda's memory functions, recorded; the peak is what the test says. `watched`: objects whose
    liveness each empty_cache() records (True: still referenced)."""

    def __init__(self, peak: int = 0):
        self.peak, self.calls, self.watched, self.alive_at_release = peak, [], [], []

    def install(self, monkeypatch) -> "FakeCuda":
        for name in ("reset_peak_memory_stats", "max_memory_allocated", "empty_cache", "synchronize"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        monkeypatch.setattr(execution, "_on", lambda device, value: value)  # the "GPU" is this process's memory
        return self

    def reset_peak_memory_stats(self):
        self.calls.append("reset")

    def max_memory_allocated(self):
        self.calls.append("peak")
        return self.peak

    def empty_cache(self):
        self.calls.append("empty_cache")
        self.alive_at_release.append([ref() is not None for ref in self.watched])

    def synchronize(self):
        pass


def _watch_models(monkeypatch, fake: FakeCuda) -> None:
    load = execution._load

    def watched_load(name, source):
        namespace, model = load(name, source)
        fake.watched.append(weakref.ref(model))
        return namespace, model

    monkeypatch.setattr(execution, "_load", watched_load)


# --- GPU memory hygiene in the worker ---------------------------------------------------------------------


def test_the_planned_bound_is_checked_before_anything_moves_to_the_device(monkeypatch):
    moved = []
    monkeypatch.setattr(execution, "_on", lambda device, value: moved.append(device) or value)
    planned = 4 * (4 * 8 + 4 * 8) + 4 * (8 * 8 + 8)  # the two planned tensors, the Linear's weight and bias
    with pytest.raises(Rejected) as caught:
        run_checks("t", _task(), [4, 8], [[4, 8], [4, 8]], (0.0, 1e6), planned - 1, device="cuda")
    assert caught.value.stage == "memory" and not moved
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    assert run_checks("t", _task(), [4, 8], [[4, 8], [4, 8]], (0.0, 1e6), planned, device="cuda")["bytes"] == planned
    assert moved and set(moved) == {"cuda"}


def test_a_measured_peak_above_the_bound_is_a_memory_rejection_on_the_gpu_and_unmeasured_on_the_cpu(monkeypatch):
    fake = FakeCuda(peak=300 * MiB).install(monkeypatch)
    with pytest.raises(Rejected) as caught:
        run_checks("t", _task(), [4, 8], [[4, 8]], (0.0, 1e6), 200 * MiB, device="cuda")
    assert caught.value.stage == "memory"
    assert "measured peak of 300.0 MiB" in caught.value.reason and "200 MiB bound" in caught.value.reason
    assert fake.calls[:2] == ["reset", "peak"]  # the counter starts again before the first forward
    measured = run_checks("t", _task(), [4, 8], [[4, 8]], (0.0, 1e6), 400 * MiB, device="cuda")
    assert measured["peak_bytes"] == 300 * MiB
    fake.calls.clear()
    on_cpu = run_checks("t", _task(), [4, 8], [[4, 8]], (0.0, 1e6), 200 * MiB, device="cpu")
    assert "peak_bytes" not in on_cpu and fake.calls == []


@pytest.mark.parametrize("way_out, stage", [
    ("kept", None), ("window", "window"), ("raises", "eager"), ("filter_error", "filter_error")])
def test_the_worker_releases_the_gpu_memory_of_its_checks_on_every_way_out(monkeypatch, way_out, stage):
    """And before the evaluator's children start: by then the task's model is no longer referenced."""
    import task_synthesis.filter.evaluator_stage as evaluator_stage

    fake = FakeCuda().install(monkeypatch)
    _watch_models(monkeypatch, fake)
    released_before_evaluator = []

    def evaluator(name, source, settings):
        released_before_evaluator.append(fake.alive_at_release == [[False]])
        return {}

    monkeypatch.setattr(evaluator_stage, "check_with_evaluator", evaluator)
    if way_out == "filter_error":
        monkeypatch.setattr(execution, "_check_output", lambda out, shape: 1 / 0)
    source = _task("raise ValueError('no')" if way_out == "raises" else "pass")
    window = (1e6, 2e6) if way_out == "window" else (0.0, 1e6)
    verdict = filter_candidate(_job(source=source, window_ms=window, device="cuda", evaluator={"backend": "cuda"}))
    assert verdict["stage"] == stage
    assert released_before_evaluator == ([True] if way_out == "kept" else [])
    assert fake.alive_at_release and fake.alive_at_release[-1] == [False]


def test_on_the_cpu_the_worker_touches_no_gpu_function(monkeypatch):
    fake = FakeCuda().install(monkeypatch)
    assert filter_candidate(_job(device="cpu"))["status"] == "kept"
    assert filter_candidate(_job(source=_task("raise ValueError('no')"), device="cpu"))["stage"] == "eager"
    assert fake.calls == []


# --- out of GPU memory: not the task's fault ------------------------------------------------------------------

OOM = "raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 8.00 GiB')"


def test_an_out_of_memory_forward_or_check_is_a_retry_and_any_other_error_a_rejection(monkeypatch):
    verdict = filter_candidate(_job(source=_task(OOM)))
    assert (verdict["status"], verdict["stage"]) == ("retry", "gpu_memory")
    assert verdict["reason"] == "OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB"
    verdict = filter_candidate(_job(source=_task("raise RuntimeError('DefaultCPUAllocator: not enough memory')")))
    assert (verdict["status"], verdict["stage"]) == ("rejected", "eager")

    def check_output(out, shape):  # a check of the output that allocates on the device
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(execution, "_check_output", check_output)
    verdict = filter_candidate(_job())
    assert (verdict["status"], verdict["stage"]) == ("retry", "gpu_memory") and "2.00 GiB" in verdict["reason"]


@pytest.mark.parametrize("record, stage", [
    ({"status": "runtime_error", "message": "the reference forward raised OutOfMemoryError: CUDA out of memory."},
     "gpu_memory"),
    ({"status": "infra_error", "message": "harness error: RuntimeError: CUDA out of memory. Tried to allocate"},
     "gpu_memory"),
    ({"status": "correct", "compile_baseline_error": "OutOfMemoryError: CUDA out of memory", "times_us": {}},
     "gpu_memory"),
    ({"status": "runtime_error", "message": "the reference forward raised ValueError: shapes differ"}, "evaluator"),
])
def test_the_evaluators_out_of_memory_record_is_a_retry(monkeypatch, record, stage):
    import evaluator_cuda.evaluation as evaluation

    monkeypatch.setattr(evaluation, "evaluate", lambda task, solution, settings: record)
    from task_synthesis.filter.evaluator_stage import evaluator_settings

    verdict = filter_candidate(_job(evaluator=evaluator_settings("host", compile_baseline=True)))
    assert verdict["stage"] == stage
    assert verdict["status"] == ("retry" if stage == "gpu_memory" else "rejected")


def test_a_retry_verdict_passes_the_check_only_at_stage_gpu_memory():
    job = {"key": "2:0", "nonce": "n"}
    retry = {"key": "2:0", "nonce": "n", "status": "retry", "stage": "gpu_memory", "reason": "CUDA out of memory",
             "peak_bytes": 5}
    assert checked_verdict(retry, job) == {"status": "retry", "stage": "gpu_memory",
                                           "reason": "CUDA out of memory", "peak_bytes": 5}
    with pytest.raises(MalformedReply, match="is not a verdict"):
        checked_verdict({**retry, "stage": "window"}, job)
    with pytest.raises(MalformedReply, match="peak_bytes"):
        checked_verdict({**retry, "peak_bytes": -1}, job)


def test_the_requeue_hands_back_a_candidate_once_enough_others_were_decided():
    queue = Requeue(delay=3)
    queue.put({"key": "a"}, {"job": "a"}, decided=10)
    queue.put({"key": "b"}, {"job": "b"}, decided=11)
    assert queue.take(12) is None and len(queue) == 2
    assert queue.take(13) == ({"key": "a"}, {"job": "a"})
    assert queue.take(13) is None
    assert queue.take(13, force=True) == ({"key": "b"}, {"job": "b"}) and len(queue) == 0


class ScriptedPool:
    """The filter's pool in this process: a job's verdict comes from `script(job)` (None: the real filter), checked
    as the pool checks a worker's reply. Every job is recorded with the decisions journaled when it was sent."""

    def __init__(self, script, run_holder: list):
        self.script, self.run_holder, self.sent, self.start_times = script, run_holder, [], [0.0]

    def submit(self, job: dict) -> Future:
        job = {**job, "nonce": "n"}
        self.sent.append((job["key"], job["name"], len(self.run_holder[0].journal.entries)))
        reply = self.script(job) or filter_candidate(job)
        future: Future = Future()
        future.set_result(checked_verdict({**reply, "nonce": "n"}, job))
        return future

    def close(self):
        pass

    def stop(self, grace_s: float = 0.0):
        pass

    def live_workers(self) -> int:
        return 0


def _scripted_run(tmp_path, monkeypatch, script, count: int = 4, workers: int = 2, progress=None, **config):
    holder: list = []
    pool = ScriptedPool(script, holder)
    monkeypatch.setattr(run_module, "WorkerPool", lambda launcher, n: pool)
    settings = SynthesisConfig(evaluator=False, compile=False, **config)
    options = RunOptions(out=tmp_path / "t.parquet", count=count, config=settings, seed=3, workers=workers,
                         backend="host", unjailed_workers=True)
    lines: list = []
    run = Synthesis(options, progress=progress or lines.append)
    holder.append(run)
    return run, pool, lines


def _out_of_memory_first(tries_by_key: dict):
    """A script: the key's first `tries_by_key[key]` jobs run out of GPU memory."""
    seen: dict = {}

    def script(job):
        seen[job["key"]] = seen.get(job["key"], 0) + 1
        if seen[job["key"]] <= tries_by_key.get(job["key"], 0):
            return {"key": job["key"], "status": "retry", "stage": "gpu_memory",
                    "reason": "the evaluator's runtime_error (message): OutOfMemoryError: CUDA out of memory"}
        return None

    return script


def test_a_candidate_out_of_gpu_memory_is_tried_again_later_then_rejected_and_decided_once(tmp_path, monkeypatch):
    tries = {"2:1": 10, "2:2": 1}  # 2:1 always runs out of memory, 2:2 once
    # A window no forward can miss, even on a loaded machine: 2:2 is kept once it is tried again.
    run, pool, lines = _scripted_run(tmp_path, monkeypatch, _out_of_memory_first(tries), workers=2, oom_retries=2,
                                     window_ms={"host": [0.0, 1e6]})
    run.run()
    entries = {e["key"]: e for e in run.journal.entries}
    assert len(entries) == len(run.journal.entries)  # each key decided once
    sends = [(key, decided) for key, _, decided in pool.sent]
    assert [key for key, _ in sends].count("2:1") == 3 and [key for key, _ in sends].count("2:2") == 2
    gave_up = entries["2:1"]
    assert (gave_up["status"], gave_up["stage"], gave_up["gpu_retries"]) == ("rejected", "gpu_memory", 2)
    assert gave_up["reason"].startswith("out of GPU memory in 3 tries; the last: the evaluator's runtime_error")
    assert entries["2:2"]["status"] == "kept" and entries["2:2"]["gpu_retries"] == 1
    first, again = [decided for key, decided in sends if key == "2:2"]
    assert again >= first + 2  # tried again once as many others as there are workers were decided
    assert sum("tried again later (1 of 2)" in line for line in lines) == 2
    assert sum("tried again later (2 of 2)" in line for line in lines) == 1
    assert second_tries(run.journal.entries).startswith(
        "out of GPU memory: 3 tries again of 2 candidates (1 then kept), 1 rejected at gpu_memory")


class Crash(Exception):
    pass


def test_a_crash_while_a_candidate_waits_to_be_tried_again_loses_it_and_the_resume_decides_it_once(tmp_path,
                                                                                                  monkeypatch):
    def crash_on_retry(line: str) -> None:
        if "tried again later" in line:
            raise Crash(line)

    script = _out_of_memory_first({"2:1": 1})
    crashed, _, _ = _scripted_run(tmp_path, monkeypatch, script, progress=crash_on_retry)
    with pytest.raises(Crash):
        crashed.run()
    assert "2:1" not in {e["key"] for e in crashed.journal.entries}
    resumed, _, _ = _scripted_run(tmp_path, monkeypatch, script)
    resumed.run()
    keys = [e["key"] for e in Journal(journal_path(tmp_path / "t.parquet"), resumed.journal_settings()).entries]
    assert len(keys) == len(set(keys)) and "2:1" in keys
    assert sum(resumed.kept.values()) == 4


# --- the batch scaled up for a candidate below the window -------------------------------------------------------


@pytest.mark.parametrize("eager_ms, low, cap, planned, activations, bound, expected", [
    (0.05, 1.0, 64, 10_000, 1_000, 10**9, 30),  # ceil(1.5 / 0.05)
    (0.01, 1.0, 64, 10_000, 1_000, 10**9, 64),  # ceil(150) capped
    (0.05, 1.0, 64, 10_000, 1_000, 20_000, 11),  # 9,000 of parameters + 11 x 1,000 fit in 20,000
    (0.05, 1.0, 64, 10_000, 1_000, 10_500, 1),  # not even twice the batch fits
    (0.9, 1.0, 64, 10_000, 1_000, 10**9, 2),  # ceil(1.67)
    (1.5, 1.0, 64, 10_000, 1_000, 10**9, 1),  # inside the window already
    (0.05, 1.0, 1, 10_000, 1_000, 10**9, 1),  # scale-up off
])
def test_the_batch_factor_aims_at_the_window_within_the_cap_and_the_memory_bound(eager_ms, low, cap, planned,
                                                                                  activations, bound, expected):
    assert batch_factor(eager_ms, low, cap, planned, activations, bound) == expected


def _batch_dependent_plans(limit: int):
    """(category, seed) of small plans, those whose arguments follow the batch first (a flattened batch)."""
    found, plain = [], []
    for category in ("1", "2", "3", "4", "5", "transformers"):
        for seed in range(200):
            plan, scaled = compose(category, OPERATORS, seed), compose(category, OPERATORS, seed, batch_factor=3)
            differs = [s.args for s in plan.steps] != [s.args for s in scaled.steps]
            (found if differs else plain).append((category, seed))
    return found[:limit] + plain[::60]


@pytest.mark.parametrize("category, seed", _batch_dependent_plans(6))
def test_a_scaled_plan_is_the_same_draw_with_the_batch_multiplied_and_its_shapes_match_execution(category, seed):
    plan, scaled = compose(category, OPERATORS, seed), compose(category, OPERATORS, seed, batch_factor=3)
    assert scaled.ops == plan.ops and scaled.input_shape == [3 * plan.input_shape[0], *plan.input_shape[1:]]
    assert [math.prod(s) * 3 for s in plan.shapes()] == [math.prod(s) for s in scaled.shapes()]
    source = render(scaled)
    assert re.search(r"^BATCH_SIZE = (\d+)$", source, re.M).group(1) == str(scaled.input_shape[0])
    namespace = exec_task("scaled", source)
    torch.manual_seed(0)
    model = namespace["Model"](*namespace["get_init_inputs"]()).eval()
    with torch.no_grad():
        out = model(*namespace["get_inputs"]())
    assert list(out.shape) == scaled.output_shape


def _below_the_window(eager_ms: float):
    """A script: an unscaled candidate's forward takes `eager_ms`; a scaled one goes through the real filter
    (its window opened: here the time itself is not under test)."""
    def script(job):
        if "_x" not in job["name"]:
            planned = 4 * sum(math.prod(s) for s in job["shapes"])  # no parameters: the bound is the test's
            return {"key": job["key"], "status": "rejected", "stage": "window", "reason": "too fast",
                    "eager_ms": eager_ms, "bytes": planned}
        return filter_candidate({**job, "window_ms": (0.0, 1e6)})

    return script


def test_a_candidate_below_the_window_is_drawn_again_with_its_batch_multiplied(tmp_path, monkeypatch):
    run, pool, lines = _scripted_run(tmp_path, monkeypatch, _below_the_window(0.1), window_ms={"host": (0.5, 1e6)})
    run.run()
    entries = run.journal.entries
    assert sum(run.kept.values()) == 4 and len({e["key"] for e in entries}) == len(entries)
    factor = math.ceil(1.5 * 0.5 / 0.1)
    for entry in entries:
        unscaled = compose(entry["category"], OPERATORS, entry["seed"], "small")
        assert entry["batch_factor"] == factor and entry["unscaled_eager_ms"] == 0.1
        assert entry["name"] == f"{run_module.task_name(entry['category'], entry['index'])}_x{factor}"
        assert entry["input_shape"] == [factor * unscaled.input_shape[0], *unscaled.input_shape[1:]]
        assert f"scaled batch {unscaled.input_shape[0]} -> {entry['input_shape'][0]} as {entry['name']}" in \
            "\n".join(lines)
    assert [name for _, name, _ in pool.sent].count(entries[0]["name"]) == 1
    assert second_tries(entries).endswith(f"batch scaled up for {len(entries)} candidates below the window "
                                          f"({len(entries)} kept)")


def test_no_scale_up_when_it_is_off_and_only_as_far_as_the_memory_bound_leaves_room(tmp_path, monkeypatch):
    off, _, _ = _scripted_run(tmp_path / "off", monkeypatch, _below_the_window(0.1), count=2,
                              window_ms={"host": (0.5, 1e6)}, batch_scale_max=1, attempts_per_task=2)
    off.run()
    assert {e["stage"] for e in off.journal.entries} == {"window"}
    assert not any(e.get("batch_factor") for e in off.journal.entries)
    bound = 2**16
    full, _, _ = _scripted_run(tmp_path / "full", monkeypatch, _below_the_window(0.1), count=2,
                               window_ms={"host": (0.5, 1e6)}, memory_bytes=bound, attempts_per_task=2)
    full.run()
    factors = []
    for entry in full.journal.entries:
        unscaled = compose(entry["category"], OPERATORS, entry["seed"], "small")
        room = bound // (4 * sum(math.prod(s) for s in unscaled.shapes()))  # the script reports no parameters
        expected = min(math.ceil(1.5 * 0.5 / 0.1), room)
        assert entry.get("batch_factor", 1) == (expected if expected >= 2 else 1)
        factors.append(expected)
    assert min(factors) < 8 <= max(factors)  # this seed's draws: one held back by the bound, one not
