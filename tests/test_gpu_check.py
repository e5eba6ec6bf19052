"""scripts/gpu_check.py without a GPU: the jail lane (scripts/check_jail.py --gpu) runs beside the others
under its own limit and its pass or fail is part of the check's verdict; a step past its limit is cut."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fake_steps(jail_result: tuple[int, str], calls: dict):
    """A run_step that answers every step as passed, the jail lane with `jail_result`."""

    def run_step(name, command, limit_s, out, env):
        calls[name] = (command, limit_s)
        if name == "jail":
            return jail_result
        return 0, "11 passed\n"

    return run_step


def _run(monkeypatch, tmp_path, gpu_check, run_step) -> tuple[int, dict]:
    """gpu_check.main() with `run_step` for every step: (exit code, gpu_check.json)."""
    monkeypatch.setattr(gpu_check, "run_step", run_step)
    monkeypatch.setattr(sys, "argv", ["gpu_check.py"])
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    monkeypatch.setenv("GPU_CHECK_WORK", str(tmp_path / "work"))
    code = gpu_check.main()
    return code, json.loads((tmp_path / "out" / "gpu_check.json").read_text())


def _check(monkeypatch, tmp_path, jail_result: tuple[int, str]) -> tuple[int, dict, dict]:
    gpu_check, calls = _script(), {}
    monkeypatch.setattr(gpu_check, "bench_verdicts", lambda report, solutions: [])
    return (*_run(monkeypatch, tmp_path, gpu_check, _fake_steps(jail_result, calls)), calls)


def test_the_jail_lane_runs_check_jail_on_the_gpu_under_its_own_limit(monkeypatch, tmp_path):
    gpu_check = _script()
    code, summary, calls = _check(monkeypatch, tmp_path, (0, "... nvcc ok 1\nJAIL CHECK PASS\n"))
    command, limit = calls["jail"]
    assert command[1:3] == ["scripts/check_jail.py", "--gpu"]
    assert limit == gpu_check.JAIL_LIMIT_S < gpu_check.TOTAL_LIMIT_S
    assert code == 0 and summary["passed"] and summary["failures"] == []


def test_a_failing_jail_lane_fails_the_check(monkeypatch, tmp_path, capsys):
    tail = "torch in the jail: no device\nJAIL CHECK FAIL: torch.cuda in the jail\n"
    code, summary, _ = _check(monkeypatch, tmp_path, (1, tail))
    assert code == 1 and not summary["passed"]
    assert summary["failures"] == ["jail (exit 1): JAIL CHECK FAIL: torch.cuda in the jail"]
    assert "GPU CHECK FAIL: jail (exit 1)" in capsys.readouterr().out


def test_a_jail_lane_cut_at_its_limit_or_without_its_pass_line_fails():
    gpu_check = _script()
    assert gpu_check.jail_failures(0, "JAIL CHECK PASS\n") == []
    assert gpu_check.jail_failures(124, "... torch on CUDA in the jail\n") == [
        "jail (cut at its limit): ... torch on CUDA in the jail"]
    assert gpu_check.jail_failures(0, "start-up (median of 5 ): {}\n") == ["jail (exit 0): start-up (median of 5 ): {}"]


def test_a_step_that_hangs_is_cut_at_its_limit_after_showing_its_lines(tmp_path, capsys):
    gpu_check = _script()
    hang = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(600)"]
    rc, tail = gpu_check.run_step("hang", hang, 2, tmp_path, {"PATH": "/usr/bin:/bin"})
    assert rc == 124 and "started" in tail
    assert "[hang] started" in capsys.readouterr().out
    assert "cut at its 2 s limit" in (tmp_path / "hang.log").read_text()


def _bench_records(withheld: set[str]) -> list[dict]:
    """Records of the example solutions as the bench writes them: honest ones correct, `__wrong` ones
    incorrect, the speed-ups of `withheld` candidates withheld for drift."""
    from evaluator_cuda.solutions import read_solution

    records = []
    for path in sorted((SCRIPT.parents[1] / "examples" / "solutions" / "cuda").iterdir()):
        label = read_solution(path).label
        wrong = "__wrong" in path.name
        record = {"candidate": label, "status": "incorrect" if wrong else "correct", "reward": -1 if wrong else 2,
                  "message": "", "persisting_l2_reset": True, "baseline_persisting_l2_reset": True}
        if path.name in withheld:
            record.update(reward=1, speedup_withheld=["eager drifted: 67.3 us per call before, 2567.8 after"])
        records.append(record)
    return records


def _check_with_bench(monkeypatch, tmp_path, withheld_first: set[str], withheld_again: set[str]):
    """The check with every lane passing, the bench withholding `withheld_first` and, timed again alone,
    `withheld_again`."""
    gpu_check, calls = _script(), {}

    def run_step(name, command, limit_s, out, env):
        calls[name] = (command, limit_s)
        if "--out" in command:
            report = Path(command[command.index("--out") + 1]) / "report.json"
            report.parent.mkdir(parents=True, exist_ok=True)
            records = _bench_records(withheld_first if name == "bench" else withheld_again)
            if name != "bench":  # one task's file: its own solutions only
                records = [r for r in records if r["candidate"].startswith(command[4].split("/")[-1][:-3])]
            report.write_text(json.dumps({"records": records}))
        return 0, "JAIL CHECK PASS\n" if name == "jail" else "11 passed\n"

    return (*_run(monkeypatch, tmp_path, gpu_check, run_step), calls)


def test_a_speed_up_withheld_while_the_gpu_was_shared_is_timed_again_alone_and_that_verdict_counts(monkeypatch, tmp_path):
    code, summary, calls = _check_with_bench(monkeypatch, tmp_path, {"gemm_bias_gelu"}, set())
    assert code == 0 and summary["passed"], summary["failures"]
    assert summary["bench_withheld_while_shared"] == ["gemm_bias_gelu"]
    command, _ = calls["bench_again_gemm_bias_gelu"]
    assert command[2:5] == ["cuda_agent.cli", "bench", "examples/tasks/gemm_bias_gelu.py"]
    assert [name for name in calls if name.startswith("bench_again")] == ["bench_again_gemm_bias_gelu"]
    report = json.loads((tmp_path / "out" / "bench_report.json").read_text())
    assert len(report["records"]) == len(_bench_records(set()))
    assert not any(r.get("speedup_withheld") for r in report["records"])


def test_a_speed_up_withheld_again_with_the_gpu_to_itself_fails_the_check(monkeypatch, tmp_path):
    code, summary, _ = _check_with_bench(monkeypatch, tmp_path, {"gemm_bias_gelu", "layernorm"}, {"layernorm"})
    assert code == 1 and not summary["passed"]
    assert summary["failures"] == ["bench: layernorm: an honest kernel's speed-up withheld: "
                                   "eager drifted: 67.3 us per call before, 2567.8 after"]


def test_a_check_without_withheld_speed_ups_times_nothing_again(monkeypatch, tmp_path):
    code, summary, calls = _check_with_bench(monkeypatch, tmp_path, set(), {"layernorm"})
    assert code == 0 and summary["passed"]
    assert "bench_withheld_while_shared" not in summary
    assert not [name for name in calls if name.startswith("bench_again")]


def test_the_small_output_table_follows_the_jail_in_its_lane_and_its_failure_fails_the_check(monkeypatch, tmp_path):
    gpu_check, order = _script(), []
    monkeypatch.setattr(gpu_check, "bench_verdicts", lambda report, solutions: [])

    def run_step(name, command, limit_s, out, env):
        order.append(name)
        if name == "jail":
            return 0, "JAIL CHECK PASS\n"
        if name == "small_outputs":
            assert command[1] == "scripts/check_small_outputs.py" and env["CUDA_AGENT_CACHE"].endswith("cache_jail")
            return 1, "zeros: correct (expected incorrect)\n"
        return 0, "11 passed\n"

    code, summary = _run(monkeypatch, tmp_path, gpu_check, run_step)
    assert order.index("small_outputs") > order.index("jail")
    assert {"cuda_tests", "cheats", "bench"} <= set(order)
    assert code == 1 and summary["failures"] == ["small outputs: zeros: correct (expected incorrect)"]


@pytest.mark.parametrize("side", ["persisting_l2_reset", "baseline_persisting_l2_reset"])
def test_an_honest_record_whose_calls_did_not_all_demote_persisting_l2_lines_is_a_problem(tmp_path, side):
    """The candidate's calls and the baselines' must both have the driver's persisting-L2 reset: a side
    without it is timed on other terms (the reference child once never bound it)."""
    gpu_check = _script()
    records = _bench_records(set())
    records[0][side] = None
    (tmp_path / "report.json").write_text(json.dumps({"records": records}))
    problems = gpu_check.bench_verdicts(tmp_path / "report.json", SCRIPT.parents[1] / "examples" / "solutions")
    assert len(problems) == 1 and "persisting L2 lines not demoted" in problems[0], problems
    records[0][side] = True
    (tmp_path / "report.json").write_text(json.dumps({"records": records}))
    assert gpu_check.bench_verdicts(tmp_path / "report.json", SCRIPT.parents[1] / "examples" / "solutions") == []
