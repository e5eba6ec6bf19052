"""scripts/machine_load.py: the program that burns CPU in an interval is named with its CPU time."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "machine_load.py"
BURN = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass\n"


def test_a_busy_program_is_named_with_its_cpu_time(tmp_path):
    burner = tmp_path / "burn_cpu.py"
    burner.write_text(BURN)
    busy = subprocess.Popen([sys.executable, str(burner)])
    try:
        done = subprocess.run([sys.executable, str(SCRIPT), "--every", "2", "--lines", "1", "--top", "100"],
                              capture_output=True, text=True, timeout=50)
    finally:
        busy.kill()
        busy.wait()
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert len(done.stdout.splitlines()) == 1 and "% busy" in line and "GiB free" in line and "largest: " in line
    seconds = float(line.split("burn_cpu.py ")[1].split("s")[0])
    assert seconds >= 0.2  # it spins for the whole interval; a loaded machine still gives it a share


def test_a_bad_interval_is_one_error_line():
    done = subprocess.run([sys.executable, str(SCRIPT), "--every", "0"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and done.stderr.strip() == "error: --every must be positive and --lines zero or more"
