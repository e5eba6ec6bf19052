"""`cuda-agent train --config` without --stage: the config's stages in order, a finished stage skipped,
an interrupted one resumed, and the result identical to an uninterrupted run."""

import jax
import numpy as np
import pytest
import yaml

from policy_jax.checkpoint import TrainCheckpointer
from policy_jax.demo_data import write_demo_trajectories
from policy_jax.run_config import RunConfigError, load_run_config
from policy_jax.sharding import make_mesh
from policy_jax.stages import read_trajectory_rows
from policy_jax.train_run import new_state, run_pipeline, run_stage


def pipeline_config(tmp_path, data):
    raw = yaml.safe_load(open("configs/tiny.yaml"))
    raw["checkpoint"]["save_every"] = 1
    raw["ppo"]["mini_batch_size"] = 8  # one update per iteration
    raw["stages"] = [{"stage": "rft", "data": str(data), "steps": 2}, {"stage": "value", "data": str(data), "steps": 2},
                     {"stage": "ppo", "data": str(data), "steps": 1}]
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_run_config(path)


# One device: the stages' order, skipping and resuming do not depend on the mesh (tests/test_train_steps.py
# checks sharded steps against one device), and a checkpoint of the tiny model on eight fake devices takes
# three times as long to save and read back.
DEVICES = jax.devices()[:1]


def final_params(cfg, root):
    mesh = make_mesh(cfg.mesh, DEVICES)
    out = {}
    for role in ("actor", "critic"):
        with TrainCheckpointer(root / "ppo" / role) as ck:
            state, _ = ck.restore(new_state(role, cfg, mesh, None, 2))
        out[role] = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(state.params))]
    return out


@pytest.mark.slow  # seven stage runs of the tiny model on 2 cores
def test_stages_in_order_skip_when_finished_resume_when_interrupted_and_match_an_uninterrupted_run(tmp_path):
    data = write_demo_trajectories(tmp_path / "d.parquet", 32, 512, 48)
    cfg = pipeline_config(tmp_path, data)

    events = []
    latest = run_pipeline(cfg, checkpoint_root=str(tmp_path / "a"), log=events.append, devices=DEVICES)
    assert latest == {"actor": str(tmp_path / "a" / "ppo" / "actor"), "critic": str(tmp_path / "a" / "ppo" / "critic")}
    started = [e["stage"] for e in events if e.get("event") == "start"]
    assert started == ["rft", "value", "ppo"]
    ppo_init = [e for e in events if e.get("stage") == "ppo" and e.get("event") == "initialised"]
    assert {e["role"]: e["from"] for e in ppo_init} == {"actor": str(tmp_path / "a" / "rft" / "actor"),
                                                      "critic": str(tmp_path / "a" / "value" / "critic")}

    # Interrupted inside stage 1 (one of its two RFT steps saved), then the whole pipeline again.
    run_stage(cfg, "rft", read_trajectory_rows(data), 1, checkpoint_root=str(tmp_path / "b"), devices=DEVICES)
    events = []
    run_pipeline(cfg, checkpoint_root=str(tmp_path / "b"), log=events.append, devices=DEVICES)
    resumed = [e for e in events if e.get("event") == "resumed"]
    assert [(e["stage"], e["step"], e["position"]["index"]) for e in resumed] == [("rft", 1, 1)]
    a, b = final_params(cfg, tmp_path / "a"), final_params(cfg, tmp_path / "b")
    for role in ("actor", "critic"):
        for x, y in zip(a[role], b[role]):
            np.testing.assert_array_equal(x, y)

    # Stopped between the PPO actor's save and the critic's: the actor is a step ahead, so both
    # start again from the step they share (none here: from the earlier stages), as in run a.
    with TrainCheckpointer(tmp_path / "b" / "ppo" / "critic") as ck:
        ck.delete(ck.latest_step())
    (tmp_path / "b" / "ppo" / "DONE.json").unlink()
    events = []
    run_pipeline(cfg, checkpoint_root=str(tmp_path / "b"), log=events.append, devices=DEVICES)
    ppo = [(e["event"], e.get("role") or e["step"]) for e in events if e.get("stage") == "ppo" and e.get("event") not in (None, "start")]
    assert ppo[:3] == [("dropped", 1), ("initialised", "actor"), ("initialised", "critic")], ppo
    c = final_params(cfg, tmp_path / "b")
    for role in ("actor", "critic"):
        for x, y in zip(a[role], c[role]):
            np.testing.assert_array_equal(x, y)

    # Finished: every stage is skipped, nothing trains.
    events = []
    run_pipeline(cfg, checkpoint_root=str(tmp_path / "b"), log=events.append, devices=DEVICES)
    assert [(e["stage"], e["event"]) for e in events] == [("rft", "skipped"), ("value", "skipped"), ("ppo", "skipped")]


def test_stage_list_errors(tmp_path):
    raw = yaml.safe_load(open("configs/tiny.yaml"))
    for stages, message in (([{"stage": "sft", "data": "x"}], "unknown stage 'sft'"),
                            ([{"stage": "rft", "data": "x"}, {"stage": "rft", "data": "y"}], "each stage may appear once"),
                            ([{"stage": "rft"}], "section stages is missing: data"),
                            ({"stage": "rft"}, "stages must be a list")):
        (tmp_path / "c.yaml").write_text(yaml.safe_dump({**raw, "stages": stages}))
        with pytest.raises(RunConfigError, match=message):
            load_run_config(tmp_path / "c.yaml")
