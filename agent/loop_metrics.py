"""What one on-policy iteration's rollouts did, as flat metrics for the JSON lines and TensorBoard.

Pure functions of the episodes' results and the iteration's two wall times:
- rollout/reward_share/<r>: the share of episodes whose reward is r (-1, 0, 1, 2, 3; `none` for an
  episode without one), and the pass and faster rates that follow from the reward rule (1 correct,
  2 also faster than eager, 3 also faster than torch.compile);
- rollout/length_clip_ratio: the share of episodes cut by the context budget;
- episodes_per_hour over the whole iteration (rollout and training);
- sampler/tokens_per_s: the agent tokens generated per second of rollout wall time;
  trainer/tokens_per_s: the tokens of the training batch per second of the PPO step;
- time/<part>_share: where the episodes' time went (summed over episodes, so concurrent episodes
  count each): the policy, the evaluator workers, the bridge between them and the agent, the tools;
  time/train_share: the PPO step's share of the iteration's wall time.
"""

from __future__ import annotations

from typing import Any, Sequence

REWARDS = (-1, 0, 1, 2, 3)


def _share(count: float, total: float) -> float:
    return count / total if total else 0.0


def reward_metrics(rewards: Sequence[float | None]) -> dict[str, float]:
    """Reward distribution and the rates the reward rule implies. `rewards`: one per episode."""
    n = len(rewards)
    out = {f"rollout/reward_share/{r}": _share(sum(1 for x in rewards if x is not None and x == r), n)
           for r in REWARDS}
    out["rollout/reward_share/none"] = _share(sum(1 for x in rewards if x is None), n)
    out["rollout/pass_rate"] = _share(sum(1 for x in rewards if x is not None and x >= 1), n)
    out["rollout/faster_than_eager_rate"] = _share(sum(1 for x in rewards if x is not None and x >= 2), n)
    out["rollout/faster_than_compile_rate"] = _share(sum(1 for x in rewards if x is not None and x >= 3), n)
    return out


def time_shares(results: Sequence[Any]) -> dict[str, float]:
    """Shares of the episodes' summed wall time spent in the policy, the evaluator, the bridge and the tools."""
    total = sum(r.wall_seconds for r in results)
    worker = sum(r.timings.get("evaluator_worker_side_s", 0.0) for r in results)
    bridge = sum(r.timings.get("bridge_overhead_s", 0.0) for r in results)
    return {"time/policy_share": _share(sum(r.policy_seconds for r in results), total),
            "time/evaluator_share": _share(worker, total),
            "time/bridge_share": _share(bridge, total),
            "time/tools_share": _share(sum(r.tool_seconds for r in results), total)}


def iteration_metrics(results: Sequence[Any], rows: Sequence[dict], rollout_s: float, train_s: float,
                      trained_tokens: int) -> dict[str, float]:
    """Every rollout metric of one iteration. results: the episodes' EpisodeResults; rows: their
    trajectory rows (tokens, loss_mask); trained_tokens: the tokens of the PPO batch."""
    wall = rollout_s + train_s
    agent_tokens = sum(sum(row["loss_mask"]) for row in rows)
    return {
        **reward_metrics([r.reward for r in results]),
        "rollout/length_clip_ratio": _share(sum(1 for r in results if r.end_reason == "context_budget"),
                                            len(results)),
        "episodes_per_hour": _share(len(results) * 3600.0, wall),
        "sampler/tokens_per_s": _share(agent_tokens, rollout_s),
        "trainer/tokens_per_s": _share(trained_tokens, train_s),
        **time_shares(results),
        "time/train_share": _share(train_s, wall),
    }
