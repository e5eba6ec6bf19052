#!/usr/bin/env python
"""Benchmarks of the CUDA evaluator (evaluator_cuda), one subcommand each; the parts live in scripts/evaluator_bench/.

  examples   on a GPU (the H200): every example under examples/solutions/cuda built cold and cached,
             evaluated twice (baselines measured, then cached): verdict, reward, verify/profile wall time,
             candidate/eager/compile medians beside triton's do_bench. Exits 2 without a GPU.
  speed      on the H200 (or --backend host --quick on a CPU machine; --dry-run needs no device): sized
             cases (~100 µs, ~1 ms kernels), the workspace form and the KernelBench load_inline form side by
             side: compile time, evaluation wall time, spread of the medians, agreement with do_bench.
  compile    on the H200 or a CPU machine (--backend host): one candidate's compile time three ways
             (load_inline, load, the evaluator's fast build), the fast path's details, outputs compared.
  trace      on a GPU: chosen examples with the kernel trace on and off: the self-check's eager/ours
             ratio (cold and cached baselines), the honest solution's median (the trace's overhead),
             the cached evaluation's verification split. Exits 2 without a GPU.
  compile-pool  on a GPU (or --backend host): each example's self-check cold with inductor's pool of compile
             workers and without, one at a time and all at once: compile time, baselines, evaluation wall time.
  split      on a GPU (or --backend host): each example's honest solution cold, then cached with two settings
             side by side (--vary judge: outputs judged on the GPU or the CPU; --vary commit: large outputs
             committed by digest or sent): total wall time, the verification split, the calls' split.
  placement  on a GPU: KernelBench-layout tasks timed in one process with their inputs at byte offsets within
             2 MiB, and with a block held to move their intermediates: what placement alone does to a time;
             --paths: the baseline's and the candidate child's ways of preparing a call, side by side;
             --sets: each side's way with its input sets cloned, sent or made from seeds.
  idle       on a GPU: KernelBench-layout tasks timed back to back and after 2-4 ms of GPU idle before each
             call (as the candidate child's round trips leave it), with a longer pad, with the GPU kept busy.
  trace_start  on a GPU: in fresh processes, what starting the kernel trace (torch.profiler, CUPTI) costs
             after the CUDA context, with CPU records or without, with every module loaded, a second time.

Each prints progress lines with elapsed seconds and a table at the end, and writes
$OUT/bench_evaluator_<subcommand>.json when OUT is set (examples --fast-build: ..._examples_fast.json; speed
--dry-run: none). `bench_evaluator.py SUBCOMMAND --help` for the options and the exit statuses.
"""

from __future__ import annotations

import argparse
import sys

from evaluator_bench import common

SUBCOMMANDS = {  # name: (module, one line for the list)
    "examples": ("examples", "per example on a GPU: build cold/cached, two evaluations, ours/eager/compile "
                             "vs do_bench"),
    "speed": ("speed", "sized cases, workspace vs load_inline: compile, evaluation wall time, spread, "
                       "do_bench agreement"),
    "compile": ("compile", "one candidate's compile time: load_inline, load and the fast build side by side"),
    "trace": ("trace", "the kernel trace on and off: self-check ratio, the trace's overhead, the verify split"),
    "compile-pool": ("compile_pool", "inductor's compile workers in the reference child, a pool or none, "
                                     "one at a time and all at once"),
    "split": ("split", "one evaluation's wall time split, two settings side by side (judge device, committed "
                       "outputs)"),
    "placement": ("placement", "one process: a call's time with its inputs and intermediates placed at other "
                               "offsets in GPU memory"),
    "idle": ("idle", "one process: a call's time back to back and after the GPU idled as between the "
                     "candidate's calls"),
    "trace_start": ("trace_start", "fresh processes: the kernel trace's start after the CUDA context, four "
                                   "variants"),
}


def parse(argv: list[str]):
    import importlib

    parser = argparse.ArgumentParser(prog="bench_evaluator.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(SUBCOMMANDS) + "}")
    modules = {}
    for name, (module_name, line) in SUBCOMMANDS.items():
        module = modules[name] = importlib.import_module(f"evaluator_bench.{module_name}")
        subparser = sub.add_parser(name, help=line, description=module.__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(subparser)
        subparser.set_defaults(parser=subparser)
    child = sub.add_parser("time-child")  # hidden: the timing child (evaluator_bench/timing.py) of examples and speed
    child.add_argument("spec")
    child.add_argument("out")
    return parser.parse_args(argv), modules


def main(argv: list[str]) -> int:
    common.put_checkout_on_path()
    args, modules = parse(argv)
    if args.command == "time-child":
        from evaluator_bench.timing import time_child

        time_child(args.spec, args.out)
        return 0
    if args.command == "speed":
        return modules["speed"].main(args, args.parser)
    return modules[args.command].main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
