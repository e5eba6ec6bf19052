#!/usr/bin/env python
"""Episodes per hour of the agent loop with the scripted policy, and where an episode's time goes.

Runs whole episodes through the real chain (tools -> bridge client -> broker -> evaluator
workers) on the host backend (a CPU machine) or the CUDA backend (a GPU machine):

  pass "cold": one honest episode per example task (first builds, first baselines) and two
               cheating episodes per task (inherit the reference; build kernels but compute
               with torch);
  pass "warm": the honest episodes again (`--warm-repeats` times; evaluator caches warm).

Every episode has its own evaluations (a per-episode salt defeats the broker's deduplication
of identical jobs). Also measured: the bridge's round trip for a job the evaluator answers at
once (compile of a kernelbench file), which is the bridge's cost per evaluator call.
Checks, in the same run: every honest episode is correct with reward >= 1; every cheating
episode gets reward -1. Prints a table and, when $OUT is set, writes $OUT/bench_agent.json.

    python scripts/bench_agent.py --backend host --tasks elementwise_chain          # this machine
    python scripts/bench_agent.py --backend cuda --concurrency 6 --compile-workers 6  # H200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
# The evaluator's children run `python -m evaluator_cuda.roles.child`: they need the checkout on PYTHONPATH too.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("host", "cuda"), default="host")
    parser.add_argument("--tasks", nargs="*", default=None, help="task stems (default: every example task with a solution)")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--evaluate-workers", type=int, default=1)
    parser.add_argument("--compile-workers", type=int, default=1)
    parser.add_argument("--warm-repeats", type=int, default=1)
    parser.add_argument("--no-cheat", action="store_true")
    parser.add_argument("--bridge", default=None, help="use this broker instead of starting a local fleet")
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    return parser.parse_args()


def pick_tasks(backend: str, stems: list[str] | None):
    from agent.episode import load_task

    tasks = []
    for path in sorted((REPO / "examples" / "tasks").glob("*.py")):
        solution = REPO / "examples" / "solutions" / backend / path.stem
        if (solution / "model_new.py").is_file() and (stems is None or path.stem in stems):
            tasks.append((load_task(path), solution))
    if not tasks:
        raise SystemExit(f"no example task with a {backend} solution matches {stems}")
    return tasks


async def bridge_round_trip(client, probes: int = 20) -> dict:
    """Median/max seconds of jobs the evaluator answers without work (the bridge's own cost)."""
    job = {"task": {"name": "probe", "source": "x = 1\n"}, "solution": {"format": "kernelbench", "files": {"model_new.py": b"x = 1\n"}}, "settings": {"backend": "host"}}
    seconds = []
    for index in range(probes):
        start = time.monotonic()
        reply = await client.submit("compile", job, timeout=60, salt=f"probe-{time.time()}-{index}")
        seconds.append(time.monotonic() - start)
        if reply.get("status") != "built":
            return {"error": f"probe job answered {reply.get('status')}: {reply.get('diagnostics') or reply.get('error')}"}
    seconds.sort()
    return {"probes": probes, "median_s": seconds[len(seconds) // 2], "max_s": seconds[-1]}


async def run_pass(name, jobs, tokenizer, config, client, root, concurrency):
    """jobs: list of (task, kind, turns). Returns rows and the pass's wall time."""
    from agent.episode import run_episode
    from agent.policy import ScriptedPolicy

    gate = asyncio.Semaphore(concurrency)

    async def one(index, task, kind, turns):
        async with gate:
            policy = ScriptedPolicy(turns, tokenizer)
            result = await run_episode(
                task, policy, tokenizer, config, client, root / f"{name}-{index:03d}-{task.name}-{kind}", evaluator_salt=f"{root.name}/{name}/{index}"
            )
        print(f"[{name}] {task.name} {kind}: reward {result.reward} {result.final_status} in {result.wall_seconds:.1f} s", flush=True)
        ok = (result.reward is not None and result.reward >= 1 and result.final_status == "correct") if kind == "honest" else result.reward == -1
        t = result.timings
        return {
            "pass": name,
            "task": task.name,
            "kind": kind,
            "ok": bool(ok),
            "reward": result.reward,
            "status": result.final_status,
            "speedup_vs_compile": result.best_speedup_vs_compile,
            "speedup_vs_eager": result.best_speedup_vs_eager,
            "turns": result.turns,
            "tokens": len(result.trajectory),
            "wall_s": result.wall_seconds,
            "policy_s": result.policy_seconds,
            "tool_s": result.tool_seconds,
            "evaluator_agent_side_s": t["evaluator_agent_side_s"],
            "evaluator_worker_side_s": t["evaluator_worker_side_s"],
            "bridge_and_queue_s": t["bridge_overhead_s"],
            "evaluator_calls": sum(result.tool_counts.get(k, 0) for k in ("compile", "verify", "profile")) + sum(e.tool == "final" for e in result.evaluations),
        }

    start = time.monotonic()
    rows = await asyncio.gather(*(one(i, *job) for i, job in enumerate(jobs)))
    return list(rows), time.monotonic() - start


def summarise(name, rows, wall):
    episode_wall = sum(r["wall_s"] for r in rows) or float("nan")
    return {
        "pass": name,
        "episodes": len(rows),
        "ok": sum(r["ok"] for r in rows),
        "pass_wall_s": wall,
        "episodes_per_hour": len(rows) / wall * 3600 if wall > 0 else float("nan"),
        "mean_episode_s": episode_wall / len(rows),
        "evaluator_share": sum(r["evaluator_worker_side_s"] for r in rows) / episode_wall,
        "bridge_and_queue_share": sum(r["bridge_and_queue_s"] for r in rows) / episode_wall,
        "evaluator_calls": sum(r["evaluator_calls"] for r in rows),
        "tools_share": sum(r["tool_s"] for r in rows) / episode_wall,
    }


async def main_async(args, endpoint):
    from bridge.client import BridgeClient

    from agent.chat import TokenizerAdapter
    from agent.config import load_agent_config
    from agent.demo_tokenizer import demo_tokenizer
    from agent.scripted import cheating_turns, honest_solver_turns, read_solution_dir, torch_fallback_turns

    tokenizer = TokenizerAdapter(demo_tokenizer())
    config = load_agent_config("agent_tiny").with_overrides(backend=args.backend, max_turns=20)
    tasks = pick_tasks(args.backend, args.tasks)
    root = Path(tempfile.mkdtemp(prefix="bench-agent-", dir="/tmp"))
    root.chmod(0o755)
    try:
        with BridgeClient(endpoint) as client:
            cold_jobs = [(task, "honest", honest_solver_turns(read_solution_dir(sol))) for task, sol in tasks]
            if not args.no_cheat:
                cold_jobs += [(task, "cheat", cheating_turns(task.source)) for task, _ in tasks]
                cold_jobs += [(task, "torch", torch_fallback_turns(task.source, read_solution_dir(sol))) for task, sol in tasks]
            probe = await bridge_round_trip(client)
            cold_rows, cold_wall = await run_pass("cold", cold_jobs, tokenizer, config, client, root, args.concurrency)
            warm_jobs = [(task, "honest", honest_solver_turns(read_solution_dir(sol))) for task, sol in tasks] * args.warm_repeats
            warm_rows, warm_wall = await run_pass("warm", warm_jobs, tokenizer, config, client, root, args.concurrency)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summaries = [summarise("cold", cold_rows, cold_wall), summarise("warm", warm_rows, warm_wall)]
    for summary in summaries:
        if "median_s" in probe:
            summary["bridge_share"] = summary["evaluator_calls"] * probe["median_s"] / (summary["mean_episode_s"] * summary["episodes"])
    return cold_rows + warm_rows, summaries, probe


def print_tables(rows, summaries, probe, args, sandbox):
    print()
    print(f"{'pass':5} {'task':20} {'kind':6} {'ok':4} {'reward':>6} {'status':14} {'x compile':>9} {'wall s':>7} {'eval s':>7} {'br+queue s':>10}")
    for r in rows:
        speed = "-" if r["speedup_vs_compile"] is None else f"{r['speedup_vs_compile']:.2f}"
        print(
            f"{r['pass']:5} {r['task'][:20]:20} {r['kind']:6} {'yes' if r['ok'] else 'NO':4} {str(r['reward']):>6} {r['status'][:14]:14} "
            f"{speed:>9} {r['wall_s']:7.1f} {r['evaluator_worker_side_s']:7.1f} {r['bridge_and_queue_s']:10.3f}"
        )
    print()
    print(f"backend {args.backend}, concurrency {args.concurrency}, evaluate workers {args.evaluate_workers}, compile workers {args.compile_workers}; sandbox {sandbox}")
    print(f"{'pass':5} {'episodes':>8} {'ok':>4} {'wall s':>8} {'episodes/h':>10} {'mean ep s':>9} {'evaluator':>9} {'bridge':>7} {'br+queue':>8} {'tools':>6}")
    for s in summaries:
        print(
            f"{s['pass']:5} {s['episodes']:8d} {s['ok']:4d} {s['pass_wall_s']:8.1f} {s['episodes_per_hour']:10.1f} {s['mean_episode_s']:9.1f} "
            f"{s['evaluator_share']:9.1%} {s.get('bridge_share', float('nan')):7.3%} {s['bridge_and_queue_share']:8.1%} {s['tools_share']:6.1%}"
        )
    print(f"bridge round trip (no-work job): {probe}")
    print("shares of summed episode wall time: evaluator = its own reported time; bridge = calls x round trip;")
    print("br+queue = agent-side evaluator time minus the evaluator's own (bridge plus waiting for a free worker); tools include evaluator calls")


def main():
    args = parse_args()
    try:
        import zmq  # noqa: F401
    except ImportError:
        raise SystemExit("pyzmq is missing: install its wheel first (pip download pyzmq on a machine with a registry)")
    from agent.fleet import FleetError, local_fleet
    from agent.sandbox import sandbox_report

    sandbox = sandbox_report()
    try:
        if args.bridge:
            rows, summaries, probe = asyncio.run(main_async(args, args.bridge))
        else:
            with local_fleet(
                backend=args.backend,
                evaluate_workers=args.evaluate_workers,
                compile_workers=args.compile_workers,
                ready_timeout=args.ready_timeout,
                log_dir=Path(os.environ["OUT"]) / "fleet-logs" if os.environ.get("OUT") else None,
            ) as endpoint:
                rows, summaries, probe = asyncio.run(main_async(args, endpoint))
    except FleetError as error:
        raise SystemExit(f"error: {error}")
    print_tables(rows, summaries, probe, args, sandbox)
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"])
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_agent.json").write_text(
            json.dumps({"args": vars(args), "sandbox": sandbox, "bridge_round_trip": probe, "summaries": summaries, "episodes": rows}, indent=2, default=str)
        )
    failed = [r for r in rows if not r["ok"]]
    if failed:
        print(f"FAILED checks: {len(failed)} episode(s)")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
