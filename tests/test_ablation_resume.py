"""Resuming `cuda-agent ablate importance-ratio`: a run stopped part-way and run again writes the records of
an uninterrupted run; a line cut short is repaired, a record whose line was never written comes back
from its checkpoint; a run of another config is refused; SIGTERM on the command line is one line and
exit 130. Two arms of configs/ablation_tiny.yaml (one from the RFT actor and pretrained critic, one from
the starting checkpoint; the same PPO settings, so one compile), one seed, two iterations. The runs in this
process share their compiled programs; the command-line test runs the second arm alone, which needs no warm
start, on the first of this process's eight devices (`--devices 1`), so that its processes read the programs
back from the run's compilation cache; a stop during the warm start is tested in this process."""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("jax")

from ablations.config import ablation_config_from_dict  # noqa: E402
from ablations.report_data import CONFIG_FILE, DATA_FILE  # noqa: E402
from ablations.resume import arm_records  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FIRST, SECOND = "bf16-sampler.fp32-old.tis", "no-rft.no-value-pretraining"
WALL_CLOCK = ("rollout_s", "train_s")


def _raw(arms=(FIRST, SECOND)) -> dict:
    raw = yaml.safe_load((REPO / "configs" / "ablation_tiny.yaml").read_text())
    raw["arms"] = [a for a in raw["arms"] if a["name"] in arms]
    return raw


def _run(cfg, out, say=lambda line: None, **kwargs):
    import jax

    from ablations.runner import run_ablation

    return run_ablation(cfg, out, say=say, devices=jax.devices()[:1], report=False, **kwargs)


def _numbers(out: Path) -> list[dict]:
    """The records as written, less their wall-clock fields."""
    records = [json.loads(line) for line in (out / DATA_FILE).read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in records]


def _ctrl_c_after_the_first_record_of_the_second_arm(line: str) -> None:
    if line.startswith(f"[{SECOND} seed 0] iteration 1/2"):
        os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, at a known moment: just after that iteration's commit


def _stop_after_the_first_record_of_the_second_arm(cfg, out: Path, uninterrupted: Path, saved: int) -> None:
    """Ctrl-C just after the second arm's first record: the command's one line says how many of that arm's
    iterations are saved (checkpointed), and the records so far are the uninterrupted run's first three."""
    from ablations.stopping import Stopped

    with pytest.raises(Stopped) as stop:
        _run(cfg, out, _ctrl_c_after_the_first_record_of_the_second_arm)
    assert str(stop.value) == (f"Ctrl-C in arm {SECOND} seed 0 with {saved}/2 iterations saved; "
                               "run the same command again to resume")
    assert _numbers(out) == _numbers(uninterrupted)[:3]


def _iteration_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("[") and "] iteration " in line]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run the resumed ones are compared against."""
    cfg = ablation_config_from_dict(_raw())
    out = _run(cfg, tmp_path_factory.mktemp("uninterrupted"))
    assert [(r["arm"], r["iteration"]) for r in _numbers(out)] == [(FIRST, 0), (FIRST, 1), (SECOND, 0), (SECOND, 1)]
    return cfg, out


@pytest.mark.slow
def test_a_run_stopped_inside_an_arm_resumes_to_the_records_of_an_uninterrupted_run(reference, tmp_path):
    cfg, uninterrupted = reference
    out = tmp_path / "run"
    _stop_after_the_first_record_of_the_second_arm(cfg, out, uninterrupted, saved=1)

    lines = []
    _run(cfg, out, lines.append)
    assert f"arm 1/2 {FIRST} seed 0: finished, skipped" in lines
    assert f"resuming: arm {SECOND} seed 0 from iteration 2/2" in lines
    assert [line.split("  ")[0] for line in _iteration_lines(lines)] == [f"[{SECOND} seed 0] iteration 2/2"]
    assert _numbers(out) == _numbers(uninterrupted)  # every number equal: the restored state is the exact one

    again = []
    _run(cfg, out, again.append)
    assert not _iteration_lines(again) and _numbers(out) == _numbers(uninterrupted)


@pytest.mark.slow
def test_with_sparser_checkpoints_a_stop_reruns_the_iterations_since_the_last_one(reference, tmp_path):
    """checkpoint_every 2: the second arm's first iteration writes its record but no checkpoint; after a stop
    there, the resume drops that record and runs the arm from its start. Saving less often changes no number."""
    _, uninterrupted = reference
    cfg = ablation_config_from_dict({**_raw(), "checkpoint_every": 2})
    out = tmp_path / "run"
    _stop_after_the_first_record_of_the_second_arm(cfg, out, uninterrupted, saved=0)

    lines = []
    _run(cfg, out, lines.append)
    assert f"{DATA_FILE}: 3 records brought in line with the checkpoints, 2 records" in lines
    assert [line.split("  ")[0] for line in _iteration_lines(lines)] == [
        f"[{SECOND} seed 0] iteration 1/2", f"[{SECOND} seed 0] iteration 2/2"]
    assert _numbers(out) == _numbers(uninterrupted)


def _ctrl_c_during_the_warm_start(line: str) -> None:
    if line.startswith("warm start:"):  # its first line: the RFT training and the value pretraining ahead
        os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.slow
def test_a_run_stopped_during_the_warm_start_computes_it_again_to_the_same_records(reference, tmp_path):
    from ablations.stopping import Stopped

    cfg, uninterrupted = reference
    out = tmp_path / "run"
    with pytest.raises(Stopped) as stop:
        _run(cfg, out, _ctrl_c_during_the_warm_start)
    assert str(stop.value) == "Ctrl-C during the warm start; run the same command again to resume"
    assert _numbers(out) == [] and not (out / "checkpoints" / "start").exists()

    lines = []
    _run(cfg, out, lines.append)
    assert any(line.startswith("warm start: value pretraining") for line in lines)  # computed again, not read back
    assert _numbers(out) == _numbers(uninterrupted)


@pytest.mark.slow
def test_a_cut_last_line_is_dropped_and_its_record_comes_back_from_the_checkpoint(reference, tmp_path):
    cfg, uninterrupted = reference
    out = tmp_path / "run"
    shutil.copytree(uninterrupted, out)
    whole = (out / DATA_FILE).read_text()
    last = whole.splitlines(keepends=True)[-1]
    (out / DATA_FILE).write_text(whole[:-len(last)] + last[:len(last) // 2])  # stopped while writing the line

    lines = []
    _run(cfg, out, lines.append)
    assert (out / DATA_FILE).read_text() == whole  # byte for byte, its times too: nothing ran again
    assert not _iteration_lines(lines)
    assert f"{DATA_FILE}: 3 records and a line cut short brought in line with the checkpoints, 4 records" in lines


@pytest.mark.slow
def test_a_step_only_the_actor_reached_is_dropped_and_the_critic_s_step_restored(reference, tmp_path):
    import jax
    import numpy as np

    from ablations.checkpoints import ArmCheckpoints
    from ablations.engines import Engines
    from policy_jax.sharding import make_mesh
    from policy_jax.stages import PPOStates

    cfg, _ = reference
    engines = Engines(make_mesh(cfg.run.mesh, jax.devices()[:1]), total_steps=16)
    fresh = PPOStates(engines.state("actor", cfg.run, None), engines.state("critic", cfg.run, None))

    def at(step):
        return PPOStates(*(s.replace(step=s.step + step, params=jax.tree.map(lambda p: p + step, s.params))
                           for s in (fresh.actor, fresh.critic)))

    directory = tmp_path / "arm"
    with ArmCheckpoints(directory) as saved:
        saved.save(at(8), 1, {"iteration": 0})
        saved.save(at(16), 2, {"iteration": 1})
    shutil.rmtree(directory / "critic" / "16")  # stopped between the actor's save and the critic's
    with ArmCheckpoints(directory) as saved:
        assert saved.progress() == (1, {"iteration": 0})
        states, done = saved.restore(fresh)
        assert done == 1 and saved.roles["actor"].all_steps() == [8]
    assert int(states.actor.step) == 8 and int(states.critic.step) == 8
    for restored, expected in zip(jax.tree.leaves(states.actor.params), jax.tree.leaves(at(8).actor.params)):
        np.testing.assert_array_equal(np.asarray(restored), np.asarray(expected))


def _record(iteration, **extra):
    return {"arm": "a", "seed": 0, "iteration": iteration, **extra}


def test_records_are_brought_in_line_with_the_checkpoint():
    r0, r1, r2 = _record(0), _record(1), _record(2)
    assert arm_records([r0, r1], 2, r1) == [r0, r1]
    assert arm_records([r0], 2, r1) == [r0, r1]  # saved with its checkpoint, its line not written yet
    assert arm_records([r0, r1, r2], 2, r1) == [r0, r1]  # written, but its checkpoint was not: it runs again
    assert arm_records([r1, r0], 0, None) == []
    ended = [r0, _record(1, stopped="non-finite loss")]
    assert arm_records(ended, 1, r0) == ended  # a run that ended stays as it is
    with pytest.raises(ValueError, match="the records of an arm do not match its checkpoint of 2 iterations"):
        arm_records([r1], 2, r1)


def test_parameters_that_cannot_be_saved_end_the_arm_with_a_stopped_line(tmp_path):
    from ablations.resume import finished
    from ablations.run_folder import RunFolder
    from ablations.runner import _commit
    from policy_jax.checkpoint import CheckpointError

    class NonFinite:
        def save(self, states, iterations, record):
            raise CheckpointError("step 16: not saved, non-finite parameters in ['w']")

    folder = RunFolder(tmp_path)
    assert _commit(folder, NonFinite(), None, _record(1)).startswith("non-finite parameters after iteration 2")
    records, cut = folder.read_records()
    assert not cut and records[0] == _record(1) and records[1]["iteration"] == 2 and records[1]["stopped"]
    assert finished(arm_records([_record(0), *records], 1, _record(0)), iterations=5)


def test_another_config_is_refused_in_one_line_and_no_resume_starts_over(tmp_path):
    from typer.testing import CliRunner

    from ablations.run_folder import open_folder
    from cuda_agent.cli import app

    out = tmp_path / "run"
    cfg = ablation_config_from_dict(_raw())
    open_folder(cfg, out, resume=True)
    (out / "checkpoints" / "arms").mkdir(parents=True)
    (out / DATA_FILE).write_text(json.dumps(_record(0)) + "\n")
    changed = _raw()
    changed["run"]["ppo"]["clip_low"] = 0.3
    changed["output_dir"] = "elsewhere"  # where the folder is is not part of the run
    (tmp_path / "changed.yaml").write_text(yaml.safe_dump(changed))
    (tmp_path / "same.yaml").write_text(yaml.safe_dump({**_raw(), "output_dir": "elsewhere"}))
    runner = CliRunner()
    for config, extra, differ in (("changed.yaml", [], "run.ppo.clip_low"), ("same.yaml", ["--iterations", "3"],
                                                                             "iterations")):
        result = runner.invoke(app, ["ablate", "importance-ratio", "--config", str(tmp_path / config),
                                     "--out", str(out), *extra])
        assert result.exit_code == 2, result.output
        assert result.output.strip().splitlines() == [
            f"error: {out} holds a run started with another config ({differ} differ); pass --no-resume to start "
            "over, or choose another --out"]
    assert open_folder(dataclasses.replace(cfg, raw={**cfg.raw, "output_dir": "elsewhere"}), out, True)[1]

    assert not open_folder(cfg, out, resume=False)[1]
    assert (out / DATA_FILE).read_text() == "" and not (out / "checkpoints").exists()
    (out / CONFIG_FILE).unlink()
    (out / DATA_FILE).write_text(json.dumps(_record(0)) + "\n")
    with pytest.raises(ValueError, match=f"holds run data but no {CONFIG_FILE}; pass --no-resume"):
        open_folder(cfg, out, resume=True)


def test_a_second_run_on_the_same_folder_is_refused(tmp_path):
    from ablations.run_folder import locked

    with locked(tmp_path):
        with pytest.raises(ValueError, match=f"another run is writing to {tmp_path}; wait for it to end"):
            with locked(tmp_path):
                pass
    with locked(tmp_path):  # free again once the first has ended
        pass


@pytest.mark.slow  # two command-line runs, each importing JAX
def test_sigterm_stops_the_command_with_one_line_and_exit_130_and_the_same_command_resumes(reference, tmp_path):
    _, uninterrupted = reference
    config, out = tmp_path / "second_arm.yaml", tmp_path / "run"
    config.write_text(yaml.safe_dump(_raw(arms=(SECOND,))))  # no warm start: the arm starts from the checkpoint
    # The first device of the same eight-device platform as the reference run: the same numbers, and the
    # programs that run compiled are read back from the test run's compilation cache.
    args = [sys.executable, "-m", "cuda_agent.cli", "ablate", "importance-ratio", "--config", str(config),
            "--out", str(out), "--devices", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    for line in run.stdout:
        if line.startswith(f"arm 1/1 {SECOND} seed 0:"):  # under way, with the arm's two iterations ahead
            break
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=600)
    assert run.returncode == 130, err[-2000:]
    stops = [line for line in err.splitlines() if line.startswith("stopped: ")]
    assert stops == [err.strip().splitlines()[-1]], err[-2000:]
    assert stops[0].startswith("stopped: SIGTERM ") and stops[0].endswith("; run the same command again to resume")
    assert len(_numbers(out)) < 2

    done = subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"resuming the run in {out}" in done.stdout and (out / "report.md").is_file()
    # the arm's records are those it wrote in the two-arm run: one starting checkpoint, the same seeds
    assert _numbers(out) == [r for r in _numbers(uninterrupted) if r["arm"] == SECOND]
