"""`cuda-agent train` / `train-demo-data`: one clear error line for user mistakes; a CPU run that resumes."""

import json

import pytest
from typer.testing import CliRunner

from cuda_agent.cli import app

RUNNER = CliRunner()


def invoke(*args):
    result = RUNNER.invoke(app, list(args))
    return result.exit_code, result.output


def test_user_errors_are_one_line(tmp_path):
    data = tmp_path / "d.parquet"
    code, out = invoke("train-demo-data", "--out", str(data), "--rows", "4", "--max-len", "16")
    assert code == 0 and "wrote 4 trajectories" in out
    cases = [
        (["--stage", "rft", "--config", "configs/tiny.yaml", "--data", str(tmp_path / "none.parquet")], "trajectory file not found"),
        (["--stage", "rft", "--config", str(tmp_path / "none.yaml"), "--data", str(data)], "no config file"),
        (["--stage", "sft", "--config", "configs/tiny.yaml", "--data", str(data)], "unknown stage 'sft'"),
        (["--stage", "rft", "--config", "configs/tiny.yaml"], "--stage needs --data"),
        (["--config", "configs/tiny.yaml"], "the config has no `stages` list"),
        (["--stage", "rft", "--config", "configs/tiny.yaml", "--data", str(data), "--devices", "0"],
         "--devices must be between 1 and"),
    ]
    long = tmp_path / "long.parquet"  # every trajectory longer than the tiny config's 64-token window
    assert invoke("train-demo-data", "--out", str(long), "--rows", "4", "--max-len", "400")[0] == 0
    cases.append((["--stage", "rft", "--config", "configs/tiny.yaml", "--data", str(long)], "longer than train.seq_len=64); raise train.seq_len"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(open("configs/tiny.yaml").read().replace("train:\n", "train:\n  batch: 3\n"))
    cases.append((["--stage", "rft", "--config", str(bad), "--data", str(data)], "unknown keys in train: batch"))
    for args, message in cases:
        code, out = invoke("train", *args, "--checkpoint-dir", str(tmp_path / "ck"))
        assert code == 2, out
        lines = out.strip().splitlines()
        assert lines[-1].startswith("error: ") and message in lines[-1], out
        assert "Traceback" not in out


@pytest.mark.slow  # two model inits and compiles: ~40 s of CPU
def test_rft_run_then_resume(tmp_path):
    data = tmp_path / "d.parquet"
    invoke("train-demo-data", "--out", str(data), "--rows", "32", "--max-len", "48")
    common = ["train", "--stage", "rft", "--config", "configs/tiny.yaml", "--data", str(data),
              "--checkpoint-dir", str(tmp_path / "ck"), "--devices", "1"]
    code, out = invoke(*common, "--steps", "2", "--log-file", str(tmp_path / "log.jsonl"),
                       "--tensorboard-dir", str(tmp_path / "tb"))
    assert code == 0, out
    assert '"event": "filter"' in out and "actor: 2 updates" in out
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 1
    code, out = invoke(*common, "--steps", "3")
    assert code == 0, out
    assert '"event": "resumed"' in out and '"step": 2' in out and "actor: 3 updates" in out
    logged = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r.get("event") or r["step"] for r in logged] == ["filter", "compiling", 1, 2]

    # The trained actor as a Hugging Face checkpoint: our importer reads back the restored weights.
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from policy_jax.params_import import load_hf_checkpoint
    from policy_jax.run_config import load_run_config
    from policy_jax.train_run import _params_from, make_mesh, new_state

    code, out = invoke("export-hf", "--config", "configs/tiny.yaml", "--from", str(tmp_path / "ck" / "rft" / "actor"),
                       "--out", str(tmp_path / "hf"))
    assert code == 0, out
    cfg = load_run_config("configs/tiny.yaml")
    trained = _params_from(str(tmp_path / "ck" / "rft" / "actor"), new_state("actor", cfg, make_mesh(cfg.mesh), None, 1)).module()
    exported = load_hf_checkpoint(tmp_path / "hf", cfg=cfg.model)
    tokens = jnp.asarray(np.arange(20).reshape(2, 10) % cfg.model.vocab_size)
    forward = nnx.jit(lambda m, t: m(t))
    np.testing.assert_allclose(np.asarray(forward(exported, tokens)), np.asarray(forward(trained, tokens)), atol=1e-5, rtol=0)
    code, out = invoke("export-hf", "--config", "configs/tiny.yaml", "--from", str(tmp_path / "ck" / "rft" / "actor"),
                       "--out", str(tmp_path / "hf"))
    assert code == 2 and out.strip().splitlines()[-1].startswith("error: ") and "not empty" in out
