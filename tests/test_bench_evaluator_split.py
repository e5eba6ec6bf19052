"""`scripts/bench_evaluator.py split` without a GPU: its two variants are the settings they name, and bad
input is one line and exit 2 before anything is evaluated."""

import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _split(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "bench_evaluator.py", "split", *args], cwd=SCRIPTS, capture_output=True,
                          text=True, timeout=120)


def test_the_commit_variants_are_committed_at_the_cuda_value_and_sent(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    from evaluator_bench.split import VARIANTS
    from evaluator_cuda.settings import COMMIT_OUTPUT_BYTES, EvalSettings

    committed, sent = (EvalSettings.for_backend("cuda", **v) for v in VARIANTS["commit"].values())
    assert (committed.commit_output_bytes, sent.commit_output_bytes) == (COMMIT_OUTPUT_BYTES, None)
    on_device, on_cpu = (EvalSettings.for_backend("cuda", **v) for v in VARIANTS["judge"].values())
    assert (on_device.judge_on_device, on_cpu.judge_on_device) == (True, False)


def test_an_unknown_example_or_variant_is_refused_with_exit_2():
    done = _split("--backend", "host", "--only", "no_such_task", "--vary", "commit")
    assert done.returncode == 2 and "no example task named no_such_task" in done.stderr, done.stderr[-500:]
    done = _split("--vary", "everything")
    assert done.returncode == 2 and "invalid choice: 'everything'" in done.stderr, done.stderr[-500:]


def test_the_rounds_run_back_to_back_are_listed_in_the_order_they_ran(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    from evaluator_bench.split import _print_rounds

    runs = {"cold": {"total_s": 15.0}, "cached_at_start": {"total_s": 6.5}, "cached_at_start_1": {"total_s": 6.25},
            "cached_after_timing": {"total_s": 2.9}, "cached_after_timing_1": {"total_s": 7.3},
            "cached_after_timing_2": {"total_s": None}}
    _print_rounds([{"task": "layernorm", "runs": runs}], ["at_start", "after_timing"])
    line = capsys.readouterr().out.splitlines()[-1].split()
    assert line == ["layernorm", "at_start:", "6.50,", "6.25;", "after_timing:", "2.90,", "7.30,", "-"]
