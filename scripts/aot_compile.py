"""Compile a run config's steps for a TPU topology on this machine (no TPU needed) and say whether they fit.

    python scripts/aot_compile.py configs/paper.yaml --topology v5p:4x4x4
    python scripts/aot_compile.py configs/tiny.yaml --topology v5p:2x2x1 --mesh 1,2,1,2

For each topology and mesh layout (the config's own when it fits the chips, then a few standard
ones, or those given with --mesh data,fsdp,sequence,tensor) it compiles the actor's PPO step, the
critic's step, the log-prob recompute and the sampler's decode step, and prints per device: the
arguments, temporaries and outputs XLA allots, their total against the device's HBM, the flops
and XLA's estimate of the step's time. Exit status: 0 when some layout fits every step, 1 when
none does; without the `libtpu` package (the project's `tpu-aot` extra) it prints one line and
exits 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from policy_jax.aot import GIB, CompiledStep, MeshConfig, build_mesh, layouts_for, libtpu_missing_reason  # noqa: E402
from policy_jax.aot import mesh_label, tpu_topology  # noqa: E402

HEADER = f"{'step':<20} {'rows':>5} {'args GiB':>9} {'temp GiB':>9} {'out GiB':>8} {'total GiB':>10} {'HBM GiB':>8} " \
         f"{'fits':>4} {'TFLOP':>9} {'est s':>9} {'compile s':>9}"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="a run config (configs/*.yaml)")
    parser.add_argument("--topology", action="append", help="TPU topology, e.g. v5p:2x2x1, v6e:4x4, v4:2x2x2")
    parser.add_argument("--mesh", action="append", help="data,fsdp,sequence,tensor sizes (-1: the rest)")
    parser.add_argument("--steps", default="actor,critic,logprobs,decode", help="which steps, comma-separated")
    parser.add_argument("--seq-len", type=int, help="tokens per row (default: train.seq_len)")
    parser.add_argument("--batch", type=int, help="rows per update (default: ppo.mini_batch_size)")
    parser.add_argument("--micro-batch", type=int, help="rows per micro-batch (default: train.micro_batch_size)")
    parser.add_argument("--decode-rows", type=int, help="rows of the decode step (default: the micro-batch)")
    return parser.parse_args(argv)


def load_config(args):
    from policy_jax.run_config import load_run_config

    overrides = {}
    if args.seq_len:
        overrides["train.seq_len"] = args.seq_len
    if args.batch:
        overrides["ppo.mini_batch_size"] = overrides["train.global_batch_size"] = args.batch
    if args.micro_batch:
        overrides["train.micro_batch_size"] = args.micro_batch
    return load_run_config(args.config, overrides=overrides)


def parse_mesh(text: str) -> MeshConfig:
    data, fsdp, sequence, tensor = (int(x) for x in text.split(","))
    return MeshConfig(data=data, fsdp=fsdp, sequence=sequence, tensor=tensor)


def row(step: CompiledStep, hbm: int) -> str:
    fits = "yes" if step.peak_bytes <= hbm else "NO"
    return (f"{step.name:<20} {step.rows:>5} {step.argument_bytes / GIB:>9.2f} {step.temp_bytes / GIB:>9.2f} "
            f"{step.output_bytes / GIB:>8.2f} {step.peak_bytes / GIB:>10.2f} {hbm / GIB:>8.1f} {fits:>4} "
            f"{step.flops / 1e12:>9.3f} {_seconds(step.optimal_s):>9} {step.compile_s:>9.1f}")


def _seconds(estimate: float) -> str:
    return f"{estimate:.3f}" if estimate >= 0 else "n/a"  # XLA gives -1 where it has no estimate


def compile_layout(cfg, topology, mesh_cfg, steps, shapes) -> bool:
    """Compile every step on one layout, printing each as it is done. -> whether all of them fit."""
    from policy_jax.aot_steps import STEPS

    mesh = build_mesh(mesh_cfg, topology)
    results, fits = [], True
    for name in steps:
        print(f"  compiling {name} ...", flush=True)
        try:
            results.append(STEPS[name](cfg, mesh, shapes))
            fits &= results[-1].peak_bytes <= topology.hbm_per_device
        except Exception as e:  # XLA refuses a program larger than HBM at compile time
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            print(f"  {name}: does not compile: {first[:400]}", flush=True)
            fits = False
    print(HEADER)
    for result in results:
        print(row(result, topology.hbm_per_device))
    return fits


def main(argv=None) -> int:
    args = parse_args(argv)
    missing = libtpu_missing_reason()
    if missing:
        print(f"aot_compile: skipped: {missing}")
        return 0
    from policy_jax.aot_steps import shapes_of

    cfg = load_config(args)
    shapes = shapes_of(cfg, args.decode_rows)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    print(f"{cfg.name}: {cfg.model.param_count() / 1e9:.2f} B parameters, {shapes.seq_len} tokens per row; rows: "
          f"update {shapes.update_rows}, log-probs {shapes.logprob_rows}, decode {shapes.decode_rows}", flush=True)
    any_fits = False
    for name in args.topology or ["v5p:2x2x1"]:
        topology = tpu_topology(name)
        layouts = [parse_mesh(m) for m in args.mesh] if args.mesh else layouts_for(len(topology.devices), cfg.mesh)
        print(f"{name}: {len(topology.devices)} devices on {topology.chips} chips ({topology.devices[0].device_kind}), "
              f"{topology.hbm_per_device / GIB:.1f} GiB HBM per device; {len(layouts)} mesh layout(s)", flush=True)
        for mesh_cfg in layouts:
            print(f"{name} mesh {mesh_label(mesh_cfg)}", flush=True)
            fits = compile_layout(cfg, topology, mesh_cfg, steps, shapes)
            print(f"{name} mesh {mesh_label(mesh_cfg)}: {'fits' if fits else 'does not fit'}", flush=True)
            any_fits |= fits
    print("some layout fits every step" if any_fits else "no layout fits every step")
    return 0 if any_fits else 1


if __name__ == "__main__":
    raise SystemExit(main())
