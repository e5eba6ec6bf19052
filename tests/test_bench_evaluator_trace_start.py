"""The trace-start probe (scripts/evaluator_bench/trace_start.py), dry on the CPU: a fresh process's marks,
a failed or hung process reported, the table from what ran."""

import pytest

pytestmark = pytest.mark.usefixtures("scripts_on_path")


def _probe():
    from evaluator_bench import trace_start

    return trace_start


def test_a_fresh_process_reports_each_step_and_a_second_start():
    marks = _probe()._run("cpu", {}, True, timeout=120, device="cpu")
    assert "error" not in marks, marks
    for step in ("import", "context", "trace_start", "kernel_and_stop", "trace_start_again"):
        assert marks[step] >= 0
    assert marks["kernels_seen"] == 0 and marks["cupti"] == []  # no GPU work, no CUPTI on the CPU


def test_a_failing_or_hung_process_is_reported_not_raised(monkeypatch):
    probe = _probe()
    assert probe._run("nonsense", {}, False, timeout=120, device="cpu")["error"].startswith("exit 1: KeyError")
    monkeypatch.setattr(probe, "PROBE", "import time; time.sleep(30)")
    assert probe._run("cpu", {}, False, timeout=1, device="cpu") == {"error": "no answer within 1 s"}


def test_the_table_gives_each_variants_median_and_a_dash_for_steps_not_run(capsys):
    runs = {"evaluator": [{"import": 1.0, "context": 0.3, "trace_start": 4.0, "kernel_and_stop": 0.2},
                          {"import": 1.2, "context": 0.5, "trace_start": 6.0, "kernel_and_stop": 0.4}],
            "cuda only": [{"error": "no answer within 60 s"}]}
    _probe()._print(runs)
    lines = capsys.readouterr().out.splitlines()
    evaluator = next(line for line in lines if line.startswith("evaluator")).split()
    assert evaluator[1:] == ["1.10", "0.40", "5.00", "0.30", "-"]
    assert next(line for line in lines if line.startswith("cuda only")).split()[2:] == ["-"] * 5
