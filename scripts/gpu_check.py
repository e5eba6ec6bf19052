"""The five-minute GPU check of the evaluator: does the CUDA path give the right verdicts?

    bash scripts/gpu_check.sh              # on a CUDA machine; logs and a JSON summary in $OUT
    python scripts/gpu_check.py --digest   # anywhere: the evaluator digest the check reports

Steps, each with its own time limit and printed as they go, in three lanes at once (the verdicts
do not depend on the timings; each lane builds into its own cache):
1. `cuda-agent bench examples/tasks --solutions examples/solutions --backend cuda`, every
   verdict checked: each honest solution `correct` with reward >= 1, each `__wrong` one
   `incorrect` with reward -1;
beside it, the jail on the GPU machine (`scripts/check_jail.py --gpu`, its last line `JAIL CHECK
PASS`): torch on CUDA and an `nvcc` build and run inside the jail, and what a jailed start costs;
and after it, in the jail's lane:
4. the small-output cases: an honest wide softmax `correct` on every seed, zeros, a constant,
   permuted rows and a rescaled output `incorrect`, a reference that ignores its inputs a
   `task_error`;
and beside these, one after the other:
2. the `cuda`-marked tests, on 4 workers;
3. the CUDA cheat forms (side stream, persisting-L2 window) rejected, an illegal address a
   `runtime_error`; past the static checks, ATen compute hidden from the runtime guard rejected by
   the kernel trace and work moved off the timed window denied its speed-up.
An honest speed-up withheld for drift while the lanes shared the GPU is timed again with the GPU to
itself (that task alone, after the other lanes), and only that second verdict counts.
The last line is `GPU CHECK PASS` or `GPU CHECK FAIL: <what>`. $OUT gets one log per step,
the bench report and gpu_check.json (what ran, what failed, the evaluator digest).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TOTAL_LIMIT_S = 320  # the whole check, set-up included, within about five minutes
JAIL_LIMIT_S = 120  # the jail lane: about 40 s on the H200 (two torch starts, one nvcc build)
JAIL_COMMAND = [sys.executable, "scripts/check_jail.py", "--gpu", "--repeats", "5"]
CUDA_TEST_FILES = ["tests/test_evaluator_examples.py", "tests/test_examples_cuda_build.py", "tests/test_fastbuild.py",
                   "tests/test_hardening_cheats.py", "tests/test_output_commitment.py", "tests/test_inputs_from_seeds.py",
                   "tests/test_kernel_attribution.py"]


def evaluator_digest(root: Path = ROOT) -> str:
    """sha256 over the evaluator's tracked source files (path and bytes, length-prefixed)."""
    h = hashlib.sha256()
    for path in sorted((root / "evaluator_cuda").rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts or path.suffix in (".pyc", ".so", ".o"):
            continue
        rel = path.relative_to(root).as_posix().encode()
        data = path.read_bytes()
        h.update(len(rel).to_bytes(8, "big") + rel + len(data).to_bytes(8, "big") + data)
    return h.hexdigest()


def run_step(name: str, command: list[str], limit_s: float, out: Path, env: dict) -> tuple[int, str]:
    """Run one step, echoing its lines as they come and keeping them in $OUT/<name>.log."""
    print(f"=== {name}: {' '.join(command)} (limit {limit_s:.0f} s) {time.strftime('%H:%M:%S')}", flush=True)
    begin = time.monotonic()
    log = (out / f"{name}.log").open("w")
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    lines: list[str] = []
    pending = b""
    timed_out = False
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    while True:
        left = limit_s - (time.monotonic() - begin)
        if left <= 0:
            timed_out = True
            break
        if not sel.select(timeout=min(left, 1.0)):
            if proc.poll() is not None:
                break
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for raw in complete:
            line = raw.decode(errors="replace").rstrip("\r") + "\n"
            print(f"  [{name}] {line}", end="", flush=True)
            log.write(line)
            lines.append(line)
    if pending:
        lines.append(pending.decode(errors="replace") + "\n")
        log.write(lines[-1])
        print(f"  {lines[-1]}", end="", flush=True)
    if not timed_out:  # output closed: the step ends on its own, or is cut at its limit
        try:
            proc.wait(timeout=max(0.1, limit_s - (time.monotonic() - begin)))
        except subprocess.TimeoutExpired:
            timed_out = True
    if timed_out:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        message = f"{name}: cut at its {limit_s:.0f} s limit; last line: {lines[-1].strip() if lines else '(none)'}"
        print(f"  {message}", flush=True)
        log.write(message + "\n")
    rc = proc.wait()
    log.close()
    print(f"=== {name}: exit {rc} after {time.monotonic() - begin:.1f} s", flush=True)
    return (124 if timed_out else rc), "".join(lines[-40:])


def last_line(tail: str, rc: int) -> str:
    """The line of a step's output that says how it ended (a verdict line, else its last line)."""
    lines = [l.strip() for l in tail.splitlines() if l.strip()]
    verdict = [l for l in lines if "as expected" in l or " passed" in l or " failed" in l]
    return (verdict or lines or [f"exit {rc}"])[-1][:300]


def jail_failures(rc: int, tail: str) -> list[str]:
    """The jail lane's failure (empty: it passed): its exit status and its `JAIL CHECK PASS` line both count;
    a lane cut at its limit (rc 124) fails."""
    if rc == 0 and "JAIL CHECK PASS" in tail:
        return []
    why = "cut at its limit" if rc == 124 else f"exit {rc}"
    verdict = [l.strip() for l in tail.splitlines() if l.startswith("JAIL CHECK")]
    return [f"jail ({why}): " + (verdict[-1][:300] if verdict else last_line(tail, rc))]


def bench_verdicts(report_path: Path, solutions: Path) -> list[str]:
    """Problems with the bench report's verdicts (empty: every one as expected)."""
    if not report_path.exists():
        return ["bench wrote no report"]
    report = json.loads(report_path.read_text())
    problems = [f"bench task problem: {p}" for p in report.get("task_problems", [])]
    from evaluator_cuda.solutions import read_solution

    by_name = {r["candidate"]: r for r in report["records"]}
    for path in sorted(p for p in (solutions / "cuda").iterdir() if p.is_dir()):
        record = by_name.get(read_solution(path).label)
        if record is None:
            problems.append(f"{path.name}: not in the report")
        elif "__wrong" in path.name:
            if (record["status"], record["reward"]) != ("incorrect", -1):
                problems.append(f"{path.name}: expected incorrect/-1, got {record['status']}/{record['reward']}: {record['message'][:120]}")
        elif record["status"] != "correct" or not isinstance(record["reward"], (int, float)) or record["reward"] < 1:
            problems.append(f"{path.name}: expected correct with reward >= 1, got {record['status']}/{record['reward']}: {record['message'][:120]}")
        elif not (record.get("persisting_l2_reset") and record.get("baseline_persisting_l2_reset")):
            problems.append(f"{path.name}: persisting L2 lines not demoted before every call "
                            f"(candidate {record.get('persisting_l2_reset')}, baselines "
                            f"{record.get('baseline_persisting_l2_reset')})")
        elif record.get("speedup_withheld"):
            problems.append(f"{path.name}: an honest kernel's speed-up withheld: {record['speedup_withheld'][0][:160]}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--digest", action="store_true", help="print the evaluator digest and exit")
    args = parser.parse_args()
    digest = evaluator_digest()
    if args.digest:
        print(digest)
        return 0
    begin = time.monotonic()
    out = Path(os.environ.get("OUT") or "/tmp/gpu_check_out")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("GPU_CHECK_WORK") or "/tmp/gpu_check_work")
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_AGENT_CACHE=str(work / "cache"), PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}")
    env.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    summary: dict = {"evaluator_digest": digest, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "steps": {}, "failures": []}
    print(f"gpu check: evaluator digest {digest}", flush=True)

    def left() -> float:
        return TOTAL_LIMIT_S - (time.monotonic() - begin)

    def step(name: str, command: list[str], share_s: float, cache: str = "cache") -> tuple[int, str]:
        limit = max(5.0, min(share_s, left() - 5))
        started = time.monotonic()
        # A step's own files stay out of $OUT; each lane builds into a cache of its own.
        rc, tail = run_step(name, command, limit, out, dict(env, OUT=str(work), CUDA_AGENT_CACHE=str(work / cache)))
        summary["steps"][name] = {"rc": rc, "seconds": round(time.monotonic() - started, 1)}
        return rc, tail

    rc, _ = step("environment", [sys.executable, "-c", "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"], 60)
    if rc != 0:
        summary["failures"].append("no usable CUDA device (see environment.log)")
        return finish(summary, out)

    # Two lanes at once (the verdicts do not depend on the timings): the bench of the examples,
    # and beside it the cuda tests, the cheat forms and the small-output table.
    report_dir = work / "bench"
    bench_lane: dict = {}
    bench_thread = threading.Thread(target=lambda: bench_lane.update(
        result=step("bench", bench_command("examples/tasks", report_dir), 275, cache="cache_bench")))
    bench_thread.start()
    jail_lane: dict = {}

    def jail_then_small_outputs() -> None:  # the jail takes ~17 s: the small-output table follows it in its lane
        jail_lane.update(result=step("jail", JAIL_COMMAND, JAIL_LIMIT_S, cache="cache_jail"))
        jail_lane.update(small=step("small_outputs", [sys.executable, "scripts/check_small_outputs.py", "--backend",
                                                      "cuda", "--honest-runs", "1"], 130, cache="cache_jail"))

    jail_thread = threading.Thread(target=jail_then_small_outputs)
    jail_thread.start()

    rc, tail = step("cuda_tests", [sys.executable, "-m", "pytest", "-v", "-m", "cuda", "-p", "no:cacheprovider", "--tb=short", "--timeout=100", "-n", "4", *CUDA_TEST_FILES], 120)
    if rc != 0:
        summary["failures"].append("cuda tests: " + last_line(tail, rc))
    rc, tail = step("cheats", [sys.executable, "scripts/check_hardening_gpu.py", "--cheats-only"], 150)
    if rc != 0:
        summary["failures"].append("cheat forms: " + last_line(tail, rc))

    jail_thread.join()
    summary["failures"] += jail_failures(*jail_lane.get("result", (1, "the jail lane did not run")))
    rc, tail = jail_lane.get("small", (1, "the small-output step did not run"))
    if rc != 0:
        summary["failures"].append("small outputs: " + last_line(tail, rc))
    bench_thread.join()
    rc, _ = bench_lane["result"]
    problems = bench_verdicts(report_dir / "report.json", ROOT / "examples" / "solutions")
    withheld = [p.split(":")[0] for p in problems if "speed-up withheld" in p]
    if withheld and len(withheld) == len(problems) and rc == 0:
        # The other lanes shared the GPU while the bench timed; a drift there is the check's own doing.
        # Those tasks are timed again alone, and only that second verdict counts.
        summary["bench_withheld_while_shared"] = withheld
        rc = rerun_alone(withheld, report_dir, step, summary)
        problems = bench_verdicts(report_dir / "report.json", ROOT / "examples" / "solutions")
    if (report_dir / "report.json").exists():
        (out / "bench_report.json").write_bytes((report_dir / "report.json").read_bytes())
    summary["bench_problems"] = problems
    if rc != 0 and not problems:
        problems = [f"bench exited {rc}"]
    summary["failures"] += [f"bench: {p}" for p in problems]
    return finish(summary, out)


def bench_command(tasks: str, out: Path) -> list[str]:
    """`cuda-agent bench` of `tasks` (a folder or one task file) with the example solutions, on cuda."""
    return [sys.executable, "-m", "cuda_agent.cli", "bench", tasks, "--solutions", "examples/solutions", "--backend",
            "cuda", "--out", str(out)]


def rerun_alone(tasks: list[str], report_dir: Path, step, summary: dict) -> int:
    """Bench `tasks` again with the GPU to themselves and merge their records into the bench report."""
    report_path = report_dir / "report.json"
    report = json.loads(report_path.read_text())
    worst = 0
    for task in tasks:
        again = report_dir.with_name(f"bench_again_{task}")
        rc, _ = step(f"bench_again_{task}", bench_command(f"examples/tasks/{task}.py", again), 90, cache="cache_bench")
        worst = max(worst, rc)
        if (again / "report.json").exists():
            fresh = {r["candidate"]: r for r in json.loads((again / "report.json").read_text())["records"]}
            report["records"] = [fresh.get(r["candidate"], r) for r in report["records"]]
    report_path.write_text(json.dumps(report, indent=1))
    return worst


def finish(summary: dict, out: Path) -> int:
    summary["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    summary["passed"] = not summary["failures"]
    (out / "gpu_check.json").write_text(json.dumps(summary, indent=1))
    if summary["passed"]:
        print("GPU CHECK PASS", flush=True)
        return 0
    print("GPU CHECK FAIL: " + "; ".join(summary["failures"])[:600], flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
