"""The fleet-sizing model against figures worked out by hand."""

from __future__ import annotations

import pytest

from script_helpers import load_script
from cuda_agent.fleet_sizing import (Workload, closed_queue, offered_load, size_fleet, think_s_for_fleet,
                                     think_s_of_episode, workers_needed)


def test_two_episodes_one_worker_by_hand():
    # States n = 0, 1, 2 at the fleet; think 1 s, service 1 s.
    # p1 = p0 * 2, p2 = p1 * 1: p = (0.2, 0.4, 0.4). Busy 0.8, queued 0.4, wait 0.4 / 0.8 = 0.5 s.
    q = closed_queue(2, 1, think_s=1.0, service_s=1.0)
    assert q.busy_workers == pytest.approx(0.8)
    assert q.queued == pytest.approx(0.4)
    assert q.throughput_per_s == pytest.approx(0.8)
    assert q.wait_s == pytest.approx(0.5)
    # Each episode's cycle: think + service + wait = 2.5 s, so 2 episodes finish 0.8 per s.
    assert 2 / (1.0 + 1.0 + q.wait_s) == pytest.approx(q.throughput_per_s)


def test_three_episodes_two_workers_by_hand():
    # think 2 s, service 1 s: p1 = 3/2 p0, p2 = p1 * (2/2) / (2/1) = 3/4 p0, p3 = p2 * (1/2) / 2 = 3/16 p0.
    # Sum 1 + 1.5 + 0.75 + 0.1875 = 3.4375. Queued = p3 = 0.1875 / 3.4375.
    q = closed_queue(3, 2, think_s=2.0, service_s=1.0)
    total = 3.4375
    busy = (1.5 + 2 * 0.75 + 2 * 0.1875) / total
    assert q.busy_workers == pytest.approx(busy)
    assert q.queued == pytest.approx(0.1875 / total)
    assert q.wait_s == pytest.approx((0.1875 / total) / busy)


def test_as_many_workers_as_episodes_never_wait():
    q = closed_queue(8, 8, think_s=3.0, service_s=1.0)
    assert q.wait_s == pytest.approx(0.0, abs=1e-12)
    assert q.throughput_per_s == pytest.approx(8 / 4.0)
    assert workers_needed(8, think_s=0.0, service_s=1.0) == 8


def test_no_policy_time_queues_everything_beyond_the_fleet():
    q = closed_queue(10, 4, think_s=0.0, service_s=2.0)
    assert (q.busy_workers, q.queued, q.throughput_per_s, q.wait_s) == (4, 6, 2.0, 3.0)


def test_offered_load_is_the_evaluation_share():
    assert offered_load(1024, think_s=30.0, service_s=10.0) == pytest.approx(256.0)


def test_workers_needed_is_the_fewest_within_the_wait_share():
    n = workers_needed(64, think_s=30.0, service_s=10.0, max_wait_share=0.01)
    assert closed_queue(64, n, 30.0, 10.0).wait_s <= 0.01 * 40.0
    assert closed_queue(64, n - 1, 30.0, 10.0).wait_s > 0.01 * 40.0
    assert offered_load(64, 30.0, 10.0) < n < 64


def test_large_fleet_stays_finite():
    q = closed_queue(1024, 128, think_s=80.0, service_s=11.0)
    assert 0 < q.busy_workers <= 128 and q.wait_s >= 0


def test_think_time_for_a_given_fleet_inverts_workers_needed():
    think = think_s_for_fleet(64, 20, service_s=10.0)
    assert workers_needed(64, think, 10.0) <= 20
    assert workers_needed(64, think * 0.95, 10.0) > 20
    assert think_s_for_fleet(64, 64, 10.0) == 0.0


def test_think_time_of_a_measured_episode():
    assert think_s_of_episode(38.0, 2, 11.0) == pytest.approx(8.0)
    with pytest.raises(ValueError):
        think_s_of_episode(10.0, 2, 11.0)


def test_bridge_traffic_by_hand():
    # 4 episodes, 2 evaluations and 1 compile each; think 0 s: every episode is always at the
    # fleet, so it needs 4 workers; 4 evaluations per 2 s = 2 per s, compiles 1 per s.
    w = Workload(episodes=4, evaluations_per_episode=2, compiles_per_episode=1, evaluation_s=2.0, think_s=0.0,
                 evaluate_job_bytes=1000, evaluate_result_bytes=100, compile_job_bytes=300,
                 compile_result_bytes=700)
    s = size_fleet(w)
    assert s.workers == 4 and s.wait_s == 0
    assert (s.evaluate_jobs_per_s, s.compile_jobs_per_s, s.jobs_per_s) == (2.0, 1.0, 3.0)
    assert s.bytes_to_workers_per_s == 2 * 1000 + 1 * 300
    assert s.bytes_to_trainer_per_s == 2 * 100 + 1 * 700
    assert s.bytes_per_s == 3200
    assert (s.burst_jobs, s.burst_bytes) == (4, 4000)
    assert s.episode_s == pytest.approx(4.0)
    assert s.ceiling_jobs_per_s == pytest.approx(3.0)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError):
        closed_queue(0, 1, 1.0, 1.0)
    with pytest.raises(ValueError):
        closed_queue(2, 1, 1.0, 0.0)


def _size_fleet_script():
    return load_script("size_fleet")


def test_size_fleet_prints_the_paper_configs_figures(capsys):
    script = _size_fleet_script()
    assert script.main([str(script.REPO_ROOT / "configs/paper.yaml"), "--think-s", "0,60"]) == 0
    out = capsys.readouterr().out
    assert "1024 episodes per PPO iteration" in out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("0.00", "60.00"))]
    assert [float(r[0]) for r in rows] == [0.0, 60.0]
    workers = [int(r[3]) for r in rows]
    assert workers[0] <= 1024 and 0 < workers[1] < workers[0]
    assert "ceiling: 1024 workers" in out and "burst: 1024 jobs" in out


def test_job_sizes_come_from_the_examples():
    sizes = _size_fleet_script().example_job_bytes(1000)
    assert len(sizes["per_example"]) >= 6
    assert 1000 < sizes["evaluate"] - sizes["compile"] < 1020  # the artifact and its key
