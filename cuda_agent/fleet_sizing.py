"""How many GPU evaluator workers one PPO iteration needs, and what the bridge carries.

Standard library only; pure functions. The model (docs/fleet-sizing.md):

- One iteration runs `episodes` agent episodes at once. An episode alternates between policy
  time (generation and the agent's other tools) and one evaluation, which it waits for: an
  episode never has two evaluations in flight (its tool calls run one after another).
- So the fleet is a closed queue with `episodes` sources and `workers` servers: each source
  "thinks" for `think_s` (policy seconds per evaluation) and then needs one worker for
  `evaluation_s`. With exponential think and service times this is the machine-repair model
  (M/M/c//N), solved exactly below; deterministic times wait less, so its waits are an upper bound.
- `workers >= episodes` never makes an episode wait. Fewer workers are enough when episodes
  spend most of their time generating: `workers_needed` is the smallest fleet whose queueing
  adds at most `max_wait_share` to an episode's length.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class QueueFigures:
    """Steady state of the closed queue: sources, servers, think and service time."""

    throughput_per_s: float  # evaluations finished per second
    busy_workers: float  # mean workers evaluating
    queued: float  # mean evaluations waiting for a worker
    wait_s: float  # mean wait of one evaluation before a worker takes it


def closed_queue(sources: int, workers: int, think_s: float, service_s: float) -> QueueFigures:
    """The machine-repair model M/M/c//N: exact steady state by its birth-death balance."""
    if sources < 1 or workers < 1 or think_s < 0 or service_s <= 0:
        raise ValueError("need sources >= 1, workers >= 1, think_s >= 0 and service_s > 0")
    if think_s == 0:  # every source is always at the fleet
        busy = min(sources, workers)
        queued = sources - busy
        throughput = busy / service_s
        return QueueFigures(throughput, busy, queued, queued / throughput)
    log_p = [0.0]  # log of p_n / p_0, n = jobs at the fleet (evaluating or queued)
    for n in range(sources):
        arrivals = (sources - n) / think_s
        departures = min(n + 1, workers) / service_s
        log_p.append(log_p[-1] + math.log(arrivals) - math.log(departures))
    top = max(log_p)
    weights = [math.exp(v - top) for v in log_p]
    total = sum(weights)
    busy = sum(min(n, workers) * w for n, w in enumerate(weights)) / total
    queued = sum(max(n - workers, 0) * w for n, w in enumerate(weights)) / total
    throughput = busy / service_s
    return QueueFigures(throughput, busy, queued, queued / throughput)


def offered_load(sources: int, think_s: float, service_s: float) -> float:
    """Workers busy on average when nobody waits: sources x the evaluation share of a cycle."""
    return sources * service_s / (think_s + service_s)


def workers_needed(sources: int, think_s: float, service_s: float, max_wait_share: float = 0.01) -> int:
    """The fewest workers whose mean wait per evaluation is at most max_wait_share of a cycle.

    A cycle is think_s + service_s, so the wait adds at most that share to every episode.
    The wait falls as workers are added; `sources` workers never wait.
    """
    budget = max_wait_share * (think_s + service_s)
    low, high = 1, sources
    while low < high:
        middle = (low + high) // 2
        if closed_queue(sources, middle, think_s, service_s).wait_s <= budget:
            high = middle
        else:
            low = middle + 1
    return low


def think_s_for_fleet(sources: int, workers: int, service_s: float, max_wait_share: float = 0.01,
                      limit_s: float = 1e6) -> float:
    """The least policy time per evaluation for which `workers` are enough (bisection)."""
    if workers >= sources:
        return 0.0
    low, high = 0.0, limit_s
    for _ in range(40):
        middle = (low + high) / 2
        if workers_needed(sources, middle, service_s, max_wait_share) <= workers:
            high = middle
        else:
            low = middle
    return high


def think_s_of_episode(episode_s: float, evaluations: float, evaluation_s: float) -> float:
    """Policy seconds per evaluation of a measured episode (its length less its evaluations)."""
    think = episode_s / evaluations - evaluation_s
    if think < 0:
        raise ValueError(f"an episode of {episode_s} s cannot hold {evaluations} evaluations of {evaluation_s} s")
    return think


@dataclasses.dataclass(frozen=True)
class Workload:
    """One PPO iteration's rollouts as the evaluator fleet sees them."""

    episodes: int  # rollouts per iteration, all running at once
    evaluations_per_episode: float  # evaluate jobs (verify, profile, final): GPU workers
    compiles_per_episode: float  # compile jobs: CPU workers, but they cross the bridge too
    evaluation_s: float  # GPU worker seconds per evaluate job
    think_s: float  # policy seconds per evaluation (generation, other tools, compiles)
    evaluate_job_bytes: int  # serialized evaluate job (sources, task, the built extension)
    evaluate_result_bytes: int  # serialized result record
    compile_job_bytes: int
    compile_result_bytes: int  # the built extension and the build's diagnostics
    max_wait_share: float = 0.01


@dataclasses.dataclass(frozen=True)
class Sizing:
    workers: int  # GPU evaluator workers for the iteration
    offered_load: float  # mean busy workers if nobody waited
    wait_s: float  # mean wait per evaluation with that fleet
    episode_s: float  # episode length, waits included
    evaluate_jobs_per_s: float
    compile_jobs_per_s: float
    bytes_to_workers_per_s: float  # job bodies, client -> broker (and again broker -> worker)
    bytes_to_trainer_per_s: float  # result bodies, worker -> broker (and again broker -> client)
    burst_jobs: int  # every episode submitting at the same moment
    burst_bytes: int
    ceiling_jobs_per_s: float  # all episodes evaluating at once on `episodes` workers

    @property
    def jobs_per_s(self) -> float:
        return self.evaluate_jobs_per_s + self.compile_jobs_per_s

    @property
    def bytes_per_s(self) -> float:
        return self.bytes_to_workers_per_s + self.bytes_to_trainer_per_s


def size_fleet(w: Workload) -> Sizing:
    """Workers needed and the bridge's traffic at the steady state of that fleet."""
    workers = workers_needed(w.episodes, w.think_s, w.evaluation_s, w.max_wait_share)
    queue = closed_queue(w.episodes, workers, w.think_s, w.evaluation_s)
    evaluations = queue.throughput_per_s
    compiles = evaluations * w.compiles_per_episode / w.evaluations_per_episode
    cycle_s = w.think_s + w.evaluation_s + queue.wait_s
    ceiling = w.episodes / w.evaluation_s * (1 + w.compiles_per_episode / w.evaluations_per_episode)
    return Sizing(
        workers=workers,
        offered_load=offered_load(w.episodes, w.think_s, w.evaluation_s),
        wait_s=queue.wait_s,
        episode_s=w.evaluations_per_episode * cycle_s,
        evaluate_jobs_per_s=evaluations,
        compile_jobs_per_s=compiles,
        bytes_to_workers_per_s=evaluations * w.evaluate_job_bytes + compiles * w.compile_job_bytes,
        bytes_to_trainer_per_s=evaluations * w.evaluate_result_bytes + compiles * w.compile_result_bytes,
        burst_jobs=w.episodes,
        burst_bytes=w.episodes * max(w.evaluate_job_bytes, w.compile_job_bytes),
        ceiling_jobs_per_s=ceiling,
    )
