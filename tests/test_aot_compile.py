"""scripts/aot_compile.py on the tiny config for a 4-chip v5p slice (compiled here for the TPU, run
nowhere): every step compiles on a layout with the sequence split, the decode step's arguments
are the KV cache and parameters each device holds, and a cache larger than HBM makes it exit 1.
Skipped without the libtpu package (the project's tpu-aot extra)."""

import pytest

from policy_jax.aot import libtpu_missing_reason
from script_helpers import load_script

pytestmark = pytest.mark.skipif(libtpu_missing_reason() is not None, reason="needs the libtpu package (tpu-aot extra)")


def _script():
    return load_script("aot_compile")


def test_every_step_of_the_tiny_config_compiles_with_the_sequence_split(capsys):
    code = _script().main(["configs/tiny.yaml", "--topology", "v5p:2x2x1", "--mesh", "1,1,2,2"])
    out = capsys.readouterr().out
    assert code == 0, out
    for name in ("actor PPO step", "critic step", "log-prob recompute", "sampler decode step"):
        line = next(line for line in out.splitlines() if line.startswith(name))
        assert line.split()[-4] == "yes", line  # the fits column
    assert "mesh data=1 fsdp=1 sequence=2 tensor=2: fits" in out


def test_the_decode_step_holds_each_devices_share_of_the_cache_and_parameters():
    from policy_jax.aot import build_mesh, tpu_topology
    from policy_jax.aot_steps import StepShapes, sampler_decode_step
    from policy_jax.run_config import load_run_config
    from policy_jax.sharding import MeshConfig

    cfg = load_run_config("configs/tiny.yaml")
    m = cfg.model
    mesh = build_mesh(MeshConfig(fsdp=4), tpu_topology("v5p:2x2x1"))
    rows, slots = 64, 1024
    step = sampler_decode_step(cfg, mesh, StepShapes(seq_len=slots, update_rows=rows, logprob_rows=rows,
                                                     decode_rows=rows))
    cache = 2 * m.num_hidden_layers * rows * slots * m.num_key_value_heads * m.head_dim * 4  # keys and values, f32
    cache += rows * slots  # the validity flags
    params = m.param_count() * 4  # float32, split over fsdp where the dimension divides by 4: at most all of it
    assert cache // 4 <= step.argument_bytes <= cache // 4 + params + 4096
    assert step.flops > 0


def test_a_cache_larger_than_hbm_exits_non_zero(capsys):
    code = _script().main(["configs/tiny.yaml", "--topology", "v5e:2x2", "--mesh", "1,4,1,1", "--steps", "decode",
                           "--seq-len", "4096", "--decode-rows", "262144"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "does not fit" in out
