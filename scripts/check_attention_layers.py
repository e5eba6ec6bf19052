"""Every attention kernel of this platform against exact attention, layer by layer (policy_jax/attention_check).

    python scripts/check_attention_layers.py                 # the 0.5B shape, 2 rows of 2,048 tokens
    python scripts/check_attention_layers.py --quick         # a tiny model (a smoke run on a CPU)

A model of configs/h200_0p5b.yaml's shape (random weights, bf16 parameters and compute) runs one
plain-XLA forward over two rows, the second right-padded. At every layer each kernel the platform
offers (GPU: xla, cudnn, blockwise; TPU: xla, splash, blockwise; CPU: xla, blockwise) attends over
that layer's queries, keys and values, and is compared with float32 attention on the same values.
The weights' standard deviation is sqrt(score_std / hidden_size), which spreads the scaled scores
q.k/sqrt(h) by about `--score-std` (default 2): attention as peaked as in a trained model, not the
near-uniform attention of the usual initialisation, whose errors would be smaller.

Prints one line per layer as it goes and a summary; writes $OUT/attention_layers.json when OUT is
set. Exit 0 when every kernel stays within the tolerance at every layer, 1 when one does not, 2
when the run could not finish (a kernel fails to run, or the time limit is reached).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def model_config(quick: bool, score_std: float):
    import yaml

    from policy_jax.model_config import ModelConfig

    if quick:
        cfg = ModelConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=32, attention_bias=True)
    else:
        cfg = ModelConfig.from_yaml_dict(yaml.safe_load((REPO / "configs" / "h200_0p5b.yaml").read_text())["model"])
    return cfg.replace(param_dtype="bfloat16", compute_dtype="bfloat16", remat=False, attention_impl="xla",
                       initializer_range=(score_std / cfg.hidden_size) ** 0.5)


def batch(cfg, rows: int, tokens: int):
    """Random token ids [rows, tokens]; segment ids 1, the last row padded (0) after 3/4 of its tokens."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    ids = rng.integers(1, cfg.vocab_size, (rows, tokens))
    segments = np.ones((rows, tokens), np.int32)
    segments[-1, tokens * 3 // 4:] = 0
    return jnp.asarray(ids, jnp.int32), jnp.asarray(segments)


def run(args) -> dict:
    import jax
    from flax import nnx

    from policy_jax.attention_check import TOLERANCE, check_layers, kernels_for
    from policy_jax.transformer import CausalLM

    kernels = tuple(args.kernels.split(",")) if args.kernels else kernels_for(jax.default_backend())
    cfg = model_config(args.quick, args.score_std)
    tokens, segments = batch(cfg, args.rows, 64 if args.quick else args.tokens)
    print(f"{jax.devices()[0].device_kind}: {cfg.num_hidden_layers} layers, {cfg.num_attention_heads} query heads,"
          f" {cfg.num_key_value_heads} key/value heads of {cfg.head_dim}; rows {tokens.shape}; kernels {kernels}",
          flush=True)
    t0 = time.perf_counter()
    lm = CausalLM(cfg, rngs=nnx.Rngs(0))  # made eagerly: jitting the constructor compiles for minutes
    print(f"model made in {time.perf_counter() - t0:.1f} s; tolerance rel_max <= {TOLERANCE:.4f}", flush=True)

    def say(layer):
        cells = "  ".join(f"{k} {layer.rel_max[k]:.2e}/{layer.rel_mean[k]:.1e}" for k in kernels)
        print(f"[{time.perf_counter() - t0:6.1f} s] layer {layer.layer:2d} score std {layer.score_std:4.2f}: "
              f"{cells}", flush=True)

    layers = check_layers(lm, tokens, segments, kernels, block_size=args.block_size, on_layer=say)
    worst = {k: max(x.rel_max[k] for x in layers) for k in kernels}
    return {"device": jax.devices()[0].device_kind, "kernels": kernels, "tolerance": TOLERANCE,
            "rows": list(tokens.shape), "score_std_target": args.score_std, "worst_rel_max": worst,
            "worst_rel_mean": {k: max(x.rel_mean[k] for x in layers) for k in kernels},
            "layers": [vars(x) for x in layers], "ok": all(v <= TOLERANCE for v in worst.values())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tiny model and 64 tokens (a smoke run on a CPU)")
    ap.add_argument("--rows", type=int, default=2, help="rows of the batch (default 2)")
    ap.add_argument("--tokens", type=int, default=2048, help="tokens per row (default 2048)")
    ap.add_argument("--kernels", help="comma-separated kernels (default: those of the platform)")
    ap.add_argument("--block-size", type=int, default=128, help="block of the blockwise and splash kernels")
    ap.add_argument("--score-std", type=float, default=2.0, help="spread of the scaled scores to aim for (default 2)")
    ap.add_argument("--budget-s", type=float, default=240.0, help="time limit of the run (default 240)")
    args = ap.parse_args(argv)

    def out_of_time(*_):
        raise TimeoutError(f"the time limit of {args.budget_s:g} s was reached")

    handler = signal.signal(signal.SIGALRM, out_of_time)
    pending, _ = signal.setitimer(signal.ITIMER_REAL, args.budget_s)  # a caller's alarm is put back after
    try:
        result = run(args)
    except Exception as e:  # a kernel that does not run here, or the time limit: one line, exit 2
        print(f"attention check did not finish: {type(e).__name__}: {str(e).splitlines()[0][:300]}", flush=True)
        return 2
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, handler)
        if pending:
            signal.setitimer(signal.ITIMER_REAL, pending)
    worst = ", ".join(f"{k} {v:.2e}" for k, v in result["worst_rel_max"].items())
    print(f"worst rel_max over the layers: {worst}; ATTENTION CHECK {'PASS' if result['ok'] else 'FAIL'}")
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / "attention_layers.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2))
        print(f"wrote {path}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
