#!/usr/bin/env python
"""Training-side figures of the JAX policy on one GPU (an H200).

For configs/h200_0p5b.yaml (Qwen2-0.5B shape, 494M parameters, fp32 master weights, bf16 compute,
cuDNN attention) at sequence length 4096:
  * actor PPO step (FP32-head log-probs, clipped loss, TIS weights, AdamW): tokens/s and MFU;
  * critic step (value loss, AdamW): tokens/s and MFU;
  * batch 8 (and 4) rows, with and without rematerialisation; peak device memory of each (one process per case).
MFU = 3 x forward matmul FLOPs (projections, MLP, LM head or value head, causal attention) x tokens / time,
against 848 TFLOP/s, the bf16 matmul rate measured on an H200 (docs/paper.md §12).
Correctness in the same run: at the first step the PPO loss (ratio = 1) equals -mean(A * w) over agent
tokens, and the value loss equals 0.5 x the mean squared error of the critic's values (read by a separate
forward pass), both computed here in NumPy; all metrics are finite.

    python scripts/bench_policy_train.py            # the H200 figures (< 6 minutes)
    python scripts/bench_policy_train.py --quick    # tiny shapes, a smoke run on any machine
    python scripts/bench_policy_train.py --only critic   # the critic's cases alone
Each case runs in its own process, whose lines are echoed as they come.
With OUT set, results go to $OUT/bench_policy_train.json.
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
PEAK_BF16_FLOPS = 848e12  # measured bf16 matmul rate on an H200 (docs/paper.md §12)
REFERENCE = {"tokens_per_s": 81710.0, "mfu": 0.337}  # PyTorch + transformers, batch 4 x 4096 (docs/paper.md §12)
FULL = dict(seq=4096, warmup=2, timed=5)
QUICK = dict(seq=64, warmup=1, timed=2)
# (role, batch rows, remat)
# Most informative first: later cases are skipped when the time budget runs out.
CASES_FULL = [("actor", 8, False), ("critic", 8, False), ("actor", 8, True), ("actor", 4, False), ("critic", 8, True)]
CASES_QUICK = [("actor", 4, True), ("critic", 4, False)]


def _run_config(quick: bool, remat: bool):
    from policy_jax.run_config import load_run_config

    cfg = load_run_config(REPO / "configs" / ("tiny.yaml" if quick else "h200_0p5b.yaml"))
    model = cfg.model.replace(remat=remat)
    if quick:
        model = model.replace(compute_dtype="bfloat16", attention_impl="xla")
    return cfg, model


def _batch(rows: int, seq: int, vocab: int, seed: int = 0):
    """Random tokens; alternating agent (mask 1) and tool (mask 0) spans; full-length rows but one short row."""
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, vocab, (rows, seq)).astype(np.int32)
    seg = np.ones((rows, seq), np.int32)
    seg[-1, seq - seq // 8:] = 0  # one right-padded row
    tokens = tokens * seg
    pos = np.where(seg > 0, np.arange(seq)[None, :], 0).astype(np.int32)
    agent = ((np.arange(seq) // 64) % 4 != 3).astype(np.float32)  # 3 agent spans in 4
    action = np.concatenate([(agent[None, 1:] * seg[:, 1:]), np.zeros((rows, 1), np.float32)], axis=1)
    return tokens, pos, seg, action.astype(np.float32), rng


def run_case(role: str, rows: int, remat: bool, quick: bool) -> dict:
    import jax
    import numpy as np
    from flax import nnx

    from policy_jax.run_config import OptimizerConfig
    from policy_jax.sharding import MeshConfig, batch_sharding, init_sharded, make_mesh
    from policy_jax.train_state import create_train_state, make_optimizer
    from policy_jax.train_steps import (ActorObjective, CriticObjective, PolicyBatch, ValueBatch, make_actor_step,
                                        make_critic_step)
    from policy_jax.transformer import CausalLM, Critic

    sizes = QUICK if quick else FULL
    seq = sizes["seq"]
    cfg, model_cfg = _run_config(quick, remat)
    mesh = make_mesh(MeshConfig(1, 1, 1), jax.devices()[:1])
    tokens, pos, seg, action, rng = _batch(rows, seq, model_cfg.vocab_size)
    place = lambda tree: jax.tree.map(lambda x: jax.device_put(x, batch_sharding(mesh, x.ndim)), tree)  # noqa: E731
    checks = {}
    if role == "actor":
        model = init_sharded(lambda: CausalLM(model_cfg, rngs=nnx.Rngs(0)), mesh)
        state = create_train_state(model, make_optimizer(OptimizerConfig(learning_rate=1e-4), 100), mesh)
        objective = ActorObjective(kind="ppo", logprob_precision="fp32", logprob_chunk_size=cfg.train.logprob_chunk_size)
        from policy_jax.logprobs import recompute_logprobs

        logp_fn = jax.jit(lambda st, t, p, s: recompute_logprobs(st.module(), t, p, s, precision="fp32",
                                                                   chunk_size=cfg.train.logprob_chunk_size)[0])
        old_logp = np.asarray(logp_fn(state, *place((tokens, pos, seg))))
        adv = (rng.normal(size=action.shape) * action).astype(np.float32)
        weights = rng.uniform(0.5, 2.0, action.shape).astype(np.float32)
        batch = place(PolicyBatch(tokens_bt=tokens, positions_bt=pos, segment_ids_bt=seg, action_mask_bt=action,
                                  old_logp_bt=old_logp, advantages_bt=adv, token_weights_bt=weights))
        step = make_actor_step(state, objective, mesh)
        expected_first = float(-(adv * weights * action).sum() / action.sum())
        loss_key = "loss"
    else:
        model = init_sharded(lambda: Critic(model_cfg, rngs=nnx.Rngs(1)), mesh)
        state = create_train_state(model, make_optimizer(OptimizerConfig(learning_rate=1e-4), 100), mesh)
        returns = (rng.normal(size=action.shape) * action).astype(np.float32)
        values_fn = jax.jit(lambda st, t, p, s: st.module()(t, p, s))
        values = np.asarray(jax.device_get(values_fn(state, *place((tokens, pos, seg)))), np.float64)
        batch = place(ValueBatch(tokens_bt=tokens, positions_bt=pos, segment_ids_bt=seg, action_mask_bt=action,
                                 returns_bt=returns))
        step = make_critic_step(state, CriticObjective(), mesh)
        # Before any update the value loss is 0.5 x the mean squared error over agent tokens of the
        # critic's values, read here by a separate forward pass.
        expected_first = float(0.5 * (np.square(values - returns) * action).sum() / action.sum())
        loss_key = "value_loss"

    t0 = time.perf_counter()
    state, metrics = step(state, batch)
    first = {k: float(v) for k, v in jax.device_get(metrics).items()}
    compile_s = time.perf_counter() - t0
    if expected_first is not None:
        checks["first_loss_matches_numpy"] = abs(first[loss_key] - expected_first) <= 2e-3 * max(1.0, abs(expected_first))
        checks["first_loss"] = first[loss_key]
        checks["first_loss_expected"] = expected_first
    for _ in range(sizes["warmup"] - 1):
        state, metrics = step(state, batch)
    jax.block_until_ready(state.params)
    times, losses = [], []
    for _ in range(sizes["timed"]):
        t0 = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready((state.params, metrics))
        times.append(time.perf_counter() - t0)
        losses.append(float(metrics[loss_key]))
    last = {k: float(v) for k, v in jax.device_get(metrics).items()}
    checks["metrics_finite"] = all(np.isfinite(v) for v in last.values())
    checks["last_loss"] = losses[-1]  # reported, not checked: a few steps on noise targets need not lower it
    median = statistics.median(times)
    n_tokens = rows * seq
    flops = 3 * model_cfg.forward_flops_per_token(seq, lm_head=role == "actor") * n_tokens
    stats = jax.devices()[0].memory_stats() or {}
    return {
        "role": role, "rows": rows, "seq": seq, "remat": remat, "step_s": median, "compile_s": compile_s,
        "tokens_per_s": n_tokens / median, "mfu": flops / median / PEAK_BF16_FLOPS,
        "peak_gb": (stats.get("peak_bytes_in_use") or 0) / 1e9, "params_m": model_cfg.param_count() / 1e6,
        "checks": checks, "device": str(jax.devices()[0].device_kind),
    }


def run_streamed(cmd: list[str], env: dict, limit_s: float, tag: str) -> list[str]:
    """Run one case's process, echoing its lines as they come (prefixed with `tag`); its lines. Killed
    past `limit_s`, which the last line then says."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    timer = threading.Timer(limit_s, proc.kill)
    timer.start()
    lines = []
    try:
        for raw in proc.stdout:
            lines.append(raw.rstrip("\n"))
            print(f"  [{tag}] {lines[-1]}", flush=True)
        proc.wait()
    finally:
        timer.cancel()
    if proc.returncode and proc.returncode < 0:
        lines.append(f"killed after {limit_s:.0f} s (the case's time limit)")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny shapes (smoke run on any machine)")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # role,rows,remat: run one case in this process
    parser.add_argument("--budget-s", type=float, default=330.0, help="skip remaining cases after this many seconds")
    parser.add_argument("--only", choices=["actor", "critic"], help="only this role's cases")
    args = parser.parse_args()
    if args.case:
        role, rows, remat = args.case.split(",")
        print("RESULT " + json.dumps(run_case(role, int(rows), remat == "1", args.quick)))
        return 0
    cases = [c for c in (CASES_QUICK if args.quick else CASES_FULL) if args.only in (None, c[0])]
    env = dict(os.environ, XLA_PYTHON_CLIENT_MEM_FRACTION=os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92"))
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    results, start = [], time.time()
    for role, rows, remat in cases:
        if time.time() - start > args.budget_s:
            results.append({"role": role, "rows": rows, "remat": remat, "error": "skipped: time budget"})
            continue
        cmd = [sys.executable, __file__, "--case", f"{role},{rows},{int(remat)}"] + (["--quick"] if args.quick else [])
        print(f"[{time.time() - start:6.1f}s] case {role} b{rows} {'remat' if remat else 'no-remat'}", flush=True)
        lines = run_streamed(cmd, env, max(30.0, 420 - (time.time() - start)), f"{role} b{rows}")
        line = next((l for l in lines if l.startswith("RESULT ")), None)
        if line is None:
            results.append({"role": role, "rows": rows, "remat": remat, "error": " | ".join(lines[-3:])[-400:]})
        else:
            results.append(json.loads(line[len("RESULT "):]))
    print(f"\n{'case':<22}{'step s':>8}{'tok/s':>10}{'MFU':>7}{'peak GB':>9}{'compile s':>10}  checks")
    ok = True
    for r in results:
        name = f"{r['role']} b{r['rows']} {'remat' if r['remat'] else 'no-remat'}"
        if "error" in r:
            ok &= r["error"].startswith("skipped")
            print(f"{name:<22}  ERROR {r['error']}")
            continue
        passed = all(v for k, v in r["checks"].items() if isinstance(v, bool))
        ok &= passed
        print(f"{name:<22}{r['step_s']:>8.3f}{r['tokens_per_s']:>10.0f}{100 * r['mfu']:>6.1f}%{r['peak_gb']:>9.1f}"
              f"{r['compile_s']:>10.1f}  {'ok' if passed else 'FAIL ' + json.dumps(r['checks'])}")
    print(f"reference (PyTorch+transformers, b4x4096): {REFERENCE['tokens_per_s']:.0f} tok/s, "
          f"{100 * REFERENCE['mfu']:.1f}% MFU; goal >= 40% MFU against {PEAK_BF16_FLOPS / 1e12:.0f} TFLOP/s")
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "bench_policy_train.json").write_text(json.dumps(
            {"results": results, "reference": REFERENCE, "peak_bf16_flops": PEAK_BF16_FLOPS}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
