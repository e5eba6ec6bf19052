"""Task synthesis runs: resume after a crash loses nothing, bad input is one error line, and an
end-to-end run whose kept tasks load and self-check `correct` in `cuda-agent bench`."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from task_synthesis.config import SynthesisConfig
from task_synthesis.pipeline.journal import journal_path
from task_synthesis.pipeline.outputs import write_report
from task_synthesis.pipeline.run import RunOptions, Synthesis, SynthesisError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "tasks"


class Crash(Exception):
    pass


def _options(out: Path, count: int) -> RunOptions:
    config = SynthesisConfig(evaluator=False, compile=False)
    return RunOptions(out=out, count=count, config=config, seed=7, workers=1, backend="host", eval_dir=EXAMPLES)


def _crash_after(decisions: int):
    seen = []

    def progress(line: str) -> None:
        seen.append(line)
        if len(seen) >= decisions:
            raise Crash(line)

    return progress


def _kept(run: Synthesis) -> list[tuple]:
    return [(e["name"], e["source"]) for e in run.journal.entries if e["status"] == "kept"]


def test_resume_after_a_crash_loses_nothing(tmp_path):
    whole = Synthesis(_options(tmp_path / "whole.parquet", 10), progress=lambda line: None)
    whole.run()
    crashed = Synthesis(_options(tmp_path / "t.parquet", 10), progress=_crash_after(4))
    with pytest.raises(Crash):
        crashed.run()
    assert crashed.pool.start_times and crashed.pool.live_workers() == 0  # the crash ended the workers
    before = list(crashed.journal.entries)
    assert len(before) == 4
    resumed = Synthesis(_options(tmp_path / "t.parquet", 10), progress=lambda line: None)
    assert resumed.journal.entries == before  # replayed, not redone
    resumed.run()
    kept_before = sum(e["status"] == "kept" for e in before)
    assert resumed.kept_this_session() == 10 - kept_before  # its tasks per hour count only its own
    report = write_report(resumed.journal.entries, resumed.quotas, resumed.o.config.composition, (3600.0, 6),
                          tmp_path / "r.md", None, resumed.journal_settings()).read_text()
    assert "this session: 6 tasks kept in 3600.0 s, 6 kept tasks per hour (4 kept by earlier sessions)" in report
    keys = [e["key"] for e in resumed.journal.entries]
    assert len(keys) == len(set(keys))
    assert resumed.journal.entries[:4] == before
    assert _kept(resumed) == _kept(whole) and len(_kept(whole)) == 10
    assert journal_path(tmp_path / "t.parquet").exists()


def _cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "cuda_agent.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize("args, message", [
    (["--count", "0"], "--count must be at least 1"),
    (["--count", "3", "--eval-dir", "/nonexistent/evals"], "no such evaluation folder"),
    (["--count", "3", "--scale", "huge"], "unknown scale"),
])
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, args, message):
    done = _cli("data", "synthesize", "--out", str(tmp_path / "t.parquet"), "--backend", "host", *args)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: ") and message in errors[0]


def test_the_cuda_backend_without_a_gpu_is_refused_before_the_journal_is_touched(tmp_path, monkeypatch):
    """On a machine that shows no GPU (here made so with CUDA_VISIBLE_DEVICES empty), a cuda run used to
    reject every candidate at its load ("Torch not compiled with CUDA enabled") and journal it as
    decided: candidates lost to the later run on a GPU. The command and the API refuse it up front, and
    an existing journal keeps its bytes."""
    out = tmp_path / "t.parquet"
    journal = journal_path(out)
    journal.write_text('{"kind": "settings"}\n')
    before = journal.read_bytes()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    done = _cli("data", "synthesize", "--out", str(out), "--count", "3", "--backend", "cuda", "--scale", "paper")
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert errors[0].startswith("error: backend cuda needs an NVIDIA GPU"), errors
    options = RunOptions(out=out, count=3, config=SynthesisConfig(), backend="cuda", eval_dir=EXAMPLES)
    with pytest.raises(SynthesisError, match="backend cuda needs an NVIDIA GPU"):
        Synthesis(options, progress=lambda line: None)
    assert journal.read_bytes() == before and not out.exists()


def test_a_cuda_run_is_resumed_only_on_the_gpu_model_it_started_on(tmp_path, monkeypatch):
    """The time window is the GPU's: a journal begun on one model and continued on another would hold
    tasks filtered by two different windows. The header names the GPU, and a resume elsewhere is refused."""
    from task_synthesis.pipeline.journal import JournalError

    import cuda_agent.contracts as contracts
    import task_synthesis.pipeline.run as run_module

    monkeypatch.setattr(run_module, "_check_backend", lambda backend: None)
    out = tmp_path / "t.parquet"
    options = RunOptions(out=out, count=1, config=SynthesisConfig(), backend="cuda", eval_dir=EXAMPLES)
    monkeypatch.setattr(contracts, "visible_gpu_names", lambda: ["NVIDIA H200", "NVIDIA H200"])
    Synthesis(options, progress=lambda line: None)
    header = json.loads(journal_path(out).read_text().splitlines()[0])
    assert header["settings"]["gpu"] == "NVIDIA H200"
    Synthesis(options, progress=lambda line: None)  # the same model resumes
    monkeypatch.setattr(contracts, "visible_gpu_names", lambda: ["NVIDIA H100 80GB HBM3"])
    with pytest.raises(JournalError, match=r"other settings \(gpu differ\)"):
        Synthesis(options, progress=lambda line: None)


def test_without_a_gpu_no_gpu_name_is_read(monkeypatch):
    from cuda_agent.contracts import visible_gpu_names

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpu_names() == []


def _descendants(root: int) -> dict[int, str]:
    """pid -> start time of every process below `root` (the start time tells a reused pid apart)."""
    parents, starts = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            parents[int(entry)], starts[int(entry)] = int(fields[1]), fields[19]
    found, frontier = {}, {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier and pid not in found}
        found.update({pid: starts[pid] for pid in frontier})
    return found


def _alive(pid: int, start: str) -> bool:
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[19] == start and fields[0] != "Z"


@pytest.fixture(scope="module")
def stopped_and_resumed_run(tmp_path_factory) -> SimpleNamespace:
    """One `data synthesize` run of five tasks, stopped by SIGTERM once its first decision is journaled, then
    resumed to the end. test_sigterm_... checks the stop and the resume, test_synthesized_... the tasks kept:
    a run's workers, evaluator children and self-checks are its time, so the two tests share one."""
    tmp_path = tmp_path_factory.mktemp("synthesize")
    out = tmp_path / "tasks.parquet"
    args = ["data", "synthesize", "--out", str(out), "--count", "5", "--backend", "host", "--workers", "2",
            "--eval-dir", str(EXAMPLES), "--no-compile", "--cache-dir", str(tmp_path / "cache")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.Popen([sys.executable, "-m", "cuda_agent.cli", *args], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    journal = journal_path(out)
    seen: dict[int, str] = {}
    for _ in range(600):  # until the first decision is journaled, at most a minute
        seen.update(_descendants(run.pid))
        if journal.exists() and journal.read_text().count("\n") >= 2 or run.poll() is not None:
            break
        time.sleep(0.1)
    ended_early = run.poll() is not None
    seen.update(_descendants(run.pid))
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=120)
    time.sleep(1.0)
    left = [pid for pid, start in seen.items() if _alive(pid, start)]
    decided = journal.read_text().count("\n")
    resumed = _cli(*args)
    return SimpleNamespace(out=out, cache=tmp_path / "cache", ended_early=ended_early, stopped_code=run.returncode,
                           stopped_err=err, left=left, decided=decided, resumed=resumed)


def test_synthesized_tasks_load_and_self_check_correct_in_bench(stopped_and_resumed_run, tmp_path):
    import pyarrow.parquet as pq

    from evaluator_cuda.tasks import load_tasks

    out, done = stopped_and_resumed_run.out, stopped_and_resumed_run.resumed
    assert done.returncode == 0, done.stderr[-2000:]
    assert "kept" in done.stderr  # progress lines
    table = pq.read_table(out)
    assert table.num_rows == 5
    assert {"code", "name", "ops", "composition", "num_ops", "data_source", "eval_similarity"} <= set(
        table.column_names)
    assert max(table.column("eval_similarity").to_pylist()) < 0.9
    # 5 x the shares: 0.17, 4.19, 0.38, 0.14, 0.06, 0.06: four 2-operator tasks, then the largest remainder
    # (the quotas of more categories: test_task_synthesis.py::test_quotas_follow_the_paper_composition)
    assert sorted(table.column("composition").to_pylist()) == ["2"] * 4 + ["3"]
    loaded = load_tasks(out)
    assert len(loaded.tasks) == 5 and not loaded.problems
    report = out.with_name("tasks.report.md").read_text()
    assert "## Composition against the target" in report and "## Survival by stage" in report
    assert "- median evaluator wall time of a kept task: wall " in report and "verify " in report
    journal = [json.loads(line) for line in journal_path(out).read_text().splitlines()[1:]]
    kept = [e for e in journal if e["status"] == "kept"]
    assert all(0 < e["evaluator_verify_s"] < e["evaluator_wall_s"] for e in kept)  # the evaluator's own split
    assert out.with_name("tasks.similarity.png").stat().st_size > 0
    bench = _cli("bench", str(out), "--backend", "host", "--no-profile", "--out", str(tmp_path / "bench"),
                 "--cache-dir", str(stopped_and_resumed_run.cache))
    assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-2000:]


def test_sigterm_ends_the_workers_and_their_evaluator_children_and_the_run_resumes(stopped_and_resumed_run):
    run = stopped_and_resumed_run
    assert not run.ended_early, "the run ended before it could be stopped"
    assert run.stopped_code == 130, run.stopped_err[-2000:]
    assert run.stopped_err.strip().splitlines()[-1].startswith("stopped: "), run.stopped_err[-500:]
    assert not run.left, f"processes outlived the stopped run: {run.left}"
    assert run.resumed.returncode == 0, run.resumed.stderr[-2000:]
    # nothing decided before the stop was redone or lost
    assert journal_path(run.out).read_text().count("\n") >= run.decided


def test_the_cuda_backend_at_a_host_scale_is_pointed_to_the_paper_scale(tmp_path, monkeypatch):
    """At the small scale nearly every task runs below the GPU's 1 ms window (on the H200: 19 kept of
    20,013 tried), so a cuda run at a host scale says which scale to use before it starts."""
    from typer.testing import CliRunner

    import task_synthesis.cli as synthesis_cli
    import task_synthesis.pipeline.run as run_module
    from cuda_agent.cli import app

    def stop_here(*args, **kwargs):
        raise run_module.SynthesisError("stopped by the test before any worker starts")

    monkeypatch.setattr(synthesis_cli, "_backend", lambda backend: "cuda")
    monkeypatch.setattr(run_module, "Synthesis", stop_here)
    command = ["data", "synthesize", "--out", str(tmp_path / "t.parquet"), "--count", "1", "--backend", "cuda"]
    small = CliRunner().invoke(app, command)
    paper = CliRunner().invoke(app, [*command, "--scale", "paper"])
    assert small.exit_code == paper.exit_code == 2
    assert "--scale paper" in small.output and "stopped by the test" in small.output
    assert "--scale paper" not in paper.output and "stopped by the test" in paper.output


def test_a_run_times_its_self_checks_as_its_config_says(tmp_path):
    config = SynthesisConfig(compile=False, evaluation={"host": {"repeats": 3, "warmup": 1}})
    options = RunOptions(out=tmp_path / "t.parquet", count=1, config=config, backend="host", eval_dir=EXAMPLES)
    settings = Synthesis(options, progress=lambda line: None)._evaluator_settings()
    assert (settings["repeats"], settings["warmup"], settings["profile"]) == (3, 1, False)
