"""Export to Hugging Face safetensors: transformers loads what we write and its logits match ours;
our importer reads it back to the same parameters."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from policy_helpers import random_model
from policy_jax.model_config import ModelConfig
from policy_jax.params_export import export_hf_checkpoint
from policy_jax.params_import import CheckpointError, load_hf_checkpoint
from policy_jax.sharding import iter_variables
from policy_jax.transformer import CausalLM, Critic

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 128
SHAPES = {
    # Qwen2 family: q/k/v bias, tied embeddings
    "qwen2": dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, attention_bias=True, tie_word_embeddings=True, rope_theta=10000.0),
    # Llama family: separate head, Llama-3 rope scaling, head_dim not hidden/heads
    "llama": dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=1, head_dim=32, rope_theta=50000.0, rms_norm_eps=1e-5, rope_scaling_type="llama3",
                  rope_scaling_factor=8.0, rope_original_max_position_embeddings=16, max_position_embeddings=256),
}


def _ours(which):
    return random_model(CausalLM, ModelConfig(**SHAPES[which], compute_dtype="float32"), seed=3, scale=2.0)


@pytest.mark.parametrize("which", sorted(SHAPES))
def test_transformers_loads_the_export_and_its_logits_match_ours(which, tmp_path):
    ours = _ours(which)
    export_hf_checkpoint(ours, tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == which
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), torch_dtype=torch.float32).eval()
    tokens = np.random.default_rng(0).integers(0, VOCAB, size=(2, 24))
    with torch.no_grad():
        ref = hf(input_ids=torch.as_tensor(tokens)).logits.numpy()
    got = np.asarray(nnx.jit(lambda m, t: m(t))(ours, jnp.asarray(tokens)))
    assert np.abs(ref).max() > 1.0
    np.testing.assert_allclose(got, ref, atol=2e-4, rtol=0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_importer_reads_the_export_back_to_the_same_parameters(dtype, tmp_path):
    ours = _ours("llama")
    export_hf_checkpoint(ours, tmp_path / "hf", dtype=dtype)
    back = load_hf_checkpoint(tmp_path / "hf", cfg=ours.config)
    expected = {path: np.asarray(var.get_value()).astype(jnp.dtype(dtype)).astype(np.float32) for path, var in iter_variables(ours)}
    got = {path: np.asarray(var.get_value()).astype(np.float32) for path, var in iter_variables(back)}
    assert expected.keys() == got.keys()
    for path in expected:
        np.testing.assert_array_equal(got[path], expected[path], err_msg=str(path))


def test_tokenizer_files_travel_and_bad_requests_are_one_line_errors(tmp_path):
    ours = _ours("qwen2")
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    export_hf_checkpoint(ours, tmp_path / "hf", tokenizer_dir=tmp_path / "tok")
    assert (tmp_path / "hf" / "tokenizer.json").read_text() == "{}"
    with pytest.raises(CheckpointError, match="exists and is not empty"):
        export_hf_checkpoint(ours, tmp_path / "hf")
    with pytest.raises(CheckpointError, match="no tokenizer files"):
        export_hf_checkpoint(ours, tmp_path / "other", tokenizer_dir=tmp_path)
    assert not (tmp_path / "other").exists()  # nothing half-written
    critic = random_model(Critic, ModelConfig(**SHAPES["qwen2"]), seed=1)
    with pytest.raises(CheckpointError, match="has no Hugging Face name"):
        export_hf_checkpoint(critic, tmp_path / "critic")
