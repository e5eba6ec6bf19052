"""The versioned H200 journal (datasets/ops-h200/) stays resumable by the code at HEAD.

A change to the synthesis settings (the config, the operator catalogue, the evaluation programs)
would key a new journal and strand the decisions that cost H200 time; this test names the field.
It reads the journal the way a resume does, from a copy, with the settings of
`bash scripts/gpu_session.sh synthesis`.
"""

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from task_synthesis.config import SynthesisConfig
from task_synthesis.pipeline.journal import Journal
from task_synthesis.pipeline.quotas import quotas
from task_synthesis.pipeline.run import RunOptions, load_eval_index, run_settings

ROOT = Path(__file__).resolve().parents[1]
JOURNAL = ROOT / "datasets" / "ops-h200" / "tasks.parquet.journal.jsonl"
COUNT = 1000  # gpu_session.sh's --count

pytestmark = pytest.mark.skipif(not JOURNAL.exists(), reason="no H200 journal is versioned yet")


def _session_settings(gpu: str) -> dict:
    """The settings `gpu_session.sh synthesis` keys its journal by, on a GPU named `gpu`."""
    config = SynthesisConfig.load(None, scale="paper")
    options = RunOptions(out=JOURNAL.parent / "tasks.parquet", count=COUNT, config=config, backend="cuda",
                         eval_dir=ROOT / "examples" / "tasks")
    return run_settings(options, load_eval_index(options.eval_dir).names, gpu_names=[gpu])


def _header() -> dict:
    return json.loads(JOURNAL.read_text().splitlines()[0])


def test_the_h200_journal_was_made_on_an_h200():
    assert _header()["settings"]["gpu"] == "NVIDIA H200"


def test_the_h200_journal_resumes_with_the_settings_at_head(tmp_path):
    copy = tmp_path / JOURNAL.name
    shutil.copyfile(JOURNAL, copy)
    journal = Journal(copy, _session_settings("NVIDIA H200"))  # raises JournalError naming what differs
    assert len(journal.entries) == len(JOURNAL.read_text().splitlines()) - 1


def test_the_h200_journal_holds_each_candidate_once_and_no_category_past_its_quota():
    entries = [json.loads(line) for line in JOURNAL.read_text().splitlines()[1:]]
    keys = Counter(e["key"] for e in entries)
    assert [k for k, n in keys.items() if n > 1] == []
    kept = Counter(e["category"] for e in entries if e["status"] == "kept")
    limit = quotas(COUNT, SynthesisConfig.load(None, scale="paper").composition)
    assert {c: n for c, n in kept.items() if n > limit[c]} == {}
    assert all(e.get("source") for e in entries if e["status"] == "kept")
