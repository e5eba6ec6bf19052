"""Blockwise attention, forward and backward, on the default JAX device: with the skip of key blocks no
query can see, without it (every block folded), and the plain [t, t] path where it fits.

    python scripts/bench_attention.py                       # Qwen2-0.5B heads, 4,096 and 16,384 tokens
    python scripts/bench_attention.py --tokens 2048 --repeats 3 --budget-s 60

Prints one line per measurement as it goes and a table of medians; --json writes them.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time


def _args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=512)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--plain-max-tokens", type=int, default=8192, help="the plain path only up to this length")
    parser.add_argument("--budget-s", type=float, default=240.0, help="stop starting new measurements after this")
    parser.add_argument("--json", help="write the medians here")
    return parser.parse_args(argv)


def _no_skip(module):
    """The blockwise path as it was before the skip: every key block folded."""
    def step(carry, key_block, **kwargs):
        return module._fold_key_block(carry, key_block, **kwargs), None
    return step


def _loss_and_grad(attention):
    import jax
    import jax.numpy as jnp

    def loss(q, k, v, seg):
        return jnp.sum(attention(q, k, v, seg).astype(jnp.float32) ** 2)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def _time(fn, inputs, repeats):
    import jax

    began = time.perf_counter()
    jax.block_until_ready(fn(*inputs))
    first = time.perf_counter() - began
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        jax.block_until_ready(fn(*inputs))
        times.append((time.perf_counter() - began) * 1e3)
    return first, statistics.median(times)


def _inputs(t, args):
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    dtype = jnp.dtype(args.dtype)
    q = jax.random.normal(keys[0], (1, t, args.heads, args.head_dim), dtype)
    k = jax.random.normal(keys[1], (1, t, args.kv_heads, args.head_dim), dtype)
    v = jax.random.normal(keys[2], (1, t, args.kv_heads, args.head_dim), dtype)
    seg = jnp.ones((1, t), jnp.int32).at[:, t - t // 8:].set(0)  # the last eighth padding, as in a padded batch
    return q, k, v, seg


def main(argv=None) -> int:
    args = _args(argv)
    import jax

    from policy_jax import blockwise_attention as module
    from policy_jax.attention import segment_attention_mask

    started = time.monotonic()
    print(f"[attention] device {jax.devices()[0].device_kind}, {args.dtype}, heads {args.heads}/{args.kv_heads}x"
          f"{args.head_dim}, block {args.block_size}", flush=True)
    def plain_attention(q, k, v, seg):  # XLA's attention with the full [t, t] mask
        return jax.nn.dot_product_attention(q, k, v, mask=segment_attention_mask(seg), implementation="xla")

    skip_step = module._key_block_step
    paths = {"blockwise": skip_step, "blockwise, no skip": _no_skip(module)}
    rows = []
    for t in args.tokens:
        inputs = _inputs(t, args)
        for name, step in [*paths.items(), ("plain", None)]:
            if time.monotonic() - started > args.budget_s:
                print(f"[attention] budget of {args.budget_s:g} s spent: stopping before {name} at {t}", flush=True)
                return _finish(rows, args)
            if step is None and t > args.plain_max_tokens:
                continue
            module._key_block_step = step or skip_step
            attention = (plain_attention if step is None else
                         functools.partial(module.blockwise_attention, block_size=args.block_size))
            first, median = _time(_loss_and_grad(attention), inputs, args.repeats)
            module._key_block_step = skip_step
            rows.append({"tokens": t, "path": name, "median_ms": round(median, 3), "first_call_s": round(first, 2)})
            print(f"[attention] {t} tokens, {name}: median {median:.2f} ms forward+backward "
                  f"(first call {first:.1f} s)", flush=True)
    return _finish(rows, args)


def _finish(rows, args) -> int:
    if not rows:
        print("error: nothing was measured", file=sys.stderr)
        return 1
    print("\n| tokens | path | median ms (forward+backward) | vs no skip |\n|---|---|---|---|")
    for row in rows:
        base = next((r["median_ms"] for r in rows if r["tokens"] == row["tokens"] and r["path"] == "blockwise, no skip"),
                    None)
        ratio = f"{base / row['median_ms']:.2f}x faster" if base else "-"
        print(f"| {row['tokens']} | {row['path']} | {row['median_ms']:.2f} | {ratio} |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
