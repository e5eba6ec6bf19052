#!/usr/bin/env python
"""How long creating the 0.5B actor and critic in their shards takes (configs/h200_0p5b.yaml).

`init_sharded` makes a model that fits on one device eagerly there and then moves each parameter to
its shards; `--jitted` also times the other path (one compiled constructor that makes each parameter
in its shards), which took minutes on an H200 before. Each creation waits until every parameter is
on its devices. Prints one line per case as it goes; with OUT set, writes $OUT/bench_policy_init.json.

    python scripts/bench_policy_init.py [--config configs/h200_0p5b.yaml] [--jitted]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _time_creation(factory, mesh, whole_fraction: float) -> float:
    import jax
    from flax import nnx

    from policy_jax.sharding import init_sharded

    t0 = time.perf_counter()
    model = init_sharded(factory, mesh, whole_fraction=whole_fraction)
    jax.block_until_ready(jax.tree.leaves(nnx.state(model)))
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "h200_0p5b.yaml"))
    parser.add_argument("--jitted", action="store_true", help="also time the compiled constructor")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    import jax
    from flax import nnx

    from policy_jax.run_config import load_run_config
    from policy_jax.sharding import make_mesh
    from policy_jax.transformer import CausalLM, Critic

    cfg = load_run_config(args.config)
    mesh = make_mesh(cfg.mesh)
    print(f"devices: {jax.device_count()} x {jax.devices()[0].device_kind}; config {args.config}", flush=True)
    cases = [("actor", lambda: CausalLM(cfg.model, rngs=nnx.Rngs(0)), 0.25),
             ("critic", lambda: Critic(cfg.model, rngs=nnx.Rngs(1)), 0.25)]
    if args.jitted:
        cases.append(("actor-jitted", lambda: CausalLM(cfg.model, rngs=nnx.Rngs(0)), 0.0))
    results = {}
    for name, factory, fraction in cases:
        print(f"creating {name} ...", flush=True)
        seconds = _time_creation(factory, mesh, fraction)
        results[name] = round(seconds, 2)
        print(f"{name}: {seconds:.2f} s", flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench_policy_init.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
