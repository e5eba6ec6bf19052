"""Broker, workers and clients as real processes on loopback: the normal paths and bad input."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import msgpack
import pytest

from bridge import protocol
from bridge.client import BridgeClient
from bridge.protocol import PROTOCOL_VERSION as V, Kind
from bridge.settings import FAST_TEST_SETTINGS
from tests.bridge_procs import (free_tcp_endpoint, raw_dealer, read_lines, start_broker, start_worker, stop,
                                wait_for, wait_for_workers)

# "nobody" and "idle" are configured services that no worker serves (their jobs wait in the queue).
SMALL_LIMIT = dataclasses.replace(FAST_TEST_SETTINGS, max_message_bytes=100_000, max_queue=5,
                                  services=("evaluate", "compile", "nobody", "idle"))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A broker on TCP and IPC with three 'square' workers and one 'counted' worker."""
    tmp = tmp_path_factory.mktemp("fleet")
    tcp = free_tcp_endpoint()
    ipc = f"ipc://{tmp}/broker.sock"
    broker = start_broker([tcp, ipc], tmp / "journal.db", SMALL_LIMIT)
    workers = [start_worker(tcp, "square", services=["square"], settings=SMALL_LIMIT) for _ in range(3)]
    workers.append(start_worker(tcp, "counted", services=["counted"], settings=SMALL_LIMIT))
    client = BridgeClient(tcp, settings=SMALL_LIMIT)
    try:
        wait_for_workers(client, 4)
        yield {"tcp": tcp, "ipc": ipc, "client": client, "tmp": tmp}
    finally:
        client.close()
        for proc in workers:
            stop(proc)
        stop(broker)


def test_hundred_concurrent_jobs_across_workers_all_correct_and_accounted_for(fleet):
    client = fleet["client"]
    xs = list(range(1000, 1100))
    results = client.run_batch("square", [{"x": x} for x in xs], timeout=30)
    assert [r["status"] for r in results] == ["correct"] * 100
    assert [r["value"] for r in results] == [x * x for x in xs]
    assert len({r["pid"] for r in results}) >= 2, "the jobs should spread over several workers"
    status = client.status()
    assert status["unfinished"] == 0 and status["inflight"] == 0


def test_asyncio_submissions_resolve_each_future_with_its_own_result(fleet):
    client = fleet["client"]

    async def main():
        return await asyncio.gather(*(client.submit("square", {"x": x}, timeout=20) for x in range(2000, 2030)))

    results = asyncio.run(main())
    assert [r["value"] for r in results] == [x * x for x in range(2000, 2030)]


def test_duplicate_submission_runs_one_evaluation(fleet):
    client, tmp = fleet["client"], fleet["tmp"]
    counter = tmp / "dup_counter.txt"
    job = {"counter_file": str(counter), "seconds": 0.3, "tag": "dup"}
    # Same content submitted concurrently (twice in one batch, once from a second client)...
    other = BridgeClient(fleet["ipc"], settings=SMALL_LIMIT)
    try:
        futures = client.submit_many("counted", [job, dict(reversed(list(job.items())))], timeout=20)
        futures.append(other.submit_future("counted", job, timeout=20))
        results = [f.result() for f in futures]
        # ... and again once it has finished.
        again = other.run_batch("counted", [job], timeout=20)[0]
    finally:
        other.close()
    assert read_lines(counter) == [f"dup {results[0]['pid']}"]
    assert all(r == results[0] for r in results + [again])
    assert results[0]["status"] == "correct"


def test_salted_resubmission_is_evaluated_again(fleet):
    client, tmp = fleet["client"], fleet["tmp"]
    counter = tmp / "salt_counter.txt"
    job = {"counter_file": str(counter), "seconds": 0.0, "tag": "salt"}
    client.run_batch("counted", [job], timeout=20)
    client.run_batch("counted", [job], timeout=20, salt="repeat-1")
    assert len(read_lines(counter)) == 2


@pytest.mark.parametrize(
    "frames, fragment",
    [
        ([b"\xc1\xc1 not msgpack"], "not valid msgpack"),
        ([msgpack.packb({"v": 1, "kind": Kind.SUBMIT})], "protocol version 1"),  # before leases: refused
        ([msgpack.packb({"v": V, "kind": Kind.SUBMIT, "items": []}), b"x" * 200_000], "exceeds the limit"),
        ([msgpack.packb({"v": V, "kind": "reboot"})], "unknown message kind"),
        ([msgpack.packb({"v": V, "kind": Kind.SUBMIT, "items": [{"id": "a"}]})], "must be a map with id, service"),
        ([msgpack.packb({"v": V, "kind": Kind.SUBMIT, "items": [{"id": "a", "service": "square", "frame": 5}]})],
         "missing payload"),
    ],
)
def test_bad_messages_get_an_error_answer_and_the_broker_keeps_serving(fleet, frames, fragment):
    context, sock = raw_dealer(fleet["tcp"])
    try:
        sock.send_multipart(frames)
        answer = protocol.decode(sock.recv_multipart(), 1 << 20)
    finally:
        sock.close()
        context.term()
    assert answer.kind == Kind.ERROR and fragment in answer.fields["error"]
    assert fleet["client"].run_batch("square", [{"x": 3}], timeout=10)[0]["value"] == 9


def test_forged_job_id_is_refused(fleet):
    context, sock = raw_dealer(fleet["tcp"])
    body = protocol.pack_body({"x": 4})
    try:
        sock.send_multipart(protocol.encode(Kind.SUBMIT, {"items": [{"id": "0" * 64, "service": "square", "frame": 0}]},
                                            [body]))
        answer = protocol.decode(sock.recv_multipart(), 1 << 20)
    finally:
        sock.close()
        context.term()
    assert answer.kind == Kind.ACCEPTED and answer.fields["ids"] == []
    assert "does not match" in answer.fields["errors"][0]["error"]


def test_oversized_job_is_refused_by_the_client_without_sending(fleet):
    result = fleet["client"].run_batch("square", [{"x": 1, "blob": b"z" * 200_000}], timeout=5)[0]
    assert result["status"] == "infra_error" and "exceeds" in result["error"]


def test_full_queue_answers_busy_and_client_retries_until_a_worker_frees_it(fleet):
    # No worker serves "nobody": the queue (max 5) fills and the next jobs are answered busy.
    context, sock = raw_dealer(fleet["tcp"])
    bodies = [protocol.pack_body({"x": i}) for i in range(8)]
    items = [{"id": protocol.job_id("nobody", b), "service": "nobody", "frame": i} for i, b in enumerate(bodies)]
    try:
        sock.send_multipart(protocol.encode(Kind.SUBMIT, {"items": items}, bodies))
        answer = protocol.decode(sock.recv_multipart(), 1 << 20)
    finally:
        sock.close()
        context.term()
    assert len(answer.fields["ids"]) == 5 and len(answer.fields["busy"]) == 3
    # A client waiting on a busy job gets an infra_error at its timeout, not silence.
    result = fleet["client"].run_batch("square", [{"x": 77}], timeout=0.5)[0]
    assert result["status"] == "infra_error" and "timeout" in result["error"]
    # Start a worker for "nobody": the queue drains and the busy client's job then goes through.
    worker = start_worker(fleet["tcp"], "square", services=["nobody", "square"], settings=SMALL_LIMIT)
    try:
        result = fleet["client"].run_batch("square", [{"x": 78}], timeout=20)[0]
        assert result["value"] == 78 * 78
        wait_for(lambda: fleet["client"].status()["queued"]["nobody"] == 0, what="the full queue to drain")
    finally:
        stop(worker)


def test_per_job_timeout_gives_infra_error_and_ipc_transport_works(fleet):
    with BridgeClient(fleet["ipc"], settings=SMALL_LIMIT) as client:
        start = time.monotonic()
        timed_out = client.run_batch("idle", [{"x": 1}], timeout=0.3)[0]  # configured, but no worker serves it
        elapsed = time.monotonic() - start
        ok = client.run_batch("square", [{"x": 12}], timeout=10)[0]
    assert timed_out["status"] == "infra_error", timed_out
    assert 0.3 <= elapsed < 5.0, elapsed  # the deadline is checked every 20 ms; slack for a loaded machine
    assert ok.get("value") == 144, ok


def test_status_lists_workers_queues_and_throughput(fleet):
    status = fleet["client"].status()
    assert {tuple(w["services"]) for w in status["workers"]} >= {("square",), ("counted",)}
    assert status["counters"]["completed"] > 0 and status["counters"]["errors"] > 0
    assert "square" in status["queued"] and status["throughput_60s"] > 0
