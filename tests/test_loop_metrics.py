"""The on-policy loop's rollout metrics against numbers worked out by hand."""

from types import SimpleNamespace

import pytest

from agent.loop_metrics import iteration_metrics, reward_metrics


def _episode(reward, wall, policy, tools, worker, bridge, end="agent_finished"):
    return SimpleNamespace(reward=reward, wall_seconds=wall, policy_seconds=policy, tool_seconds=tools,
                           end_reason=end, timings={"evaluator_worker_side_s": worker, "bridge_overhead_s": bridge})


def test_reward_distribution_and_rates():
    got = reward_metrics([-1, 1, 3, 2, None, 1, 0, 3])
    assert got["rollout/reward_share/-1"] == 1 / 8 and got["rollout/reward_share/1"] == 2 / 8
    assert got["rollout/reward_share/3"] == 2 / 8 and got["rollout/reward_share/none"] == 1 / 8
    assert sum(v for k, v in got.items() if k.startswith("rollout/reward_share/")) == pytest.approx(1.0)
    assert got["rollout/pass_rate"] == 5 / 8  # rewards 1, 3, 2, 1, 3
    assert got["rollout/faster_than_eager_rate"] == 3 / 8 and got["rollout/faster_than_compile_rate"] == 2 / 8
    assert reward_metrics([])["rollout/pass_rate"] == 0.0


def test_iteration_metrics_by_hand():
    results = [_episode(1, wall=10.0, policy=4.0, tools=1.0, worker=3.0, bridge=0.5),
               _episode(-1, wall=30.0, policy=20.0, tools=2.0, worker=0.0, bridge=0.0, end="context_budget")]
    rows = [{"loss_mask": [0, 1, 1, 1]}, {"loss_mask": [1, 1, 0, 0, 1]}]
    got = iteration_metrics(results, rows, rollout_s=30.0, train_s=6.0, trained_tokens=900)
    assert got["episodes_per_hour"] == pytest.approx(2 * 3600 / 36.0)
    assert got["sampler/tokens_per_s"] == pytest.approx(6 / 30.0)
    assert got["trainer/tokens_per_s"] == pytest.approx(150.0)
    assert got["rollout/length_clip_ratio"] == 0.5 and got["rollout/pass_rate"] == 0.5
    assert got["time/policy_share"] == pytest.approx(24 / 40) and got["time/evaluator_share"] == pytest.approx(3 / 40)
    assert got["time/bridge_share"] == pytest.approx(0.5 / 40) and got["time/tools_share"] == pytest.approx(3 / 40)
    assert got["time/train_share"] == pytest.approx(6 / 36)
