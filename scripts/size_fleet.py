"""How many GPU evaluator workers one PPO iteration of a run config needs, and what the bridge carries.

    python scripts/size_fleet.py configs/paper.yaml
    python scripts/size_fleet.py configs/h200_0p5b.yaml --evaluation-s 17.3 --think-s 0,30,120

Episodes per iteration: the config's `train.global_batch_size` (one trajectory per row). The
other inputs default to measured figures (printed with where they come from); the job size is
measured now, from the CUDA examples packed as the bridge packs them. The model is
`cuda_agent/fleet_sizing.py`; docs/fleet-sizing.md explains it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from cuda_agent.fleet_sizing import Workload, size_fleet, think_s_for_fleet  # noqa: E402

# Measured figures (docs/fleet-sizing.md, "Inputs"), each with its source.
EVALUATION_S = 11.2  # H200: median of the seven examples' evaluations with cached build and baselines
FASTEST_EVALUATION_S = 6.9  # H200: the fastest evaluation measured (cached build, jailed children)
EVALUATIONS_PER_EPISODE = 2  # the scripted honest episode: verify, profile
COMPILES_PER_EPISODE = 1  # ... and one compile
SCRIPTED_EPISODE_S = 38.1  # H200: that episode on row_softmax through the bridge, cold caches
ARTIFACT_BYTES = 64_432  # the built row_softmax extension (host backend, here)
RESULT_BYTES = 2_880  # a profiled, correct result record, msgpack (host backend, row_softmax, here)
COMPILE_RESULT_EXTRA_BYTES = 73  # a compile result around its artifact (measured: 64,505 - 64,432)
PAPER_POOL = 128  # the paper's evaluation pool (GPUs)
SOURCES = {
    "evaluation_s": "docs/figures.md, H200 `do_bench` table, 'eval s second' (7.1-17.3 s)",
    "fastest_evaluation_s": "docs/figures.md, the jail on the H200: cached evaluations 6.9-9.4 s",
    "episode": "agent/scripted.py honest script; H200 episode time in docs/figures.md 'Agent loop'",
    "sizes": "measured here: examples packed with bridge.protocol.pack_body; record and .so from one host run",
}


def example_job_bytes(artifact_bytes: int) -> dict:
    """Packed sizes of an evaluate job for each CUDA example (with an artifact of the given size)."""
    from bridge.protocol import pack_body
    from cuda_agent.contracts import evaluation_job, read_solution_job

    sizes, with_artifact = {}, []
    for folder in sorted((REPO_ROOT / "examples/solutions/cuda").iterdir()):
        task = REPO_ROOT / "examples/tasks" / f"{folder.name.split('__')[0]}.py"
        files = read_solution_job(folder)["files"]
        job = evaluation_job(task.stem, task.read_text(), files, {"backend": "cuda", "profile": True})
        sizes[folder.name] = len(pack_body(job))
        with_artifact.append(len(pack_body({**job, "artifact": bytes(artifact_bytes)})))
    return {"compile": statistics.median(sizes.values()), "evaluate": statistics.median(with_artifact),
            "per_example": sizes}


def episodes_of(config: str) -> int:
    import yaml

    with open(config) as f:
        return int(yaml.safe_load(f)["train"]["global_batch_size"])


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="a run config (configs/*.yaml)")
    parser.add_argument("--episodes", type=int, help="episodes per iteration (default: train.global_batch_size)")
    parser.add_argument("--evaluation-s", type=float, default=EVALUATION_S)
    parser.add_argument("--evaluations", type=float, default=EVALUATIONS_PER_EPISODE, help="evaluate jobs per episode")
    parser.add_argument("--compiles", type=float, default=COMPILES_PER_EPISODE, help="compile jobs per episode")
    parser.add_argument("--think-s", default=None,
                        help="policy seconds per evaluation, comma-separated (default: 0, the scripted episode's, "
                             "30, 60, 120, 300)")
    parser.add_argument("--artifact-bytes", type=int, default=ARTIFACT_BYTES)
    parser.add_argument("--result-bytes", type=int, default=RESULT_BYTES)
    parser.add_argument("--max-wait-share", type=float, default=0.01)
    return parser.parse_args(argv)


def think_values(args) -> list:
    if args.think_s:
        return [float(x) for x in args.think_s.split(",")]
    scripted = max(0.0, SCRIPTED_EPISODE_S / args.evaluations - args.evaluation_s)
    return [0.0, round(scripted, 2), 30.0, 60.0, 120.0, 300.0]


def workload(args, episodes: int, think_s: float, sizes: dict) -> Workload:
    return Workload(episodes=episodes, evaluations_per_episode=args.evaluations,
                    compiles_per_episode=args.compiles, evaluation_s=args.evaluation_s, think_s=think_s,
                    evaluate_job_bytes=int(sizes["evaluate"]), evaluate_result_bytes=args.result_bytes,
                    compile_job_bytes=int(sizes["compile"]),
                    compile_result_bytes=args.artifact_bytes + COMPILE_RESULT_EXTRA_BYTES,
                    max_wait_share=args.max_wait_share)


def print_assumptions(args, episodes: int, sizes: dict) -> None:
    print(f"config {args.config}: {episodes} episodes per PPO iteration, all at once")
    print(f"evaluate job on a GPU worker: {args.evaluation_s:g} s ({SOURCES['evaluation_s']})")
    print(f"per episode: {args.evaluations:g} evaluate jobs, {args.compiles:g} compile jobs ({SOURCES['episode']})")
    print(f"evaluate job {sizes['evaluate']:,.0f} B (sources {sizes['compile']:,.0f} B + extension "
          f"{args.artifact_bytes:,} B), result {args.result_bytes:,} B, compile result "
          f"{args.artifact_bytes + COMPILE_RESULT_EXTRA_BYTES:,} B ({SOURCES['sizes']})")
    print(f"fleet: smallest whose queueing adds at most {100 * args.max_wait_share:g} % to an episode "
          f"(closed M/M/c queue; {episodes} workers never wait)")


HEADER = (f"{'think s':>8} {'episode s':>9} {'load':>7} {'workers':>7} {'wait s':>7} {'eval/s':>7} "
          f"{'compile/s':>9} {'jobs/s':>7} {'MB/s in':>8} {'MB/s out':>8}")


def row(think_s: float, s) -> str:
    return (f"{think_s:8.2f} {s.episode_s:9.1f} {s.offered_load:7.1f} {s.workers:7d} {s.wait_s:7.3f} "
            f"{s.evaluate_jobs_per_s:7.2f} {s.compile_jobs_per_s:9.2f} {s.jobs_per_s:7.2f} "
            f"{s.bytes_to_workers_per_s / 1e6:8.3f} {s.bytes_to_trainer_per_s / 1e6:8.3f}")


def print_bounds(args, episodes: int, sizes: dict) -> None:
    fastest = workload(args, episodes, 0.0, sizes)
    top = size_fleet(Workload(**{**fastest.__dict__, "evaluation_s": FASTEST_EVALUATION_S}))
    print(f"ceiling: {episodes} workers, all episodes evaluating, fastest evaluation {FASTEST_EVALUATION_S} s: "
          f"{top.ceiling_jobs_per_s:.1f} jobs/s, {top.bytes_per_s / 1e6:.2f} MB/s "
          f"({SOURCES['fastest_evaluation_s']})")
    print(f"burst: {top.burst_jobs} jobs at once, {top.burst_bytes / 1e6:.1f} MB of job bodies")
    pool = min(PAPER_POOL, episodes)
    print(f"the paper's pool of {PAPER_POOL} GPUs is enough when episodes spend at least "
          f"{think_s_for_fleet(episodes, pool, args.evaluation_s, args.max_wait_share):.1f} s of policy time "
          f"per evaluation")


def main(argv=None) -> int:
    args = parse_args(argv)
    episodes = args.episodes or episodes_of(args.config)
    sizes = example_job_bytes(args.artifact_bytes)
    print_assumptions(args, episodes, sizes)
    print(HEADER)
    for think_s in think_values(args):
        print(row(think_s, size_fleet(workload(args, episodes, think_s, sizes))))
    print_bounds(args, episodes, sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
