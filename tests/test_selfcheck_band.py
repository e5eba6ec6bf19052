"""scripts/selfcheck_band.py: the count of self-check tasks within the band, and its exit statuses."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "selfcheck_band.py"


def _record(task: str, status: str, eager_ratio: float | None) -> dict:
    times = {"candidate": {"median_us": 100.0, "median_rel_se": 0.01}, "eager": {"median_us": 100.0 * (eager_ratio or 1)}}
    return {"task": task, "status": status, "message": None if status == "correct" else "forward raised",
            "speedup": {"eager": eager_ratio, "compile": None}, "times_us": times}


def _run(tmp_path: Path, records: list, *args: str) -> subprocess.CompletedProcess:
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"records": records}))
    return subprocess.run([sys.executable, str(SCRIPT), str(report), *args], capture_output=True, text=True, timeout=60)


def test_tasks_outside_the_band_or_not_correct_are_marked_and_counted(tmp_path):
    records = [_record("a", "correct", 1.02), _record("b", "correct", 0.96), _record("c", "runtime_error", None),
               _record("d", "correct", 0.975)]
    done = _run(tmp_path, records)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert [line[:2] for line in lines[:4]] == ["  ", "! ", "! ", "  "]
    assert "a: 1.020x  candidate 100.0 µs ±1.0 %  eager 102.0 µs ±0.0 %" in lines[0]
    assert "c: runtime_error (forward raised)" in lines[2]
    assert lines[-1] == "within ±3.0 %: 2 of 4"
    wider = _run(tmp_path, records[:2], "--band", "0.05")
    assert wider.returncode == 0 and wider.stdout.splitlines()[-1] == "within ±5.0 %: 2 of 2"


def test_an_unreadable_or_empty_report_is_one_line_and_exit_2(tmp_path):
    empty = _run(tmp_path, [])
    assert empty.returncode == 2 and empty.stderr.strip().endswith("holds no record") and not empty.stdout
    missing = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "none.json")], capture_output=True, text=True)
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


def test_on_cuda_the_calls_plain_medians_are_shown_beside(tmp_path):
    record = _record("a", "correct", 1.0)
    record["times_us"]["candidate"]["call_median_us"] = 95.0
    record["times_us"]["eager"]["call_median_us"] = 104.5
    done = _run(tmp_path, [record])
    assert done.returncode == 0 and "(plain medians 1.100x)" in done.stdout.splitlines()[0]
