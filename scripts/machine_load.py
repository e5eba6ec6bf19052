#!/usr/bin/env python
"""Prints the machine's load every --every seconds until stopped: CPU busy share, load average, available
memory, the GPU's use and memory (through nvidia-smi, when there is one), the programs that took the
most CPU time in the interval (grouped by command: a Python program by its module or script) and the
processes with the most resident memory.

  python scripts/machine_load.py --every 20 > load.log &

Reads /proc only; a process that ends within an interval is not counted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from evaluator_cuda.isolation.sandbox import available_memory_bytes  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def cpu_totals() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def command_of(pid: str) -> str:
    """A short name for a process: a Python program by its `-m` module or script, else its executable."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return "?"
    if not argv:
        return "?"
    name = os.path.basename(argv[0])
    if name.startswith("python") and len(argv) > 1:
        rest = argv[1:]
        if rest[0] == "-m" and len(rest) > 1:
            return rest[1]
        if rest[0] == "-c":
            return "python -c"
        return os.path.basename(rest[0])
    return name


def process_stats() -> dict[str, tuple[str, int, int]]:
    """pid -> (command, user + system jiffies, resident bytes)."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[pid] = (command_of(pid), int(fields[11]) + int(fields[12]), int(fields[21]) * PAGE_BYTES)
        except (OSError, IndexError, ValueError):
            continue
    return out


def gpu_line() -> str:
    if not shutil.which("nvidia-smi"):
        return "no nvidia-smi"
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
        use, memory = done.stdout.strip().splitlines()[0].split(",")
        return f"GPU {use.strip()} % busy, {int(memory) / 1024:.1f} GiB used"
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return "GPU ?"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--every", type=float, default=20.0, help="seconds between lines")
    parser.add_argument("--top", type=int, default=5, help="programs named per line")
    parser.add_argument("--lines", type=int, default=0, help="stop after this many lines (0: until stopped)")
    args = parser.parse_args(argv)
    if args.every <= 0 or args.lines < 0:
        print("error: --every must be positive and --lines zero or more", file=sys.stderr)
        return 2
    begin, last_cpu, last_procs = time.monotonic(), cpu_totals(), process_stats()
    printed = 0
    while not args.lines or printed < args.lines:
        time.sleep(args.every)
        cpu, procs = cpu_totals(), process_stats()
        busy = (cpu[0] - last_cpu[0]) / max(1, cpu[1] - last_cpu[1])
        used: Counter = Counter()
        for pid, (command, ticks, _) in procs.items():
            before = last_procs.get(pid)
            used[command] += ticks - (before[1] if before and before[0] == command else 0)
        top = ", ".join(f"{c} {t / CLOCK_TICKS:.1f}s" for c, t in used.most_common(args.top) if t > 0)
        largest = sorted(procs.values(), key=lambda p: -p[2])[:args.top]
        resident = ", ".join(f"{c} {rss / 1024**3:.1f} GiB" for c, _, rss in largest)
        free = available_memory_bytes()
        free_text = f"{free / 1024**3:.0f} GiB free" if free is not None else "? GiB free"
        print(f"[{time.monotonic() - begin:6.0f}s] CPU {100 * busy:3.0f} % busy, load {os.getloadavg()[0]:.1f}, "
              f"{free_text}, {gpu_line()} | CPU: {top} | largest: {resident}", flush=True)
        last_cpu, last_procs, printed = cpu, procs, printed + 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit(130)
