#!/usr/bin/env python
"""Inference-side figures of the JAX policy on one GPU (an H200).

For the Qwen2-0.5B shape (configs/h200_0p5b.yaml, random bf16 weights):
  * sampler: batch 64, prompt 512, 256 new tokens, temperature 1 — generate tokens/s, decode-only
    tokens/s, and the memory-bandwidth bound (weights + average KV cache read once per step);
  * FP32 log-prob recomputation vs the bf16 one at 4 x 4096 tokens — time ratio (goal <= 1.15);
  * peak device memory of each (each part runs in its own process, so peaks do not mix).
Correctness is checked in the same run: KV-cache decode logits vs a full forward (float32, tiny
model), rollout bf16 log-probs vs the trainer's FP32 recompute on the generated tokens, chunked
FP32 log-probs vs a float64 log-softmax of the same hidden states, and cuDNN vs XLA attention.

    python scripts/bench_policy_inference.py            # the H200 figures (about 2 minutes; --budget-s 420)
    python scripts/bench_policy_inference.py --quick    # tiny shapes, a smoke run on any machine
With OUT set, results go to $OUT/bench_policy_inference.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HBM_BYTES_PER_S = 4.3e12  # measured HBM copy bandwidth on an H200 (docs/paper.md §12)
REFERENCE = {  # PyTorch + transformers on the same H200 and model shape (docs/paper.md §12)
    "generate_tokens_per_s": 1142.0,
    "fp32_head_logprob_ratio": 2.05,
}
FULL = dict(batch=64, prompt=512, new=256, lp_batch=4, lp_len=4096, chunk=1024, timed=3)
PART_LIMIT_S = 180  # one part: model made, compiled, timed and checked
QUICK = dict(batch=2, prompt=8, new=4, lp_batch=2, lp_len=64, chunk=16, timed=2)


def _model_config(quick: bool, attention: str):
    import yaml

    from policy_jax.model_config import ModelConfig

    if quick:
        return ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                           attention_bias=True, param_dtype="bfloat16", compute_dtype="bfloat16",
                           attention_impl=attention)
    model = yaml.safe_load((REPO / "configs" / "h200_0p5b.yaml").read_text())["model"]
    return ModelConfig.from_yaml_dict(model).replace(param_dtype="bfloat16", compute_dtype="bfloat16",
                                                     remat=False, attention_impl=attention)


def _peak_bytes():
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def _timed(fn, runs: int):
    """Median wall seconds of `runs` calls after one warm-up (the warm-up compiles)."""
    import jax

    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times), compile_s


def _init_model(cfg):
    """Made eagerly: jitting the constructor of the 0.5B model compiles for minutes on an H200."""
    from flax import nnx

    from policy_jax.transformer import CausalLM

    t0 = time.perf_counter()
    model = CausalLM(cfg, rngs=nnx.Rngs(0))
    print(f"  model of {cfg.param_count() / 1e6:.1f}M parameters made in {time.perf_counter() - t0:.1f} s", flush=True)
    return model


def _check_cache_matches_full_forward() -> float:
    """Max |logit difference| between KV-cache decoding and a cache-free forward (float32, tiny model)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from policy_jax.model_config import ModelConfig
    from policy_jax.sampler import decode_step, left_align, prefill

    cfg = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, attention_bias=True, compute_dtype="float32")
    with jax.default_matmul_precision("highest"):
        lm = _init_model(cfg.replace(initializer_range=0.2))
        rng = np.random.default_rng(0)
        lengths = np.array([9, 4])
        mask = np.arange(9)[None] < lengths[:, None]
        tokens = np.where(mask, rng.integers(1, 128, (2, 9)), 0)
        cont = rng.integers(1, 128, (2, 3))
        aligned = left_align(jnp.asarray(tokens), jnp.asarray(mask))[:2]
        logits, cache, pos = nnx.jit(lambda m: prefill(m, *aligned, 12))(lm)
        steps = [np.asarray(logits)]
        for j in range(2):
            logits, cache = nnx.jit(lambda m, t, p, c: decode_step(m, t, p, jnp.ones_like(t, bool), c))(
                lm, jnp.asarray(cont[:, j]), pos + j, cache)
            steps.append(np.asarray(logits))
        worst = 0.0
        for i, n in enumerate(lengths):
            row = np.concatenate([tokens[i, :n], cont[i]])[None]
            full = np.asarray(nnx.jit(lambda m, x: m(x))(lm, jnp.asarray(row)))[0]
            for j in range(3):
                worst = max(worst, float(np.abs(full[n - 1 + j] - steps[j][i]).max()))
    return worst


def part_decode(quick: bool) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from policy_jax.logprobs import recompute_logprobs
    from policy_jax.sampler import SamplingParams, _prefill_jit, generate

    sizes = QUICK if quick else FULL
    print("decode part: KV-cache decoding against a full forward (tiny model)", flush=True)
    cache_err = _check_cache_matches_full_forward()
    cfg = _model_config(quick, "xla")
    lm = _init_model(cfg)
    b, t, n = sizes["batch"], sizes["prompt"], sizes["new"]
    rng = np.random.default_rng(0)
    prompts = jnp.asarray(rng.integers(0, cfg.vocab_size, (b, t)), jnp.int32)
    mask = jnp.ones((b, t), bool)
    params = SamplingParams(max_new_tokens=n, temperature=1.0)
    keys = iter(jax.random.split(jax.random.key(0), 100))
    out_box = {}

    def run_generate():
        out_box["out"] = generate(lm, prompts, mask, params, next(keys))
        return out_box["out"].tokens

    print(f"decode part: cache check done (max |diff| {cache_err:.1e}); model built", flush=True)
    gen_s, gen_compile_s = _timed(run_generate, sizes["timed"])
    print(f"decode part: generate {gen_s:.3f} s per call (first call {gen_compile_s:.1f} s)", flush=True)
    graphdef, state = nnx.split(lm)
    prefill_s, _ = _timed(lambda: _prefill_jit(graphdef, state, prompts, mask, t + n, "compute")[0], sizes["timed"])
    print(f"decode part: prefill {prefill_s:.3f} s per call", flush=True)
    out = out_box["out"]
    assert int(jnp.min(out.lengths)) == n, "no stop tokens were set: every row must run to max_new_tokens"

    # rollout (bf16 sampler) vs trainer (FP32 recompute) log-probs of the generated tokens
    seqs = jnp.concatenate([prompts, out.tokens], axis=1)
    trainer_logp, _ = nnx.jit(lambda m, s: recompute_logprobs(m, s, precision="fp32", chunk_size=512))(lm, seqs)
    trainer = np.asarray(trainer_logp[:, t - 1:t + n - 1], np.float64)
    rollout = np.asarray(out.logprobs.astype(jnp.float32), np.float64)
    diff = np.abs(trainer - rollout)
    corr = float(np.corrcoef(np.exp(trainer).ravel(), np.exp(rollout).ravel())[0, 1])

    param_bytes = cfg.param_count() * 2
    kv_bytes_per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 2
    avg_context = t + n / 2
    step_bytes = param_bytes + b * avg_context * kv_bytes_per_token
    bound = b * HBM_BYTES_PER_S / step_bytes
    decode_s = gen_s - prefill_s
    return {
        "params": cfg.param_count(),
        "batch": b, "prompt": t, "new_tokens": n,
        "generate_s": gen_s, "prefill_s": prefill_s, "compile_s": gen_compile_s,
        "generate_tokens_per_s": b * n / gen_s,
        "decode_tokens_per_s": b * n / decode_s if decode_s > 0 else None,
        "bandwidth_bound_tokens_per_s": bound,
        "decode_fraction_of_bound": (b * n / decode_s) / bound if decode_s > 0 else None,
        "peak_bytes": _peak_bytes(),
        "check_cache_vs_full_max_abs": cache_err,
        "check_rollout_vs_fp32_mean_abs_logp": float(diff.mean()),
        "check_rollout_vs_fp32_max_abs_logp": float(diff.max()),
        "check_rollout_vs_fp32_prob_pearson": corr,
        "ok": cache_err < 1e-3 and float(diff.mean()) < 0.05,
    }


def part_logprobs(quick: bool, precision: str, attention: str) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from policy_jax.logprobs import next_token_targets, recompute_logprobs, token_logprobs_from_hidden

    sizes = QUICK if quick else FULL
    cfg = _model_config(quick, attention)
    lm = _init_model(cfg)
    b, t = sizes["lp_batch"], sizes["lp_len"]
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, cfg.vocab_size, (b, t)), jnp.int32)
    fn = nnx.jit(lambda m, x: recompute_logprobs(m, x, precision=precision, chunk_size=sizes["chunk"]))
    box = {}

    def run():
        box["r"] = fn(lm, tokens)
        return box["r"]

    print(f"logprobs part ({precision}, {attention}): timing {b} x {t} tokens", flush=True)
    secs, compile_s = _timed(run, 5 if not quick else 2)
    print(f"logprobs part: {secs * 1e3:.1f} ms per call (first call {compile_s:.1f} s); checking", flush=True)
    peak = _peak_bytes()
    logp, entropy = box["r"]

    # the chunked head against a float64 log-softmax of the same hidden states: the full batch through the
    # backbone as in the timed call, then the head alone, so attention kernels tiled by length play no part
    k = min(256, t - 1)
    hidden = nnx.jit(lambda m, x: m.backbone(x))(lm, tokens)
    head = lm.head_weight() if precision == "fp32" else lm.head_weight().astype(jnp.bfloat16)
    targets, _ = next_token_targets(tokens, jnp.ones_like(tokens))
    head_logp, _ = jax.jit(token_logprobs_from_hidden, static_argnames=("precision", "chunk_size"))(
        hidden, head, targets, precision=precision, chunk_size=sizes["chunk"])
    head64 = np.asarray(head.astype(jnp.float32), np.float64)
    logits = np.asarray(hidden[0, :k].astype(jnp.float32), np.float64) @ head64
    logits -= logits.max(-1, keepdims=True)
    ref = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    ref_logp = ref[np.arange(k), np.asarray(tokens[0, 1:k + 1])]
    err = float(np.abs(np.asarray(head_logp[0, :k]) - ref_logp).max())
    e2e = float(np.abs(np.asarray(logp[:, :-1]) - np.asarray(head_logp[:, :-1])).max())

    result = {"precision": precision, "attention": attention, "tokens": b * t, "seconds": secs,
              "compile_s": compile_s, "peak_bytes": peak, "check_vs_unchunked_max_abs": err,
              "recompute_vs_separate_passes_max_abs": e2e,
              "ok": err < (2e-3 if precision == "fp32" else 0.25)}
    if attention == "cudnn":
        # the fused kernel against XLA's masked attention on right-padded rows
        seg = (jnp.arange(512)[None] < jnp.asarray([[512], [300]])).astype(jnp.int32)
        x = tokens[:2, :512]
        h_cudnn = nnx.jit(lambda m: m.backbone(x, None, seg))(lm)
        lm_xla = _init_model(cfg.replace(attention_impl="xla"))
        h_xla = nnx.jit(lambda m: m.backbone(x, None, seg))(lm_xla)
        valid = np.asarray(seg, bool)
        gap = np.abs(np.asarray(h_cudnn, np.float32) - np.asarray(h_xla, np.float32))[valid]
        scale = float(np.abs(np.asarray(h_xla, np.float32))[valid].max())
        result["check_cudnn_vs_xla_hidden_max_abs"] = float(gap.max())
        result["check_cudnn_vs_xla_hidden_mean_abs"] = float(gap.mean())
        result["check_cudnn_vs_xla_hidden_max_ref"] = scale
        result["ok"] = result["ok"] and float(gap.max()) < 0.1 * scale
    return result


def _run_child(args: list[str], timeout: float) -> dict:
    """Run one part in its own process, echoing its lines as they come, so a part cut short says where it was."""
    cmd = [sys.executable, "-u", __file__, *args]
    print(f"part {' '.join(args)} (limit {timeout:.0f} s)", flush=True)
    begin = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if not line.startswith("RESULT "):
                print(f"  | {line.rstrip()}", flush=True)
        proc.wait()
    finally:
        killer.cancel()
    result = next((json.loads(x[len("RESULT "):]) for x in reversed(lines) if x.startswith("RESULT ")), None)
    if result is None:
        late = time.perf_counter() - begin >= timeout
        result = {"error": f"timed out after {timeout:.0f} s" if late else f"exit {proc.returncode}",
                  "last_lines": lines[-5:]}
    print(f"[{time.perf_counter() - begin:6.1f} s] part {' '.join(args)}: {json.dumps(result)[:600]}", flush=True)
    return result


def _fmt(x, spec="{:,.0f}"):
    return "-" if x is None else spec.format(x)


def orchestrate(quick: bool, attention: str, budget_s: float) -> int:
    flag = ["--quick"] if quick else []
    deadline = time.perf_counter() + budget_s

    def part(*args: str) -> dict:
        left = deadline - time.perf_counter()
        if left < 20:
            print(f"part {' '.join(args)}: skipped, {left:.0f} s of the budget left", flush=True)
            return {"error": "skipped: the budget was spent"}
        return _run_child(["--part", *args, *flag], min(PART_LIMIT_S, left))

    results = {"decode": part("decode")}
    for precision in ("fp32", "bf16"):
        r = part("logprobs", "--precision", precision, "--attention", attention)
        if "error" in r and attention == "cudnn":
            r = part("logprobs", "--precision", precision, "--attention", "xla")
            r["cudnn_error"] = True
        results[f"logprobs_{precision}"] = r
    fp32, bf16 = results["logprobs_fp32"], results["logprobs_bf16"]
    ratio = fp32["seconds"] / bf16["seconds"] if "seconds" in fp32 and "seconds" in bf16 else None
    results["fp32_over_bf16"] = ratio
    results["reference"] = REFERENCE

    d = results["decode"]
    gib = lambda x: None if x is None else x / 2**30  # noqa: E731
    print("\n== policy inference (JAX) ==")
    if "error" in d:
        print(f"decode: ERROR {d['error']}")
    else:
        print(f"model {d['params'] / 1e6:.0f}M params, sampler batch {d['batch']}, prompt {d['prompt']}, "
              f"{d['new_tokens']} new tokens")
        print(f"{'metric':44s} {'ours':>14s} {'reference':>14s}")
        print(f"{'generate tokens/s (prefill+decode)':44s} {_fmt(d['generate_tokens_per_s']):>14s} "
              f"{_fmt(REFERENCE['generate_tokens_per_s']):>14s}")
        print(f"{'decode-only tokens/s':44s} {_fmt(d['decode_tokens_per_s']):>14s}")
        print(f"{'bandwidth bound tokens/s (4.3 TB/s)':44s} {_fmt(d['bandwidth_bound_tokens_per_s']):>14s}")
        print(f"{'decode fraction of bound':44s} {_fmt(d['decode_fraction_of_bound'], '{:.1%}'):>14s}")
        print(f"{'sampler peak memory GiB':44s} {_fmt(gib(d['peak_bytes']), '{:.2f}'):>14s}")
        print(f"check: cache vs full forward max |dlogit| {d['check_cache_vs_full_max_abs']:.2e}; rollout bf16 vs "
              f"FP32 recompute mean |dlogp| {d['check_rollout_vs_fp32_mean_abs_logp']:.2e}, max "
              f"{d['check_rollout_vs_fp32_max_abs_logp']:.2e}, "
              f"prob Pearson {d['check_rollout_vs_fp32_prob_pearson']:.4f}")
    for name in ("logprobs_fp32", "logprobs_bf16"):
        r = results[name]
        if "error" in r:
            print(f"{name}: ERROR {r['error']}")
            continue
        line = (f"{name + ' (' + r['attention'] + ' attn) ms':44s} {r['seconds'] * 1e3:>14.1f}   peak "
                f"{_fmt(gib(r['peak_bytes']), '{:.2f}')} GiB, check max |dlogp| {r['check_vs_unchunked_max_abs']:.1e}")
        if "check_cudnn_vs_xla_hidden_max_abs" in r:
            line += (f", cudnn vs xla hidden max |d| {r['check_cudnn_vs_xla_hidden_max_abs']:.2e}"
                     f" (max |h| {r['check_cudnn_vs_xla_hidden_max_ref']:.1f})")
        print(line)
    print(f"{'FP32 / bf16 log-prob time (goal <= 1.15)':44s} {_fmt(ratio, '{:.3f}'):>14s} "
          f"{REFERENCE['fp32_head_logprob_ratio']:>14.2f}")
    ok = all(r.get("ok") for r in (d, fp32, bf16))
    print(f"correctness checks: {'PASS' if ok else 'FAIL'}")
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"]) / "bench_policy_inference.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2))
        print(f"wrote {out}")
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny shapes (smoke run on a CPU)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="time limit of the whole run (default 420)")
    ap.add_argument("--part", choices=("all", "decode", "logprobs"), default="all")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--attention", choices=("xla", "cudnn"), default=None,
                    help="attention for the log-prob pass (default: cudnn on GPU, xla elsewhere)")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    if args.part == "all":
        attention = args.attention
        if attention is None:  # the parent never imports JAX: it would take the GPU memory the parts need
            import shutil

            attention = "cudnn" if shutil.which("nvidia-smi") and not args.quick else "xla"
        return orchestrate(args.quick, attention, args.budget_s)
    if args.part == "decode":
        result = part_decode(args.quick)
    else:
        result = part_logprobs(args.quick, args.precision, args.attention or "xla")
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
