"""The decoder against Hugging Face transformers (the reference implementation), checkpoint import,
sharding placement, configs and the tokenizer.

The checkpoints are written by `transformers` itself (torch CPU, a test-only dependency) with every
weight randomised — biases and norm scales included — so a wrongly mapped tensor changes the logits.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from policy_jax.model_config import ModelConfig, ModelConfigError
from policy_jax.params_import import CheckpointError, load_critic_from_hf, load_hf_checkpoint
from policy_jax.sharding import MeshConfig, MeshConfigError, logical_to_pspec, make_mesh
from policy_jax.tokenizer import TokenizerError, load_tokenizer
from policy_jax.transformer import CausalLM, Critic
from policy_helpers import random_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-4
VOCAB = 160

QWEN2 = dict(model_type="qwen2", vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, rms_norm_eps=1e-6,
             max_position_embeddings=256, tie_word_embeddings=True)
LLAMA = dict(model_type="llama", vocab_size=VOCAB, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=1, head_dim=32, rope_theta=50000.0, rms_norm_eps=1e-5,
             max_position_embeddings=256, tie_word_embeddings=False, attention_bias=True,
             rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                               original_max_position_embeddings=16))


def _write_checkpoint(directory, hf_cfg: dict, shard_size=None, seed=0):
    """A transformers model with all weights random (scale ~ O(1) logits), saved as safetensors."""
    cfg_cls = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig}[hf_cfg["model_type"]]
    model_cls = {"qwen2": transformers.Qwen2ForCausalLM, "llama": transformers.LlamaForCausalLM}[hf_cfg["model_type"]]
    kwargs = {k: v for k, v in hf_cfg.items() if k != "model_type"}
    config = cfg_cls(**kwargs)
    torch.manual_seed(seed)
    model = model_cls(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif p.ndim == 1:
                p.copy_(0.3 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / np.sqrt(p.shape[-1]))
    save = dict(safe_serialization=True)
    if shard_size:
        save["max_shard_size"] = shard_size
    model.save_pretrained(str(directory), **save)
    return model


@pytest.fixture(scope="module")
def qwen2_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen2")
    return d, _write_checkpoint(d, QWEN2, seed=1)


@pytest.fixture(scope="module")
def llama_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    return d, _write_checkpoint(d, LLAMA, shard_size="40KB", seed=2)


def _hf_logits(model, tokens_bt, attention_mask_bt=None, position_ids_bt=None):
    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(np.asarray(tokens_bt), dtype=torch.long),
                    attention_mask=None if attention_mask_bt is None else torch.as_tensor(np.asarray(attention_mask_bt)),
                    position_ids=None if position_ids_bt is None else torch.as_tensor(np.asarray(position_ids_bt)))
    return out.logits.float().numpy()


def _fp32(directory):
    return ModelConfig.from_hf_config(directory, compute_dtype="float32")


@pytest.mark.parametrize("which", ["qwen2", "llama"])
def test_logits_match_transformers_on_padded_batch(which, qwen2_ckpt, llama_ckpt):
    directory, hf = {"qwen2": qwen2_ckpt, "llama": llama_ckpt}[which]
    ours = load_hf_checkpoint(directory, cfg=_fp32(directory))
    rng = np.random.default_rng(0)
    lengths = np.array([12, 7, 1])
    tokens = rng.integers(0, VOCAB, size=(3, 12))
    valid = np.arange(12)[None, :] < lengths[:, None]  # right padding
    tokens = np.where(valid, tokens, 0)
    segment_ids = valid.astype(np.int32)
    ref = _hf_logits(hf, tokens, attention_mask_bt=valid.astype(np.int64))
    forward = nnx.jit(lambda m, t, p, s: m(t, p, s))
    positions = np.broadcast_to(np.arange(12), tokens.shape)
    got = np.asarray(forward(ours, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segment_ids)))
    assert got.shape == ref.shape
    assert np.abs(ref).max() > 1.0  # the comparison is not between near-zero numbers
    np.testing.assert_allclose(got[valid], ref[valid], atol=TOL, rtol=0)

    # left padding: explicit per-row positions starting at 0 on the first real token
    left_valid = valid[:, ::-1]
    left_tokens = np.where(left_valid, tokens[:, ::-1], 0)
    positions = np.maximum(np.cumsum(left_valid, axis=1) - 1, 0)
    ref_left = _hf_logits(hf, left_tokens, left_valid.astype(np.int64), positions)
    got_left = np.asarray(forward(ours, jnp.asarray(left_tokens), jnp.asarray(positions),
                                  jnp.asarray(left_valid.astype(np.int32))))
    np.testing.assert_allclose(got_left[left_valid], ref_left[left_valid], atol=TOL, rtol=0)


def test_packed_segments_equal_separate_sequences(llama_ckpt):
    """Two documents packed in one row (segment ids 1, 2; positions restart) score as if run alone."""
    directory, hf = llama_ckpt
    ours = load_hf_checkpoint(directory, cfg=_fp32(directory))
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, VOCAB, 6), rng.integers(0, VOCAB, 5)
    tokens = np.concatenate([a, b, [0]])[None]
    segment_ids = np.array([[1] * 6 + [2] * 5 + [0]])
    positions = np.array([list(range(6)) + list(range(5)) + [0]])
    got = np.asarray(nnx.jit(lambda m: m(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segment_ids)))(ours))[0]
    np.testing.assert_allclose(got[:6], _hf_logits(hf, a[None])[0], atol=TOL, rtol=0)
    np.testing.assert_allclose(got[6:11], _hf_logits(hf, b[None])[0], atol=TOL, rtol=0)


def test_sharded_index_is_used_and_mesh_placement_keeps_logits(llama_ckpt):
    directory, _ = llama_ckpt
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # really several shard files
    cfg = _fp32(directory)
    single = load_hf_checkpoint(directory, cfg=cfg)
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    sharded = load_hf_checkpoint(directory, cfg=cfg, mesh=mesh)
    q = sharded.backbone.layers[0].self_attn.q_dnh.get_value()
    assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
    # each device holds a quarter of q (fsdp x tensor), read straight from the file
    assert {s.data.shape for s in q.addressable_shards} == {(32, 2, 32)}
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, VOCAB, size=(2, 9)))
    forward = nnx.jit(lambda m: m(tokens))
    np.testing.assert_allclose(np.asarray(forward(sharded)), np.asarray(forward(single)), atol=1e-5, rtol=0)


def test_bf16_params_and_compute_stay_close(qwen2_ckpt):
    directory, hf = qwen2_ckpt
    ours = load_hf_checkpoint(directory, dtype="bfloat16")
    assert ours.backbone.layers[0].mlp.gate_df.get_value().dtype == jnp.bfloat16
    tokens = np.random.default_rng(3).integers(0, VOCAB, size=(2, 10))
    got = np.asarray(nnx.jit(lambda m: m(jnp.asarray(tokens)))(ours)).astype(np.float32)
    ref = _hf_logits(hf, tokens)
    assert np.abs(got - ref).max() < 0.1 * np.abs(ref).max()


def test_param_count_matches_transformers(qwen2_ckpt, llama_ckpt):
    for directory, hf in (qwen2_ckpt, llama_ckpt):
        cfg = ModelConfig.from_hf_config(directory)
        assert cfg.param_count() == sum(p.numel() for p in hf.parameters())
        ours = load_hf_checkpoint(directory, cfg=cfg)
        n = sum(x.size for x in jax.tree.leaves(nnx.state(ours, nnx.Param)))
        assert n == cfg.param_count()


def test_critic_backbone_from_checkpoint_and_zero_value_head(llama_ckpt):
    directory, _ = llama_ckpt
    cfg = _fp32(directory)
    critic = load_critic_from_hf(directory, cfg=cfg)
    lm = load_hf_checkpoint(directory, cfg=cfg)
    tokens = jnp.asarray(np.random.default_rng(4).integers(0, VOCAB, size=(2, 7)))
    backbone = nnx.jit(lambda m: m.backbone(tokens))
    np.testing.assert_array_equal(np.asarray(backbone(critic)), np.asarray(backbone(lm)))
    values = nnx.jit(lambda m: m(tokens))(critic)
    assert values.dtype == jnp.float32 and values.shape == (2, 7)
    assert np.all(np.asarray(values) == 0.0)


def test_critic_value_is_linear_head_on_backbone():
    cfg = ModelConfig(vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8, param_dtype="bfloat16",
                      compute_dtype="float32")
    critic = random_model(Critic, cfg, seed=0)
    critic.value_bias.set_value(jnp.asarray(0.5, jnp.bfloat16))
    tokens = jnp.arange(10).reshape(2, 5)
    hidden = np.asarray(nnx.jit(lambda m: m.backbone(tokens))(critic).astype(jnp.float32), np.float64)
    w = np.asarray(critic.value_d.get_value().astype(jnp.float32), np.float64)
    values = nnx.jit(lambda m: m(tokens))(critic)
    assert values.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(values), hidden @ w + 0.5, rtol=1e-5, atol=1e-5)


def test_remat_changes_nothing_but_memory():
    cfg = ModelConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=4, compute_dtype="float32")
    tokens = jnp.arange(12).reshape(2, 6) % 40
    grad = nnx.jit(nnx.grad(lambda m: jnp.mean(m(tokens) ** 2)))
    g_plain = grad(random_model(CausalLM, cfg, seed=0))
    for policy in ("nothing_saveable", "dots_saveable"):
        remat = random_model(CausalLM, cfg.replace(remat=True, remat_policy=policy), seed=0)
        graphdef, state = nnx.split(remat)
        jaxpr = str(jax.make_jaxpr(lambda st: nnx.merge(graphdef, st)(tokens).sum())(state))
        assert jaxpr.count("remat") == cfg.num_hidden_layers  # one rematerialised block per layer
        g_remat = grad(remat)
        for a, b in zip(jax.tree.leaves(g_plain), jax.tree.leaves(g_remat)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


# ---- failure paths ------------------------------------------------------------------------------
def test_checkpoint_errors_are_one_clear_line(tmp_path, qwen2_ckpt):
    directory, _ = qwen2_ckpt
    with pytest.raises(CheckpointError, match="does not exist"):
        load_hf_checkpoint(tmp_path / "nope", cfg=_fp32(directory))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no safetensors"):
        load_hf_checkpoint(tmp_path / "empty", cfg=_fp32(directory))
    # a config whose vocabulary disagrees with the tensors
    with pytest.raises(CheckpointError, match="shape"):
        load_hf_checkpoint(directory, cfg=_fp32(directory).replace(vocab_size=VOCAB + 1))
    # an untied config against a tied checkpoint (no lm_head.weight stored)
    with pytest.raises(CheckpointError, match="lm_head.weight"):
        load_hf_checkpoint(directory, cfg=_fp32(directory).replace(tie_word_embeddings=False))
    # a shard named by the index but missing on disk
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((directory / "config.json").read_text())
    (broken / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(CheckpointError, match="missing"):
        load_hf_checkpoint(broken)


def test_config_errors():
    with pytest.raises(ModelConfigError, match="model_type"):
        ModelConfig.from_hf_config({**QWEN2, "model_type": "gpt2"})
    with pytest.raises(ModelConfigError, match="unknown model config keys: bogus"):
        ModelConfig.from_yaml_dict({"bogus": 1})
    with pytest.raises(ModelConfigError, match="missing"):
        ModelConfig.from_yaml_dict({"vocab_size": 10})
    with pytest.raises(ModelConfigError, match="multiple"):
        ModelConfig.from_hf_config({**QWEN2, "num_key_value_heads": 3})
    with pytest.raises(ModelConfigError, match="not supported"):
        ModelConfig.from_hf_config({**LLAMA, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}})
    with pytest.raises(ModelConfigError, match="remat_policy"):
        ModelConfig.from_hf_config(QWEN2, remat_policy="some_policy")
    with pytest.raises(ModelConfigError, match="param_dtype"):
        ModelConfig.from_hf_config(QWEN2, param_dtype="float64")


def test_config_from_yaml_and_hf_agree(qwen2_ckpt):
    directory, _ = qwen2_ckpt
    from_hf = ModelConfig.from_hf_config(directory)
    assert from_hf.attention_bias and not from_hf.attention_out_bias  # Qwen2: q/k/v bias only
    assert from_hf.head_dim == 64 // 4
    from_yaml = ModelConfig.from_yaml_dict({k: v for k, v in from_hf.to_dict().items()})
    assert from_yaml == from_hf
    assert ModelConfig.from_yaml_dict({"hf_config": str(directory), "remat": True}) == from_hf.replace(remat=True)


# ---- sharding rules -----------------------------------------------------------------------------
def test_logical_rules_replicate_what_does_not_divide():
    mesh = make_mesh(MeshConfig(data=1, fsdp=2, tensor=4))
    P = jax.sharding.PartitionSpec
    assert logical_to_pspec(("embed", "kv_heads", "head_dim"), (64, 2, 16), mesh) == P("fsdp", None, None)
    assert logical_to_pspec(("embed", "q_heads", "head_dim"), (64, 8, 16), mesh) == P("fsdp", "tensor", None)
    assert logical_to_pspec(("vocab", "embed"), (101, 64), mesh) == P(None, "fsdp")
    assert logical_to_pspec((), (), mesh) == P()


def test_mesh_config_fills_and_rejects():
    assert MeshConfig(data=2, fsdp=-1, tensor=2).resolve(8) == (2, 2, 2)
    assert make_mesh(MeshConfig(data=-1, fsdp=1, tensor=1)).shape["data"] == 8
    with pytest.raises(MeshConfigError, match="needs 12 devices"):
        MeshConfig(data=3, fsdp=2, tensor=2).resolve(8)
    with pytest.raises(MeshConfigError, match="at most one"):
        MeshConfig(data=-1, fsdp=-1).resolve(8)
    with pytest.raises(MeshConfigError, match="unknown mesh axes"):
        MeshConfig.from_dict({"pipeline": 2})


# ---- tokenizer ----------------------------------------------------------------------------------
def _write_tokenizer(directory):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<|endoftext|>", "<|im_end|>", "hello", "world", "kernel", "fast", "[UNK]"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<pad>", "<|endoftext|>", "<|im_end|>"])
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": {"content": "<pad>"}, "chat_template": "{{ messages }}"}))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2], "bos_token_id": 1}))


def test_tokenizer_matches_transformers_and_reads_special_ids(tmp_path):
    _write_tokenizer(tmp_path)
    tok = load_tokenizer(tmp_path)
    reference = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    text = "hello fast kernel world"
    assert tok.encode(text) == reference.encode(text, add_special_tokens=False) == [3, 6, 5, 4]
    assert tok.decode(tok.encode(text)) == reference.decode(reference.encode(text, add_special_tokens=False))
    assert tok.eos_ids == (1, 2)
    assert tok.pad_id == 0 and tok.bos_id == 1
    assert tok.special_tokens == {"<pad>": 0, "<|endoftext|>": 1, "<|im_end|>": 2}
    assert tok.chat_template == "{{ messages }}"
    assert tok.decode([3, 2], skip_special_tokens=True) == "hello"


def test_tokenizer_errors(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="could not be read"):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_forward_flops_count_two_per_weight_of_every_matrix_the_model_holds_plus_causal_attention(role):
    """The MFU numerator against the model's own weights: 2 FLOPs per multiply-add of every matrix
    (the token embedding is a lookup, not a matmul), plus the causal half of scores and values."""
    from policy_jax.transformer import CausalLM, Critic

    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8)
    model = (CausalLM if role == "actor" else Critic)(cfg, rngs=nnx.Rngs(0))
    weights = {jax.tree_util.keystr(path): leaf for path, leaf in
               jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param))}
    # every weight a token's activations are multiplied by: not the embedding, the norms' scales, biases
    matrices = [a.size for name, a in weights.items() if not any(k in name for k in ("embed", "norm", "bias"))]
    assert len(matrices) == cfg.num_hidden_layers * 7 + 1  # q, k, v, o, gate, up, down per layer; the head
    seq = 128
    attention = cfg.num_hidden_layers * 2 * (cfg.num_attention_heads * cfg.head_dim) * seq
    expected = 2 * sum(matrices) + attention
    assert cfg.forward_flops_per_token(seq, lm_head=role == "actor") == expected
