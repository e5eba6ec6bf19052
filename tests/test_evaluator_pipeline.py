"""End-to-end evaluations on the host backend: verdicts, refusals, crashes, compile
diagnostics, the baseline cache and the service API. Builds are shared across tests (and test
sessions) through the content-hash build cache, so each distinct source compiles once."""

import json
import re
from pathlib import Path

import pytest

from evaluator_cuda.timing.baselines import BaselineCache, baseline_key
from evaluator_cuda.evaluation import evaluate
from evaluator_cuda.service import compile_job, evaluate_job, job_settings
from evaluator_cuda.settings import EvalSettings
from evaluator_cuda.solutions import Solution, reference_solution
from evaluator_cuda.tasks import Task

from evaluator_helpers import AXPY_TASK, KERNEL, build_cache, host, kernelbench, workspace  # noqa: F401  (build_cache is a fixture)


def test_honest_host_workspace_is_correct(build_cache):
    record = evaluate(AXPY_TASK, workspace("+"), host(build_cache))
    assert record["status"] == "correct", record["message"]
    assert record["reward"] == 1  # correct, not profiled: the correctness milestone
    assert len(record["seeds"]["inputs"]) == 5
    json.dumps(record)  # JSON-serialisable


def test_wrong_host_workspace_is_incorrect(build_cache):
    record = evaluate(AXPY_TASK, workspace("-"), host(build_cache))
    assert record["status"] == "incorrect"
    assert record["reward"] == -1
    assert "values differ" in record["message"]


def test_compile_error_gives_file_and_line(build_cache):
    broken = KERNEL.replace("OP", "+").replace("(void)config; (void)stream;", "(void)config; (void)stream\n  int oops = ;")
    line = broken.splitlines().index("  int oops = ;") + 1
    record = evaluate(AXPY_TASK, workspace(kernel=broken), host(build_cache))
    assert record["status"] == "compile_error" and record["reward"] == -1
    first = record["diagnostics"][0]
    assert first["file"] == "kernels/axpy.cpp"
    assert first["line"] in (line - 1, line)  # gcc reports the missing ';' at the end of the line before
    assert "expected" in first["message"]


@pytest.mark.parametrize(
    "body,needle",
    [
        ("return F.relu(x)", "torch.nn.functional.relu is not allowed"),
        ("return torch.matmul(x.view(1, -1), y.view(-1, 1))", "torch.matmul is not allowed"),
        pytest.param("return x.mul(self.alpha).add(y)", "torch.Tensor.mul is not allowed", marks=pytest.mark.slow),
    ],
)
def test_torch_compute_in_forward_is_refused(tmp_path, body, needle):
    record = evaluate(AXPY_TASK, kernelbench(body), host(str(tmp_path)))
    assert record["status"] == "incorrect" and record["reward"] == -1
    assert needle in record["message"]


def test_candidate_that_raises_is_runtime_error(tmp_path):
    record = evaluate(AXPY_TASK, kernelbench("raise RuntimeError('kernel launch failed: bad grid')"), host(str(tmp_path)))
    assert record["status"] == "runtime_error" and record["reward"] == -1
    assert "kernel launch failed: bad grid" in record["message"]


def test_candidate_that_segfaults_is_runtime_error_not_infra(tmp_path):
    record = evaluate(AXPY_TASK, kernelbench("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)"), host(str(tmp_path), static_checks=False))  # os.kill is a static rejection otherwise
    assert record["status"] == "runtime_error" and record["reward"] == -1
    assert "SIGSEGV" in record["message"]


@pytest.mark.slow
def test_output_structure_and_type_are_exact(tmp_path):
    subclass = "class Lazy(torch.Tensor):\n    pass\n"
    cases = [
        (kernelbench("return torch.empty(4096, dtype=torch.float64)"), "expected dtype float32"),
        (kernelbench("return torch.empty(4096).as_subclass(Lazy)", prelude=subclass), "expected exactly torch.Tensor"),
        (kernelbench("return (torch.empty(4096),)"), "expected a tensor, got tuple"),
        (kernelbench("return torch.empty(64, 64)"), "expected shape (4096,)"),
    ]
    settings = host(str(tmp_path), block_torch=False)
    for solution, needle in cases:
        record = evaluate(AXPY_TASK, solution, settings)
        assert record["status"] == "incorrect", (needle, record["message"])
        assert needle in record["message"]


@pytest.mark.slow
def test_seeds_are_chosen_per_evaluation(tmp_path):
    settings = host(str(tmp_path))
    first = evaluate(AXPY_TASK, reference_solution("axpy"), settings)
    second = evaluate(AXPY_TASK, reference_solution("axpy"), settings)
    assert first["status"] == second["status"] == "correct"
    assert first["seeds"]["inputs"] != second["seeds"]["inputs"]
    assert len(set(first["seeds"]["inputs"])) == 5


UNSEEDED_INPUTS_TASK = Task(
    name="axpy_unseeded",
    source=AXPY_TASK.source.replace("import torch\n", "import random\nimport torch\n", 1).replace(
        "return [torch.randn(4096), torch.randn(4096)]",
        "return [torch.randn(4096) + random.random(), torch.randn(4096)]  # python's RNG: not reseeded by the harness"),
)


def test_timed_outputs_are_checked_against_the_inputs_that_were_sent(build_cache):
    """The reference outputs of timed calls come from the very input sets the candidate got,
    not from regenerating them by seed: a task whose get_inputs() is not reproducible from the
    torch seed (it uses Python's own RNG) still verifies an honest kernel, and still fails a wrong one."""
    assert "random.random()" in UNSEEDED_INPUTS_TASK.source
    settings = host(build_cache, profile=True, timed_checks=4, timing_rounds_budget_s=0.0)  # the schedule's sample
    honest = evaluate(UNSEEDED_INPUTS_TASK, workspace("+"), settings)
    assert honest["status"] == "correct", honest["message"]
    assert honest["checked_calls"]["timed"] == 4
    wrong = evaluate(UNSEEDED_INPUTS_TASK, workspace("-"), settings)
    assert wrong["status"] == "incorrect" and wrong["reward"] == -1


def _plant_baselines(cache_dir: str, settings: EvalSettings, eager_us: float, compile_us: float) -> Path:
    import torch

    from evaluator_cuda.roles.reference import device_name

    from evaluator_cuda.timing.stability import baseline_protocol

    key = baseline_key(AXPY_TASK.source, device_name("cpu"), torch.__version__, settings.compile_mode,
                       baseline_protocol(settings))
    stats = lambda us: {"median_us": us, "mean_us": us, "std_us": 0.0, "min_us": us, "max_us": us, "p25_us": us, "p75_us": us, "n": 1}  # noqa: E731
    cache = BaselineCache(Path(cache_dir) / "baselines")
    cache.put(key, {"eager": stats(eager_us), "compile": stats(compile_us)})
    return cache.path(key)


def _fresh_sample_agrees(monkeypatch, eager_us: float) -> None:
    """The fresh eager sample of a cache hit made to agree with the cached time, so that a test of the
    cache's own rules does not depend on the machine's noise (the re-check has tests of its own)."""
    from evaluator_cuda.evaluation import times

    monkeypatch.setattr(times, "eager_sample", lambda *a: {"median_us": eager_us, "median_rel_se": 0.0})


def test_baseline_cache_hit_skips_timing_and_sets_the_reward(tmp_path, monkeypatch):
    """Cached baselines that a fresh sample agrees with are used as they are: no re-timing, and the
    reward follows them."""
    settings = host(str(tmp_path), profile=True, timing_se_bound=1e9,  # the reward rule, not the noise
                    pair_host_eager=False)  # the baseline's eager time decides, as on a GPU
    _plant_baselines(str(tmp_path), settings, eager_us=1e9, compile_us=1e9)
    _fresh_sample_agrees(monkeypatch, 1e9)
    record = evaluate(AXPY_TASK, reference_solution("axpy"), settings)
    assert record["status"] == "correct", record["message"]
    assert record["baseline_cache_hit"] is True and record["baseline_recheck"]["stale"] is False
    assert record["times_us"]["eager"]["median_us"] == 1e9 and record["times_us"]["compile"]["median_us"] == 1e9
    assert "baselines" not in record["wall_s"]  # the reference process timed no baseline
    assert record["reward"] == 3  # far faster than both planted baselines
    assert record["speedup"]["eager"] == pytest.approx(1e9 / record["times_us"]["candidate"]["median_us"])
    _plant_baselines(str(tmp_path), settings, eager_us=1e-3, compile_us=1e-3)
    _fresh_sample_agrees(monkeypatch, 1e-3)
    assert evaluate(AXPY_TASK, reference_solution("axpy"), settings)["reward"] == 1


def test_a_machine_that_slows_down_during_the_evaluation_earns_no_speed_up(tmp_path, monkeypatch):
    """Eager timed just before the candidate's calls at twice the speed it has after them (another job
    started in between): the candidate's time cannot be compared with a baseline taken at another speed.
    The same times with no drift earn the speed-up (the test above), so the drift is what withholds it."""
    from evaluator_cuda.evaluation import times

    settings = host(str(tmp_path), profile=True, timing_se_bound=1e9, pair_host_eager=False)
    _plant_baselines(str(tmp_path), settings, eager_us=1e9, compile_us=1e9)
    samples = iter([{"median_us": 5e8, "median_rel_se": 0.01}, {"median_us": 1e9, "median_rel_se": 0.01}])
    monkeypatch.setattr(times, "eager_sample", lambda *a: next(samples))
    record = evaluate(AXPY_TASK, reference_solution("axpy"), settings)
    assert record["status"] == "correct", record["message"]
    assert record["baseline_cache_hit"] is True and record["eager_drift"]["moved"] is True
    assert record["eager_drift"]["before_us"] == 5e8 and record["eager_drift"]["after_us"] == 1e9
    assert record["reward"] == 1 and record["speedup"]["eager"] > 100
    assert any("speed changed during the evaluation" in r for r in record["speedup_withheld"])


@pytest.mark.parametrize("planted_us", [1e9, 1e-3], ids=["too_slow", "too_fast"])
def test_a_cached_eager_time_that_a_fresh_sample_contradicts_is_measured_again(tmp_path, planted_us):
    """A sealed baseline timed under another load (here planted far from the truth) is not trusted: the
    eager calls timed in this evaluation contradict it, the baselines are measured again, the cache
    entry is replaced, and the speed-up is judged against the new time."""
    settings = host(str(tmp_path), profile=True, timing_se_bound=1e9,  # cached whatever the noise
                    pair_host_eager=False)  # the baseline's eager time decides, as on a GPU
    path = _plant_baselines(str(tmp_path), settings, eager_us=planted_us, compile_us=planted_us)
    record = evaluate(AXPY_TASK, reference_solution("axpy"), settings)
    assert record["status"] == "correct", record["message"]
    check = record["baseline_recheck"]
    assert check["stale"] is True and check["cached_us"] == planted_us, check
    assert record["baseline_cache_hit"] is False and "baselines" in record["wall_s"]
    eager = record["times_us"]["eager"]["median_us"]
    assert 1e-3 < eager < 1e9 and eager != planted_us
    assert json.loads(path.read_text())["eager"]["median_us"] == eager
    # the speed-up is judged against the time measured now, not the planted one
    assert record["speedup"]["eager"] == pytest.approx(eager / record["times_us"]["candidate"]["median_us"])


def test_refreshed_baselines_are_measured_anew_and_replace_the_cached_entry(tmp_path):
    """--refresh-baselines: the cached entry is not read (so not re-checked either); the baselines are
    measured now and replace it, and the speed-up is judged against them."""
    settings = host(str(tmp_path), profile=True, timing_se_bound=1e9,  # cached whatever the noise
                    pair_host_eager=False, refresh_baselines=True)
    path = _plant_baselines(str(tmp_path), settings, eager_us=1e9, compile_us=1e9)
    record = evaluate(AXPY_TASK, reference_solution("axpy"), settings)
    assert record["status"] == "correct", record["message"]
    assert record["baseline_cache_hit"] is False and record["baseline_recheck"] is None
    assert "baselines" in record["wall_s"]
    eager = record["times_us"]["eager"]["median_us"]
    assert eager < 1e9 and json.loads(path.read_text())["eager"]["median_us"] == eager
    assert record["speedup"]["eager"] == pytest.approx(eager / record["times_us"]["candidate"]["median_us"])


def test_the_refresh_switch_of_bench_and_evaluate_reaches_the_settings():
    from evaluator_cuda.cli import _settings

    assert _settings("host", None, None, True, None, refresh_baselines=True).refresh_baselines is True
    assert _settings("host", None, None, True, None).refresh_baselines is False


@pytest.mark.slow
def test_baseline_cache_miss_measures_once(tmp_path, monkeypatch):
    """First evaluation times eager and torch.compile and stores them; the second reuses them. No cache
    flush before each timed call (64 MiB zeroed per call here, about half of the baselines' time): the
    cache is under test, not the times."""
    settings = host(str(tmp_path), profile=True, repeats=3, warmup=1, timing_se_bound=1e9,  # the cache, not the noise
                    pair_host_eager=False, l2_flush_bytes=0)
    first = evaluate(AXPY_TASK, reference_solution("axpy"), settings)
    assert first["status"] == "correct", first["message"]
    assert first["baseline_cache_hit"] is False and "baselines" in first["wall_s"]
    stored = list((tmp_path / "baselines").glob("*.json"))
    assert len(stored) == 1
    assert json.loads(stored[0].read_text())["eager"] == first["times_us"]["eager"]
    _fresh_sample_agrees(monkeypatch, first["times_us"]["eager"]["median_us"])
    second = evaluate(AXPY_TASK, reference_solution("axpy"), settings)
    assert second["baseline_cache_hit"] is True and "baselines" not in second["wall_s"]
    assert second["times_us"]["eager"] == first["times_us"]["eager"]
    assert second["times_us"]["compile"] == first["times_us"]["compile"]


def test_service_compile_then_evaluate_with_artifact(build_cache):
    job = {
        "task": {"name": "axpy", "source": AXPY_TASK.source},
        "solution": {"format": "workspace", "files": workspace("+").files},
        "settings": {"backend": "host", "profile": False},
    }
    worker = {"cache_dir": build_cache}  # the worker's own setting, never the job's
    built = compile_job(job, worker)
    assert built["status"] == "built" and isinstance(built["artifact"], bytes) and built["artifact"][:4] == b"\x7fELF"
    again = compile_job(job, worker)
    assert again["cache_hit"] is True
    record = evaluate_job({**job, "artifact": built["artifact"]}, worker)
    assert record["status"] == "correct", record["message"]
    assert record["build"]["key"] == "artifact"


def test_service_rejects_malformed_jobs_as_infra_error():
    record = evaluate_job({"task": {"name": "t"}, "solution": {}, "settings": {}})
    assert record["status"] == "infra_error" and record["reward"] is None
    assert "bad job" in record["message"]
    built = compile_job({"task": {"name": "t", "source": "x"}, "solution": {"format": "workspace", "files": {}}, "settings": {"backend": "gpu"}})
    assert built["status"] == "infra_error" and "unknown backend" in built["diagnostics"][0]["message"]


@pytest.mark.parametrize("key, value", [("cache_dir", "/tmp/elsewhere"), ("static_checks", False),
                                        ("block_torch", False), ("norm_rtol", 1.0), ("child_timeout_s", 1e6)])
def test_a_job_cannot_set_what_belongs_to_the_worker(key, value, monkeypatch):
    job = {"task": {"name": "axpy", "source": AXPY_TASK.source},
           "solution": {"format": "workspace", "files": workspace("+").files},
           "settings": {"backend": "host", key: value}}
    record = evaluate_job(job)
    assert record["status"] == "infra_error" and record["reward"] is None
    assert f"not settable per job: {key}" in record["message"]
    built = compile_job(job)
    assert built["status"] == "infra_error" and f"not settable per job: {key}" in built["diagnostics"][0]["message"]
    # the same value as the worker's own setting is taken (the job above was refused for its key alone)
    monkeypatch.setenv("CUDA_AGENT_WORKER_SETTINGS", json.dumps({key: value, "backend": "host"}))
    assert getattr(job_settings({"profile": False}), key) == value


def test_service_task_error_is_not_scored():
    record = evaluate_job({"task": {"name": "t", "source": "import torch\n"}, "solution": {"format": "reference"}, "settings": {"backend": "host"}})
    assert record["status"] == "task_error" and record["reward"] is None
    assert record["message"] == "task t: missing class Model, get_inputs(), get_init_inputs()"


def test_compile_timeout_is_a_compile_error(tmp_path):
    """A build that outlives the compile timeout is killed (whole process group) and not cached.

    The torch build (about 25 s here) outlives a 1 s limit on any machine. The fast build takes
    about 1 s, so with it the verdict depended on the machine's speed: when it finished in
    time, the binding runtime's first build hit the same limit (an infra_error)."""
    settings = host(str(tmp_path), compile_timeout_s=1.0, fast_build=False)
    solution = workspace("+", binding_body=f"// unique {tmp_path.name}")
    record = evaluate(AXPY_TASK, solution, settings)
    assert record["status"] == "compile_error" and record["reward"] == -1
    assert record["message"] == "compilation exceeded the 1 s compile timeout"
    assert not [p for p in (tmp_path / "build").iterdir() if not p.name.endswith(".lock")]  # nothing cached, no leftovers


@pytest.mark.slow
def test_candidate_that_hangs_is_killed_as_runtime_error(tmp_path):
    # The limit applies to each request, the reference child's first one too, which waits for that
    # child's `import torch` (a few seconds on a busy 2-core machine): 15 s leaves room for it, and
    # the busy loop burns a core for no longer than that (it was 45 s).
    # A call's own limit is 100 x the reference's call plus a few seconds; 2 s of each extra here (the
    # defaults, 5 and 10 s more for the first call, are for real candidates' first calls on a GPU).
    settings = host(str(tmp_path), child_timeout_s=15.0, call_timeout_extra_s=2.0, first_call_extra_s=2.0)
    record = evaluate(AXPY_TASK, kernelbench("while True:\n    pass"), settings)
    assert record["status"] == "runtime_error" and record["reward"] == -1
    # each call's limit follows the reference's time (settings.call_timeout_*), never above the 15 s
    expected = min(15.0, settings.call_timeout_factor * record["reference_call_s"] + settings.call_timeout_extra_s)
    assert "gave no answer within" in record["message"] and record["call_timeout_s"] == pytest.approx(expected, abs=2e-3)


LOAD_INLINE_SOLUTION = '''import torch
from torch.utils.cpp_extension import load_inline

CPP = r"""
#include <torch/extension.h>
torch::Tensor axpy(torch::Tensor x, torch::Tensor y, double a) {
  auto out = torch::empty_like(x);
  const float* px = x.data_ptr<float>();
  const float* py = y.data_ptr<float>();
  float* po = out.data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) po[i] = (float)a * px[i] SIGN py[i];
  return out;
}
"""
ext = load_inline(name="kb_axpy_SUFFIX", cpp_sources=[CPP], functions=["axpy"], extra_cflags=["-O3"], verbose=False)


class ModelNew(torch.nn.Module):
    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha

    def forward(self, x, y):
        return ext.axpy(x.contiguous(), y.contiguous(), float(self.alpha))
'''


@pytest.mark.slow
def test_kernelbench_load_inline_solutions(build_cache):
    """Format (b): one file whose ModelNew builds its extension with load_inline at import."""
    honest = LOAD_INLINE_SOLUTION.replace("SIGN", "+").replace("SUFFIX", "plus")
    record = evaluate(AXPY_TASK, Solution("kernelbench", {"kb.py": honest.encode()}, "kb.py", "axpy"), host(build_cache))
    assert record["status"] == "correct", (record["message"], record["diagnostics"][:2])
    broken = LOAD_INLINE_SOLUTION.replace("SIGN", "+ undefined_name +").replace("SUFFIX", "broken")
    record = evaluate(AXPY_TASK, Solution("kernelbench", {"kb.py": broken.encode()}, "kb.py", "axpy"), host(build_cache))
    assert record["status"] == "compile_error" and record["reward"] == -1
    assert any("undefined_name" in d["message"] and d["line"] for d in record["diagnostics"]), record["diagnostics"][:3]


def _small_example_task(stem: str, **sizes: int) -> Task:
    """An example task (examples/tasks/<stem>.py) with its size constants set to `sizes`."""
    source = (Path(__file__).resolve().parents[1] / "examples" / "tasks" / f"{stem}.py").read_text()
    for name, value in sizes.items():
        source, count = re.subn(rf"^{name} = \d+$", f"{name} = {value}", source, flags=re.M)
        assert count == 1, name
    return Task(name=stem, source=source)


@pytest.mark.slow
def test_fast_build_and_torch_build_give_the_same_verdicts_and_outputs(build_cache):
    """The default fast build (evaluator_cuda.extension.fast) and the torch build (torch's cpp_extension
    build of the harness's binding.cpp and the kernels at -O3) agree on verdicts, and their libraries on
    every output bit.

    The candidate is the layernorm host example, on a small layernorm so that its checks are quick. The
    wrong case is the same candidate against a task it does not solve: the build cache is keyed by the
    kernels, so each path builds once, and the one torch build (about 30 s here) serves both cases."""
    from evaluator_cuda.extension.fast.binding_runtime import is_fast_extension
    from evaluator_cuda.extension.pch import ready_pch
    from evaluator_cuda.solutions import read_solution

    layernorm = _small_example_task("layernorm", ROWS=64, HIDDEN=256)
    other = Task(name="layernorm_relu", source=layernorm.source.replace("self.bias, self.eps)",
                                                                        "self.bias, self.eps).relu()"))
    assert other.source != layernorm.source
    example = read_solution(Path(__file__).resolve().parents[1] / "examples" / "solutions" / "host" / "layernorm")
    torch_built, libraries = False, {}
    for fast in (True, False):
        settings = host(build_cache, fast_build=fast)
        honest = evaluate(layernorm, example, settings)
        torch_built |= not fast and not honest["build"]["cache_hit"]
        assert honest["status"] == "correct", (fast, honest["message"], honest["diagnostics"][:2])
        libs = [p for p in Path(build_cache).rglob("*.so") if honest["build"]["key"] in str(p)]
        assert libs and is_fast_extension(libs[0]) == fast  # the candidate ran on the library of that path
        libraries[fast] = libs[0]
        wrong = evaluate(other, example, settings)
        assert wrong["status"] == "incorrect" and wrong["reward"] == -1, (fast, wrong["message"])
        assert wrong["build"]["cache_hit"] and wrong["build"]["key"] == honest["build"]["key"]
    assert ready_pch(settings) is not None or not torch_built  # a torch build left the header precompiled
    _same_layernorm_outputs(libraries[True], libraries[False])


def _same_layernorm_outputs(fast_so: Path, torch_so: Path) -> None:
    """Both libraries, loaded here, give bit-identical layernorms, equal to torch's own."""
    import importlib.util

    import torch

    from evaluator_cuda.extension.fast.binding_runtime import load_fast_extension

    spec = importlib.util.spec_from_file_location("cuda_extension", torch_so)  # PyInit_cuda_extension
    full = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(full)  # not registered in sys.modules: other tests import their own cuda_extension
    fast = load_fast_extension(fast_so, module_name="cuda_extension_fast")
    torch.manual_seed(0)
    x, weight, bias = torch.randn(64, 256), 1 + 0.5 * torch.randn(256), 0.5 * torch.randn(256)
    expected = full.layernorm_forward(x, weight, bias, 1e-5)
    torch.testing.assert_close(fast.layernorm_forward(x, weight, bias, 1e-5), expected, rtol=0, atol=0)
    torch.testing.assert_close(expected, torch.nn.functional.layer_norm(x, (256,), weight, bias, 1e-5))
