"""The bridge at the fleet's rate, scaled down: real-sized jobs, every result checked (loopback)."""

from __future__ import annotations

from bridge.diagnostic_handlers import sized
from bridge.settings import FAST_TEST_SETTINGS
from script_helpers import load_script


def _script():
    return load_script("bench_bridge_load")


def test_sized_handler_pads_its_result_and_logs_each_run(tmp_path):
    log = tmp_path / "runs.log"
    first = sized({"value": 7, "result_bytes": 100, "log_file": str(log)})
    sized({"value": 8, "log_file": str(log)})
    assert first == {"status": "correct", "echo": 7, "pad": bytes(100)}
    assert log.read_text().split() == ["7", "8"]


def test_paper_shapes_use_the_measured_sizes():
    shapes = _script().paper_shapes()
    assert shapes["episodes"] == 1024
    assert shapes["evaluate"][0] > shapes["compile"][0]  # the built extension rides with the evaluate job
    assert shapes["compile"][1] > shapes["evaluate"][1]  # ... and comes back with the compile result
    assert shapes["ceiling_jobs_per_s"] > 100


def test_load_at_a_low_rate_loses_and_repeats_nothing():
    script = _script()
    out = script.run_load(rate=40.0, seconds=2.0, burst_jobs=32, workers=2, capacity=8, time_limit=150.0,
                          shapes=script.paper_shapes(), settings=FAST_TEST_SETTINGS)
    assert out["check"] == {"jobs": 112, "lost": 0, "crossed": 0, "duplicated": 0, "never_ran": 0,
                            "unknown_runs": 0}
    assert out["paced"]["jobs"] == 80 and out["burst"]["jobs"] == 32
    assert out["paced"]["achieved_jobs_per_s"] > 40.0 / 5
    assert out["paced"]["job_mb_per_s"] > 0 and out["paced"]["p50_ms"] <= out["paced"]["max_ms"]
