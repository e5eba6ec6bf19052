import os
import shutil
import tempfile
from pathlib import Path

# Tests that exercise sharding use 8 fake CPU devices; this must be set before JAX initialises.
_XLA_FLAGS = "--xla_force_host_platform_device_count=8"
if not os.environ.get("CUDA_AGENT_TEST_GPU"):
    # JAX tests run on the CPU (8 fake devices) unless a GPU run asks otherwise.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    # The tests' tiny models spend most of their CPU time compiling. LLVM at -O1 instead of XLA's default
    # compiled the policy and training tests with ~20 % less CPU and ran the on-policy loop's 4,096-token
    # steps as fast (-O0 compiled faster still, but made those steps 1.5x slower). Floating-point semantics
    # are unchanged (XLA's fast-math stays off); every tolerance stays as it is.
    # XLA's newer CPU fusion emitters (MLIR) off: the older emitters compiled the policy and training tests
    # with ~27 % less CPU (62.8 -> 45.9 s for test_train_steps and test_policy_sampler together) and ran
    # the on-policy loop and the ablation 8 % faster in all; same tolerances.
    _XLA_FLAGS += " --xla_backend_optimization_level=1 --xla_cpu_use_fusion_emitters=false"
os.environ.setdefault("XLA_FLAGS", _XLA_FLAGS)

# One evaluator cache for the whole run, persistent across runs: the tests' own builds (evaluator_helpers'
# build_cache), the evaluator workers the tests start and everything that uses the default cache share
# one binding runtime, one torch-build precompiled header and every content-addressed build. Set here,
# before pytest-xdist starts its workers, so that they and every process a test starts inherit it.
os.environ.setdefault("CUDA_AGENT_CACHE", os.environ.get("CUDA_AGENT_TEST_CACHE") or str(Path.home() / ".cache" / "cuda-agent-tests"))

# One JAX compilation cache for the run, shared by the xdist workers and the processes tests start: a
# program compiled once (the same tiny model's steps in several files, a CLI run and its resume) is
# read back instead of compiled again. A fresh folder per run, removed at the end (pytest_unconfigure).
# Programs that compile in 0.05 s or more are kept (0.3 s kept a third as many and saved 12 s less CPU).
_JAX_CACHE_MADE_HERE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _JAX_CACHE_MADE_HERE = tempfile.mkdtemp(prefix="cuda-agent-tests-jax-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _JAX_CACHE_MADE_HERE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.05")

import pytest

# pytest-xdist (`-n 3 --dist loadscope`, pyproject.toml) runs "units" of tests, each whole on one worker
# (pytest_xdist_make_scheduler below): a module is a unit, so its module fixtures (fleets, checkpoints,
# compiled steps) are built once, except in these modules of independent, expensive tests that share
# only on-disk caches, whose tests are units of their own and spread over the workers.
SPREAD_MODULES = {
    "test_evaluator_pipeline.py",
    "test_hardening_cheats.py",
    "test_evaluator_tolerance.py",
    "test_examples_cuda_build.py",
    "test_agent_tools.py",
}
# Modules that share a session fixture form one unit (their GPU tests, which share nothing but the
# on-disk caches, are units of their own: on a GPU machine they are the slow ones).
SHARED_UNITS = {
    "test_examples_host.py": "host_examples",
    "test_evaluator_examples.py": "host_examples",
    # not a fixture: the ablation runner keeps its compiled pieces in the process, so the second module's
    # runs of the same settings compile nothing again
    "test_ablation_run.py": "ablation",
    "test_ablation_resume.py": "ablation",
}


# The two tests that build with torch's headers, in this order in one unit: the first build leaves the
# header precompiled (its test checks that), and the second compiles against it (about 30 s instead of 80 s
# of CPU here).
TORCH_BUILDS = (
    "test_evaluator_pipeline.py::test_fast_build_and_torch_build_give_the_same_verdicts_and_outputs",
    "test_guard_bypasses.py::test_cpp_tensor_method_is_refused_at_run_time_too",
)


def unit_of(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    name = module.rsplit("/", 1)[-1]
    if nodeid.rsplit("/", 1)[-1] in TORCH_BUILDS:
        return "torch_builds"
    if name in SHARED_UNITS and not nodeid.split("::")[-1].startswith("test_cuda_"):
        return SHARED_UNITS[name]
    return nodeid if name in SPREAD_MODULES or name in SHARED_UNITS else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadscope with our units (xdist's own xdist_group marks do not reach its scheduler under
    pytest 9, which ignores the node id suffix they rely on), in collection order."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False  # keep the order of pytest_collection_modifyitems
    return UnitScheduling(config, log)


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if not _has_cuda():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run on the device machine)")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip)
    # Units with a slow test first, so that no long unit starts last and leaves one worker busy
    # while the other idles; the order inside a unit stays as written.
    slow_units = {unit_of(item.nodeid) for item in items if "slow" in item.keywords}
    first_index = {}
    for index, item in enumerate(items):
        first_index.setdefault(unit_of(item.nodeid), index)
    items.sort(key=lambda item: (unit_of(item.nodeid) not in slow_units, first_index[unit_of(item.nodeid)]))


@pytest.fixture
def scripts_on_path(monkeypatch):
    """scripts/ importable for one test: the benchmarks' own package (evaluator_bench)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))


@pytest.fixture(scope="session")
def host_examples_bench(tmp_path_factory):
    """`cuda-agent bench examples/tasks --solutions examples/solutions --backend host`, verdicts only,
    run once: tests/test_evaluator_examples.py checks it as the main command's result, and
    tests/test_examples_host.py checks each example's record in it (one xdist unit: SHARED_UNITS)."""
    pytest.importorskip("torch")
    from rich.console import Console

    from evaluator_cuda.bench.run import run_bench
    from evaluator_cuda.settings import EvalSettings

    examples = Path(__file__).resolve().parents[1] / "examples"
    settings = EvalSettings.for_backend("host", profile=False)
    return run_bench(examples / "tasks", examples / "solutions", settings, tmp_path_factory.mktemp("bench"),
                     console=Console(width=160, record=True))


def pytest_configure(config):
    """In each test process (the xdist workers too), reference children are forked from a server that
    imported torch once, as in long-lived evaluators (evaluation.keep_children_warm), not started fresh:
    about 1.5 s of CPU less per evaluation. Processes the tests start choose for themselves, as in use.
    tests/test_evaluator_forkserver.py checks both ways."""
    from evaluator_cuda.isolation import forkserver

    forkserver.enable()


def pytest_unconfigure(config):
    if _JAX_CACHE_MADE_HERE and not hasattr(config, "workerinput"):  # the process that made it, not an xdist worker
        shutil.rmtree(_JAX_CACHE_MADE_HERE, ignore_errors=True)
