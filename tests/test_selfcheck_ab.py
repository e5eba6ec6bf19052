"""scripts/selfcheck_ab.py: one setting two ways over the self-check, and its refusals."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "selfcheck_ab.py"


def _run(*args: str, out: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    env = None if out is None else {**__import__("os").environ, "OUT": str(out)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


@pytest.mark.slow
def test_both_ways_are_benched_and_tabled_side_by_side(tmp_path):
    out = tmp_path / "not" / "made"  # $OUT need not exist: the table is not lost at the end of a long run
    done = _run("repeats=5", "repeats=6", "--tasks", "3_ReLU", "--rounds", "1", "--backend", "host", out=out)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("3_ReLU ") for line in lines)
    assert lines[-2].startswith("repeats=5: within ±3.0 %:") and lines[-1].startswith("repeats=6: within ±3.0 %:")
    saved = json.loads((out / "selfcheck_ab.json").read_text())
    assert saved["ways"] == ["repeats=5", "repeats=6"]
    assert all(list(saved["ratios"][way]) == ["3_ReLU"] and isinstance(saved["ratios"][way]["3_ReLU"][0], float)
               for way in saved["ways"])


@pytest.mark.parametrize("args, needle", [
    (("nosuch=1", "repeats=6"), "unknown settings: nosuch"),
    (("repeats", "repeats=6"), "expected SETTING=VALUE"),
    (("repeats=5", "repeats=6", "--tasks", "no_such_task"), "no task file for no_such_task"),
])
def test_bad_arguments_are_one_line_and_exit_2(args, needle):
    done = _run(*args, "--backend", "host", timeout=60)
    assert done.returncode == 2 and needle in done.stderr and len(done.stderr.strip().splitlines()) == 1
