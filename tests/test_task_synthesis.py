"""Task synthesis, the fast parts: shape inference against execution, AST similarity on hand-made
pairs, planted degenerate tasks rejected with their reasons, quotas, the journal."""

import json
import random
import warnings
from pathlib import Path

import pytest
import torch

from evaluator_cuda.tasks import check_task_source, exec_task
from task_synthesis.catalogue import store
from task_synthesis.catalogue.families import ShapeError, choose_args, output_shape
from task_synthesis.catalogue.runtime import build_callable
from task_synthesis.compose.composer import compose
from task_synthesis.compose.render import render
from task_synthesis.compose.sizes import SIZES, start_shape
from task_synthesis.config import ConfigError, SynthesisConfig
from task_synthesis.filter.execution import Rejected, run_checks
from task_synthesis.pipeline.journal import Journal, JournalError
from task_synthesis.pipeline.quotas import quotas
from task_synthesis.similarity.score import SimilarityIndex, fingerprint, similarity

OPERATORS = store.load()["operators"]


def _run(source: str):
    namespace = exec_task("t", source)
    torch.manual_seed(0)
    model = namespace["Model"](*namespace["get_init_inputs"]()).eval()
    with torch.no_grad():
        return model(*namespace["get_inputs"]())


def test_catalogue_records_kept_operators_and_failures_with_reasons():
    catalogue = store.load()
    names = {op["name"] for op in catalogue["operators"]}
    assert {"torch.nn.Conv2d", "torch.nn.Linear", "torch.nn.functional.gelu", "torch.sum", "RMSNorm"} <= names
    assert catalogue["failures"]["torch.nn.Dropout"].startswith("rank")  # identity in eval mode
    assert "no computation" in catalogue["failures"]["torch.nn.Identity"]
    assert all(isinstance(r, str) and r for r in catalogue["failures"].values())
    assert {op["family"] for op in catalogue["operators"]} >= {"conv", "pool", "reduce", "binary", "block"}


@pytest.mark.parametrize("category", ["1", "2", "3", "4", "5", "transformers"])
def test_composer_shape_inference_matches_execution(category):
    for seed in range(12):
        plan = compose(category, OPERATORS, seed)
        source = render(plan)
        check_task_source("t", source)
        assert max(len(line) for line in source.splitlines()) <= 120
        out = _run(source)
        assert list(out.shape) == plan.output_shape, (plan.ops, source)
        expected_ops = 1 if category == "transformers" else int(category)
        assert len(plan.steps) >= expected_ops if category == "transformers" else len(plan.steps) == expected_ops


def test_each_operator_shape_rule_matches_execution():
    rng = random.Random(0)
    checked = 0
    for op in OPERATORS:
        for rank in [r for r in op["ranks"] if r >= 2]:
            shape = start_shape(rank, SIZES["small"], rng, transformer=op["family"] == "block")
            try:
                args = choose_args(op, shape, rng, SIZES["small"])
                predicted = output_shape(op, shape, args)
            except ShapeError:
                continue
            x = torch.randn(shape).abs() + 1.0 if op["domain"] == "positive" else torch.tanh(torch.randn(shape))
            with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = build_callable(op, args)(x)
            assert list(out.shape) == predicted, (op["name"], shape, args)
            # The crawl keeps no call form torch warns about (ignored arguments, deprecated names).
            assert not caught, (op["name"], shape, args, str(caught[0].message))
            checked += 1
    assert checked > 300


@pytest.fixture(autouse=True, scope="module")
def _torch_warns_every_time():
    """torch's once-per-process C++ warnings fire on every call here (as in the crawl's probes)."""
    before = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    yield
    torch.set_warn_always(before)


RENAMED_A = '''"""Scaled GELU."""
import torch
import torch.nn as nn
import torch.nn.functional as F

N = 128


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.proj = nn.Linear(features, features)

    def forward(self, x):
        y = self.proj(x)
        return F.gelu(y) * 2.0


def get_inputs():
    return [torch.randn(N, N)]


def get_init_inputs():
    return [N]
'''

RENAMED_B = '''import torch
import torch.nn as nn
import torch.nn.functional as functional

SIZE = 4096


class Model(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.layer = nn.Linear(width, width)  # a comment

    def forward(self, inp):
        hidden = self.layer(inp)
        return functional.gelu(hidden) * 3.5


def get_inputs():
    return [torch.randn(SIZE, SIZE)]


def get_init_inputs():
    return [SIZE]
'''

UNRELATED = '''
def fibonacci(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


print(sorted({fibonacci(i) % 7 for i in range(30)}))
'''

OTHER_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, 2 * channels, 3, padding=1)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        x = self.pool(x)
        return torch.softmax(x.flatten(1), dim=-1).sum(dim=0, keepdim=True)


def get_inputs():
    return [torch.randn(8, 16, 32, 32)]


def get_init_inputs():
    return [16]
'''


def test_similarity_identical_up_to_renaming_is_one():
    assert similarity(RENAMED_A, RENAMED_B) == 1.0


def test_similarity_of_unrelated_programs_is_low():
    assert similarity(RENAMED_A, UNRELATED) < 0.1
    assert similarity(RENAMED_A, OTHER_TASK) < 0.6
    changed_op = RENAMED_A.replace("F.gelu(y) * 2.0", "torch.tanh(y) + y")
    assert 0.6 < similarity(RENAMED_A, changed_op) < 1.0


PLANTED = {
    "deterministic": "return x + torch.rand_like(x)",
    "input_dependent": "return torch.zeros_like(x) + self.bias",
    "tiny": "return x * 1e-6",
}


def _planted(body: str) -> str:
    return (
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.bias = nn.Parameter(torch.ones(8))\n\n"
        f"    def forward(self, x):\n        {body}\n\n\ndef get_inputs():\n    return [torch.randn(4, 8)]\n\n\n"
        "def get_init_inputs():\n    return []\n")


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_planted_degenerate_task_is_rejected_with_its_reason(kind):
    with pytest.raises(Rejected) as caught:
        run_checks("planted", _planted(PLANTED[kind]), [4, 8], [[4, 8], [4, 8]], (0.0, 1e6), 2**30)
    stage = "input_dependent" if kind == "tiny" else kind
    assert caught.value.stage == stage
    assert {"deterministic": "random", "input_dependent": "does not depend", "tiny": "below the tolerance"}[kind] \
        in caught.value.reason


def test_checks_reject_memory_window_and_wrong_shape_inference():
    source = _planted("return torch.tanh(x)")
    assert run_checks("ok", source, [4, 8], [[4, 8], [4, 8]], (0.0, 1e6), 2**30)["output_shape"] == [4, 8]
    for args, stage in [(([4, 8], [[4, 8]], (0.0, 1e6), 100), "memory"), (([4, 8], [[4, 8]], (1e5, 1e6), 2**30),
                                                                          "window"),
                        (([8, 4], [[4, 8]], (0.0, 1e6), 2**30), "output")]:
        with pytest.raises(Rejected) as caught:
            run_checks("t", source, *args)
        assert caught.value.stage == stage


def test_the_evaluator_rejects_a_random_task_in_its_children(tmp_path):
    from task_synthesis.filter.evaluator_stage import check_with_evaluator, evaluator_settings

    settings = evaluator_settings("host", compile_baseline=False, cache_dir=str(tmp_path))
    with pytest.raises(Rejected) as caught:
        check_with_evaluator("planted_random", _planted(PLANTED["deterministic"]), settings)
    assert caught.value.stage == "evaluator" and "random" in caught.value.reason


def test_quotas_follow_the_paper_composition():
    table = SynthesisConfig().composition
    # 200 x the shares: 6.80, 167.54, 15.24, 5.60, 2.46, 2.36; the three largest remainders round up
    assert quotas(200, table) == {"1": 7, "2": 168, "3": 15, "4": 6, "5": 2, "transformers": 2}
    for count in (1, 37, 1000, 6000):
        got = quotas(count, table)
        assert sum(got.values()) == count
        assert all(abs(got[k] - count * v / 100.0) < 1 for k, v in table.items())


def test_config_rejects_bad_values(tmp_path):
    with pytest.raises(ConfigError):
        SynthesisConfig(similarity_threshold=1.5)
    path = tmp_path / "c.yaml"
    path.write_text("composition: {\"7\": 1.0}\n")
    with pytest.raises(ConfigError, match="unknown composition"):
        SynthesisConfig.load(path)
    path.write_text("scale: medium\nsimilarity_threshold: 0.8\n")
    assert SynthesisConfig.load(path, scale="paper").scale == "paper"


def test_journal_ignores_a_line_cut_by_a_crash_and_refuses_other_settings(tmp_path):
    path = tmp_path / "j.jsonl"
    journal = Journal(path, {"seed": 1})
    journal.add({"key": "2:0", "category": "2", "status": "kept"})
    with open(path, "a") as handle:
        handle.write('{"kind": "candidate", "key": "2:1", "cat')
    again = Journal(path, {"seed": 1})
    assert [e["key"] for e in again.entries] == ["2:0"]
    assert all(json.loads(line) for line in path.read_text().splitlines())
    with pytest.raises(JournalError, match="seed"):
        Journal(path, {"seed": 2})


def test_the_checks_run_and_time_the_forwards_on_the_jobs_device():
    """The cuda backend's window is a GPU time: the worker runs the forwards where the job says. A device
    the model cannot move to is a `load` rejection that names it (here, without CUDA: "cuda")."""
    import torch

    source = _planted("return torch.tanh(x)")
    measured = run_checks("moved", source, [4, 8], [[4, 8], [4, 8]], (0.0, 1e6), 2**30, device="cpu:0")
    assert measured["output_shape"] == [4, 8] and measured["eager_ms"] > 0
    if not torch.cuda.is_available():
        with pytest.raises(Rejected) as caught:
            run_checks("moved", source, [4, 8], [[4, 8], [4, 8]], (0.0, 1e6), 2**30, device="cuda")
        assert caught.value.stage == "load" and caught.value.reason.startswith("moving to cuda:")


def test_config_evaluation_is_checked_and_reaches_the_evaluator(tmp_path):
    from evaluator_cuda.settings import EvalSettings
    from task_synthesis.filter.evaluator_stage import evaluator_settings

    path = tmp_path / "c.yaml"
    path.write_text("evaluation: {cuda: {static_checks: false}}\n")
    with pytest.raises(ConfigError, match="static_checks cannot be set here"):
        SynthesisConfig.load(path)
    with pytest.raises(ConfigError, match="non-negative numbers"):
        SynthesisConfig(evaluation={"cuda": {"repeats": -1}})
    path.write_text("evaluation: {host: {repeats: 3}}\n")
    config = SynthesisConfig.load(path)
    assert config.evaluation_for("cuda")["repeats"] == 10  # a backend not named keeps the default
    host = evaluator_settings("host", True, lighter=config.evaluation_for("host"))
    assert host["repeats"] == 3 and host["warmup"] == EvalSettings.for_backend("host").warmup
    cuda = evaluator_settings("cuda", True, lighter=SynthesisConfig().evaluation_for("cuda"))
    assert (cuda["checks"], cuda["warmup"], cuda["repeats"], cuda["baseline_budget_s"]) == (2, 3, 10, 1.0)
    assert cuda["static_checks"] == EvalSettings.for_backend("cuda").static_checks


def test_the_documented_config_file_is_the_defaults():
    root = Path(__file__).resolve().parents[1]
    assert SynthesisConfig.load(root / "configs" / "task_synthesis.yaml") == SynthesisConfig()


def _greedy_distinct(prints: list, threshold: float) -> int:
    index, kept = SimilarityIndex(), 0
    for n, fp in enumerate(prints):
        if index.nearest(fp, at_least=threshold)[0] < threshold:
            index.add(str(n), fp)
            kept += 1
    return kept


def test_a_near_duplicate_is_the_same_operators_up_to_sizes_not_any_two_operator_task():
    from task_synthesis.compose.drafts import ProgrammaticComposer
    from task_synthesis.pipeline.run import candidate_seed

    composer = ProgrammaticComposer(store.load(None)["operators"], "paper")
    threshold = SynthesisConfig().duplicate_threshold
    drafts = [composer.draft("2", candidate_seed(0, "2", i)) for i in range(200)]
    larger = composer.draft("2", candidate_seed(0, "2", 0), batch_factor=3)
    assert larger.source != drafts[0].source and similarity(larger.source, drafts[0].source) >= threshold
    pairs = len({tuple(d.plan.ops) for d in drafts})
    prints = [fingerprint(d.source) for d in drafts]
    assert _greedy_distinct(prints, threshold) >= 0.9 * pairs  # other operators: other tasks
    assert _greedy_distinct(prints, 0.9) < 0.7 * pairs  # the paper's decontamination bound would drop them
