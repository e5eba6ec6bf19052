"""The layer-by-layer attention check (policy_jax/attention_check, scripts/check_attention_layers.py):
its exact reference agrees with attention written out in float64 numpy, bf16 kernels pass it with a
measurable error, a kernel that ignores causality fails it, and the script exits 0, 1 or 2 as it says."""

import json
import time

import jax
import numpy as np

from policy_jax import attention_check
from policy_helpers import attention_inputs
from script_helpers import load_script



def _script():
    return load_script("check_attention_layers")


def _numpy_attention(q, k, v, seg):
    """Causal attention within segments, float64, one head at a time; zeros for padding queries."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    seg = np.asarray(seg)
    b, t, n, h = q.shape
    group = n // k.shape[2]
    out = np.zeros_like(q)
    for row in range(b):
        for head in range(n):
            scores = q[row, :, head] @ k[row, :, head // group].T / np.sqrt(h)
            allowed = np.tril(np.ones((t, t), bool)) & (seg[row][:, None] == seg[row][None, :]) & (seg[row] != 0)
            for i in np.flatnonzero(seg[row]):
                w = np.exp(scores[i, allowed[i]] - scores[i, allowed[i]].max())
                out[row, i, head] = (w / w.sum()) @ v[row, allowed[i], head // group]
    return out


def test_the_exact_reference_is_attention_written_out_in_float64():
    q, k, v, seg = attention_inputs(2, 40, 4, 2, 16, {(0, 25): 2, (1, 30): 0}, seed=3)
    valid = np.asarray(seg) != 0
    got = np.asarray(attention_check.exact_attention(q, k, v, seg))
    np.testing.assert_allclose(got[valid], _numpy_attention(q, k, v, seg)[valid], atol=1e-5, rtol=0)


def _tiny_model():
    from flax import nnx

    from policy_jax.transformer import CausalLM

    cfg = _script().model_config(quick=True, score_std=2.0)
    tokens, segments = _script().batch(cfg, rows=2, tokens=48)
    return CausalLM(cfg, rngs=nnx.Rngs(0)), tokens, segments


def test_bf16_kernels_pass_with_an_error_the_check_can_see():
    lm, tokens, segments = _tiny_model()
    layers = attention_check.check_layers(lm, tokens, segments, ("xla", "blockwise", "splash"), block_size=16)
    assert len(layers) == lm.backbone.config.num_hidden_layers
    for layer in layers:
        assert 1.0 < layer.score_std < 4.0  # peaked attention, as the scaled initialisation aims for
        for kernel, err in layer.rel_max.items():
            assert 2.0 ** -12 < err <= attention_check.TOLERANCE, (layer.layer, kernel, err)


def test_a_kernel_that_ignores_causality_fails(monkeypatch):
    lm, tokens, segments = _tiny_model()
    honest = attention_check.attend

    def leaky(kernel, q, k, v, seg, **kw):
        if kernel != "leaky":
            return honest(kernel, q, k, v, seg, **kw)
        same_segment = (seg[:, :, None] == seg[:, None, :])[:, None]  # no causal mask: later keys are seen
        return jax.nn.dot_product_attention(q, k, v, mask=same_segment, implementation="xla")

    monkeypatch.setattr(attention_check, "attend", leaky)
    layers = attention_check.check_layers(lm, tokens, segments, ("xla", "leaky"), block_size=16)
    assert all(layer.worst() == ("leaky", layer.rel_max["leaky"]) for layer in layers)
    assert min(layer.rel_max["leaky"] for layer in layers) > 10 * attention_check.TOLERANCE


def test_the_script_passes_on_a_cpu_and_writes_its_figures(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert _script().main(["--quick", "--kernels", "xla,blockwise"]) == 0
    out = capsys.readouterr().out
    assert "layer  2" in out and "ATTENTION CHECK PASS" in out
    result = json.loads((tmp_path / "attention_layers.json").read_text())
    assert result["ok"] and set(result["worst_rel_max"]) == {"xla", "blockwise"}
    assert len(result["layers"]) == 3


def test_a_kernel_that_cannot_run_ends_the_script_with_one_line_and_exit_2(capsys):
    assert _script().main(["--quick", "--kernels", "xla,nonsense"]) == 2
    assert "did not finish: ValueError: unknown attention kernel 'nonsense'" in capsys.readouterr().out


def test_the_time_limit_ends_the_script_with_one_line_that_says_so(monkeypatch, capsys):
    script = _script()
    monkeypatch.setattr(script, "run", lambda args: time.sleep(30))
    begin = time.monotonic()
    assert script.main(["--quick", "--budget-s", "0.5"]) == 2
    assert time.monotonic() - begin < 10
    assert "did not finish: TimeoutError: the time limit of 0.5 s was reached" in capsys.readouterr().out
