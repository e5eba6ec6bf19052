"""The evaluator's real handlers behind the bridge (evaluator_cuda.bridge_handlers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.client import BridgeClient
from bridge.settings import FAST_TEST_SETTINGS
from evaluator_cuda.bridge_handlers import mentions_sticky_cuda_error, needs_recycle
from tests.bridge_procs import REPO_ROOT, SPAWN, free_tcp_endpoint, start_broker, stop, wait_for_workers

import dataclasses

# The evaluation child imports torch before it registers: allow for a slow, shared machine.
SETTINGS = dataclasses.replace(FAST_TEST_SETTINGS, heartbeat_s=0.2)


def _evaluator_worker(endpoint, settings):
    from bridge.fleet import handlers_for
    from bridge.worker import serve_worker

    # One worker, both services, each with its default handler (as `cuda-agent worker --service
    # evaluate --service compile` sets it up).
    serve_worker(endpoint, ["evaluate", "compile"], handlers_for(["evaluate", "compile"], None), settings, gpu="")


@pytest.fixture(scope="module")
def evaluator_fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("evalfleet")
    endpoint = free_tcp_endpoint()
    broker = start_broker(endpoint, tmp / "journal.db", SETTINGS)
    worker = SPAWN.Process(target=_evaluator_worker, args=(endpoint, SETTINGS.to_dict()))
    worker.start()
    client = BridgeClient(endpoint, settings=SETTINGS)
    try:
        status = wait_for_workers(client, 1, timeout=120)
        yield client, status
    finally:
        client.close()
        stop(worker)
        stop(broker)


@pytest.mark.parametrize(
    "result, expected",
    [
        ({"status": "correct"}, False),
        ({"status": "incorrect", "diagnostics": [{"message": "mismatch at [0, 3]"}]}, False),
        ({"status": "infra_error", "message": "reference process died"}, True),
        ({"status": "runtime_error", "diagnostics": [{"message": "CUDA error: an illegal memory access was encountered"}]}, True),
        ({"status": "correct", "needs_recycle": True}, True),
    ],
)
def test_recycle_decision(result, expected):
    assert needs_recycle(result) is expected


def test_sticky_error_markers_are_matched_case_insensitively():
    assert mentions_sticky_cuda_error({"message": "Unspecified Launch Failure"})
    assert not mentions_sticky_cuda_error({"message": "out of memory"})


def test_worker_registers_torch_version_and_no_gpu(evaluator_fleet):
    import torch

    _, status = evaluator_fleet
    worker = status["workers"][0]
    assert sorted(worker["services"]) == ["compile", "evaluate"]
    caps = worker["capabilities"]
    assert caps["torch"] == torch.__version__
    assert caps["cuda_visible_devices"] == "" and caps["gpu"] is None


def test_malformed_job_gets_the_evaluators_infra_error_through_the_bridge(evaluator_fleet):
    from evaluator_cuda.service import evaluate_job

    client, _ = evaluator_fleet
    job = {"task": {"name": "t"}, "solution": {"format": "workspace", "files": {}}, "settings": {"backend": "host"}}
    through_bridge = client.run_batch("evaluate", [job], timeout=120)[0]
    direct = evaluate_job(job)
    assert through_bridge["status"] == direct["status"] == "infra_error"
    assert through_bridge["message"] == direct["message"] and "bad job" in direct["message"]
    assert "needs_recycle" not in through_bridge


def test_reference_self_check_on_host_matches_a_direct_evaluation(evaluator_fleet):
    from evaluator_cuda.service import evaluate_job

    client, _ = evaluator_fleet
    task = Path(REPO_ROOT) / "examples/tasks/row_softmax.py"
    # The example at 64 x 1,024 instead of 4,096 x 4,096: the same self-check, without 16 M-element
    # tensors checked twice on each side (13 s of the test's 15 s with warm caches).
    source = task.read_text().replace("ROWS = 4096", "ROWS = 64").replace("COLS = 4096", "COLS = 1024")
    assert "ROWS = 64" in source and "COLS = 1024" in source
    job = {"task": {"name": task.stem, "source": source}, "solution": {"format": "reference", "files": {}},
           "settings": {"backend": "host", "profile": False}}
    through_bridge = client.run_batch("evaluate", [job], timeout=600)[0]
    direct = evaluate_job(job)
    assert through_bridge["status"] == direct["status"] == "correct"
    assert through_bridge["task"] == direct["task"] == "row_softmax"


def test_compile_service_reaches_compile_job(evaluator_fleet):
    from evaluator_cuda.service import compile_job

    client, _ = evaluator_fleet
    kernelbench = {"task": {"name": "t", "source": "x = 1\n"},
                   "solution": {"format": "kernelbench", "files": {"model_new.py": b"class ModelNew: pass\n"}},
                   "settings": {"backend": "host"}}
    bad = {"task": {"name": "t"}, "solution": {}, "settings": {"backend": "host"}}
    results = client.run_batch("compile", [kernelbench, bad], timeout=120)
    assert results == [compile_job(kernelbench), compile_job(bad)]
    assert [r["status"] for r in results] == ["built", "infra_error"]
