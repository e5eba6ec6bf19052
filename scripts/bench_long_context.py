"""Memory of one attention layer's forward and backward at long contexts: the plain masked path
against blockwise attention, as XLA's compiler reports it (nothing is run, so the terabyte cases
are measured too).

    python scripts/bench_long_context.py                     # the paper's head shapes, t up to 131,072
    python scripts/bench_long_context.py --lengths 4096 8192 --block-size 256

Prints one line per length as it is compiled, then a table: XLA's temporary bytes for each path,
and their ratio. Shapes: batch 1, 40 query heads, 8 key/value heads, head dim 128, bf16.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

from policy_jax.attention import segment_attention_mask
from policy_jax.blockwise_attention import blockwise_attention


def _temp_bytes(fn, *args) -> int:
    compiled = jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32)), argnums=(0, 1, 2))).lower(*args).compile()
    return int(compiled.memory_analysis().temp_size_in_bytes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 65536, 131072])
    parser.add_argument("--block-size", type=int, default=512)
    parser.add_argument("--heads", type=int, nargs=3, default=[40, 8, 128], metavar=("Q", "KV", "DIM"))
    args = parser.parse_args()
    n, kv, h = args.heads
    rows = []
    for t in args.lengths:
        begin = time.perf_counter()
        q = jax.ShapeDtypeStruct((1, t, n, h), jnp.bfloat16)
        k = jax.ShapeDtypeStruct((1, t, kv, h), jnp.bfloat16)
        seg = jnp.ones((1, t), jnp.int32)
        blocked = _temp_bytes(lambda q, k, v: blockwise_attention(q, k, v, seg, block_size=args.block_size), q, k, k)
        plain = _temp_bytes(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=segment_attention_mask(seg), implementation="xla"), q, k, k)
        rows.append((t, plain, blocked))
        print(f"t={t}: plain {plain / 2**30:.2f} GiB, blockwise {blocked / 2**30:.3f} GiB ({time.perf_counter() - begin:.1f} s to compile both)", flush=True)
    print(f"\n{'t':>8} {'plain GiB':>12} {'blockwise GiB':>14} {'plain / blockwise':>18}")
    for t, plain, blocked in rows:
        print(f"{t:>8} {plain / 2**30:>12.2f} {blocked / 2**30:>14.3f} {plain / max(blocked, 1):>18.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
