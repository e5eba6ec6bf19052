"""Who may answer for a job, and what the broker takes in: leases, known services, per-client bounds.

Each test plays one adversary or overload against real processes on loopback (or, where only the
broker's bookkeeping matters, against a Broker driven message by message). Jobs are held in flight
by the `gated` handler until the test releases them: no sleeps tuned to the machine's speed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sqlite3
import stat

import pytest

from bridge import protocol
from bridge.broker import Broker
from bridge.client import BridgeClient
from bridge.journal import Journal
from bridge.protocol import Kind
from bridge.settings import FAST_TEST_SETTINGS
from tests.bridge_procs import (RawPeer, free_tcp_endpoint, read_lines, start_broker, start_worker, stop, wait_for,
                                wait_for_workers)

FORGED = protocol.pack_body({"status": "correct", "reward": 3, "verdict": "forged"})
# Fast heartbeats, but a peer counts as gone only after 2 s of silence: on a starved 2-core machine
# a worker silent for 0.3 s would be requeued (a second evaluation) and a client would resubmit,
# and these tests count evaluations and refusals exactly.
PATIENT = dataclasses.replace(FAST_TEST_SETTINGS, liveness=20)


def _gated_job(tmp_path, tag: str) -> dict:
    return {"start_file": str(tmp_path / f"{tag}.started"), "release_file": str(tmp_path / f"{tag}.release"),
            "counter_file": str(tmp_path / f"{tag}.done"), "tag": tag}


def _release(job: dict) -> None:
    open(job["release_file"], "w").close()


# ---------------------------------------------------------------------------- leases


def test_forged_done_without_the_lease_is_refused_and_the_real_verdict_arrives_once(tmp_path):
    """A candidate that learnt its job id (from the journal, or by hashing its own job) sends
    'done' with a perfect score while the real evaluation runs: the broker refuses every form of
    the forgery and delivers the worker's verdict, once."""
    endpoint, journal = free_tcp_endpoint(), tmp_path / "journal.db"
    broker = start_broker(endpoint, journal, PATIENT)
    worker = start_worker(endpoint, "gated", settings=PATIENT)
    job = _gated_job(tmp_path, "real")
    peers = []
    try:
        with BridgeClient(endpoint, settings=PATIENT) as client:
            wait_for_workers(client, 1)
            future = client.submit_future("evaluate", job, timeout=120)
            wait_for(lambda: read_lines(job["start_file"]), what="the evaluation to start")
            (jid,) = [row[0] for row in sqlite3.connect(journal).execute("SELECT id FROM jobs")]
            assert jid == protocol.job_id("evaluate", protocol.pack_body(job))

            # 1. a peer that never registered, without a lease; 2. with a made-up lease and the
            # right attempt; 3. a rogue that registered as a worker of the service, made-up lease.
            forgeries = [{"id": jid, "body": FORGED},
                         {"id": jid, "lease": "0" * 32, "attempt": 1, "body": FORGED}]
            for fields in forgeries:
                peer = RawPeer(endpoint)
                peers.append(peer)
                peer.send(Kind.DONE, {"items": [fields]})
                answer = peer.wait_for(Kind.ERROR, unless=future.done)
                assert not future.done(), f"a forged result reached the client: {future.result()}"
                assert answer.fields["error"]
            rogue = RawPeer(endpoint, identity=b"rogue-worker")
            peers.append(rogue)
            rogue.send(Kind.READY, {"services": ["evaluate"], "capacity": 1, "inflight": []})
            rogue.send(Kind.DONE, {"items": [{"id": jid, "lease": "f" * 32, "attempt": 1, "body": FORGED}]})
            refusal = rogue.wait_for(Kind.ERROR, heartbeat=True, unless=future.done)
            assert not future.done(), f"a forged result reached the client: {future.result()}"
            assert "lease" in refusal.fields["error"] and refusal.fields["ids"] == [jid]

            _release(job)
            result = future.result(timeout=60)
            status = client.status()
        assert result["verdict"] == "real" and result["status"] == "incorrect" and result["reward"] == -1
        assert read_lines(job["counter_file"]) == [f"real {result['pid']}"], "evaluated exactly once"
        counters = status["counters"]
        assert counters["completed"] == 1 and counters["leases_refused"] == 2
        assert counters["errors"] >= 1  # the 'done' without any lease is not even a well-formed result
    finally:
        for peer in peers:
            peer.close()
        stop(worker)
        stop(broker)


def test_a_worker_answering_after_its_job_was_reassigned_is_refused(tmp_path):
    """Worker A goes silent holding a job; the job moves to worker B with a new lease; A comes back
    and answers with its old lease: refused and counted, B's verdict is the one delivered."""
    endpoint = free_tcp_endpoint()
    broker = start_broker(endpoint, tmp_path / "journal.db", PATIENT)
    job = _gated_job(tmp_path, "moved")
    worker_b = None
    stale = RawPeer(endpoint, identity=b"worker-a")
    try:
        with BridgeClient(endpoint, settings=PATIENT) as client:
            stale.send(Kind.READY, {"services": ["evaluate"], "capacity": 1, "inflight": []})
            stale.heartbeat_until(lambda: len(client.status()["workers"]) == 1, what="worker A to register")
            future = client.submit_future("evaluate", job, timeout=120)
            item = stale.wait_for(Kind.JOBS, heartbeat=True).fields["items"][0]
            lease, attempt = item.get("lease", ""), item.get("attempt")
            worker_b = start_worker(endpoint, "gated", settings=PATIENT)
            stale.heartbeat_until(lambda: len(client.status()["workers"]) == 2, what="worker B to register")
            # A falls silent: after the silence limit the job is requeued and B starts it.
            wait_for(lambda: read_lines(job["start_file"]), timeout=60, what="worker B to start the job")
            seen = len(stale.received)
            stale.send(Kind.DONE, {"items": [{"id": item["id"], "lease": lease, "attempt": attempt, "body": FORGED}]})
            refusal = stale.wait_for(Kind.ERROR, start=seen, unless=future.done)
            assert not future.done(), f"the stale worker's result reached the client: {future.result()}"
            _release(job)
            result = future.result(timeout=60)
            counters = client.status()["counters"]
        assert "lease" in refusal.fields["error"]
        assert result["verdict"] == "real"
        assert counters["workers_lost"] == 1 and counters["requeued"] == 1
        assert counters["leases_refused"] == 1 and counters["completed"] == 1
    finally:
        stale.close()
        if worker_b is not None:
            stop(worker_b)
        stop(broker)


def _frames(identity: bytes, kind: str, fields=None, payloads=()):
    return [identity, *protocol.encode(kind, fields, payloads)]


def _submit(broker: Broker, client: bytes, service: str, job: dict) -> str:
    body = protocol.pack_body(job)
    jid = protocol.job_id(service, body)
    broker._handle(_frames(client, Kind.SUBMIT, {"items": [{"id": jid, "service": service, "body": body}]}))
    return jid


def _jobs_sent(broker: Broker, worker: bytes) -> list:
    items = []
    for identity, frames in broker.outbox:
        message = protocol.decode(frames, 1 << 30)
        if identity == worker and message.kind == Kind.JOBS:
            items += message.fields["items"]
    broker.outbox.clear()
    return items


def test_the_journal_keeps_a_hash_of_the_lease_and_a_restarted_broker_accepts_only_its_holder(tmp_path):
    """The token never reaches the disk. After a broker restart the worker that held the lease
    may still deliver (no re-run); another worker, or a wrong token, may not."""
    journal = tmp_path / "journal.db"
    first = Broker("tcp://127.0.0.1:*", journal, FAST_TEST_SETTINGS)
    try:
        first._handle(_frames(b"w1", Kind.READY, {"services": ["evaluate"], "capacity": 1, "inflight": []}))
        jid = _submit(first, b"c1", "evaluate", {"x": 1})
        first._dispatch()
        first.journal.commit()
        (item,) = _jobs_sent(first, b"w1")
        lease = item["lease"]
        assert item["attempt"] == 1 and len(lease) == 32
        on_disk = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("journal.db"))
        assert lease.encode() not in on_disk
        assert hashlib.sha256(lease.encode()).digest() in on_disk
    finally:
        first.close()

    second = Broker("tcp://127.0.0.1:*", journal, FAST_TEST_SETTINGS)
    try:
        assert jid in second.jobs and list(second.queues["evaluate"]) == [jid]
        claim = {"id": jid, "lease": lease, "attempt": 1}
        second._handle(_frames(b"w2", Kind.READY, {"services": ["evaluate"], "capacity": 1, "inflight": [claim]}))
        second._handle(_frames(b"w1", Kind.DONE, {"items": [{**claim, "lease": "1" * 32, "body": FORGED}]}))
        second._handle(_frames(b"w2", Kind.DONE, {"items": [{**claim, "body": FORGED}]}))
        assert second.counters["leases_refused"] == 3 and jid in second.jobs
        real = protocol.pack_body({"status": "correct", "verdict": "real"})
        second._handle(_frames(b"w1", Kind.DONE, {"items": [{**claim, "body": real}]}))
        assert jid not in second.jobs and second.to_send[b"c1"][jid] == real
        assert second.counters["completed"] == 1 and not second.queues["evaluate"], "not run again"
    finally:
        second.close()


def test_failure_reports_need_the_lease_too(tmp_path):
    """A forged 'failed' would burn the job's attempts until it ends as infra_error."""
    broker = Broker("tcp://127.0.0.1:*", tmp_path / "j.db", FAST_TEST_SETTINGS)
    try:
        broker._handle(_frames(b"w1", Kind.READY, {"services": ["evaluate"], "capacity": 1, "inflight": []}))
        jid = _submit(broker, b"c1", "evaluate", {"x": 2})
        broker._dispatch()
        (item,) = _jobs_sent(broker, b"w1")
        for _ in range(5):
            broker._handle(_frames(b"w1", Kind.FAILED, {"items": [{"id": jid, "lease": "2" * 32, "attempt": 1,
                                                                   "reason": "forged"}]}))
        assert broker.jobs[jid].attempts == 0 and broker.counters["leases_refused"] == 5
        broker._handle(_frames(b"w1", Kind.FAILED, {"items": [{"id": jid, "lease": item["lease"], "attempt": 1,
                                                               "reason": "child died"}]}))
        assert broker.jobs[jid].attempts == 1 and broker.jobs[jid].lease_hash is None
    finally:
        broker.close()


def test_the_journal_is_readable_by_its_owner_only(tmp_path):
    journal = Journal(tmp_path / "fresh" / "journal.db")
    journal.accept("j", "evaluate", b"body", None, b"c")
    journal.commit()
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(tmp_path / "fresh") == 0o700
    for name in ("journal.db", "journal.db-wal", "journal.db-shm"):
        assert mode(tmp_path / "fresh" / name) == 0o600, name
    journal.close()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    old = shared / "old.db"
    sqlite3.connect(old).close()
    old.chmod(0o644)
    Journal(old).close()
    assert mode(old) == 0o600
    assert mode(shared) == 0o755, "a folder the journal did not create is left as it is"


# ---------------------------------------------------------------------------- services


def test_a_job_for_an_unknown_service_is_refused_at_submission_and_nothing_is_kept(tmp_path):
    endpoint = free_tcp_endpoint()
    settings = dataclasses.replace(PATIENT, services=("evaluate",))
    broker = start_broker(endpoint, tmp_path / "journal.db", settings)
    worker = start_worker(endpoint, "square", services=["square"], settings=settings)
    try:
        with BridgeClient(endpoint, settings=settings) as client:
            wait_for_workers(client, 1)
            big = {"x": 3, "blob": b"z" * (8 << 20)}
            refused = client.run_batch("no-such-service", [big], timeout=20)[0]
            squared = client.run_batch("square", [{"x": 4}], timeout=20)[0]  # registered by its worker
            queued = client.submit_future("evaluate", {"x": 5}, timeout=60)  # configured, no worker yet
            status = wait_for(lambda: (s := client.status()) and s["queued"].get("evaluate") == 1 and s,
                              timeout=60, what="the configured service's job to be queued")
            assert not queued.done()
        assert refused["status"] == "infra_error"
        assert "unknown service 'no-such-service'" in refused["error"] and "known: evaluate, square" in refused["error"]
        assert squared["value"] == 16
        assert status["counters"]["unknown_service"] >= 1  # more if the client resubmitted before the answer
        assert status["counters"]["accepted"] == 2
        assert status["unfinished"] == 1 and status["journal"]["unfinished"] == 1
        assert status["unfinished_bytes"] < 1024, "the refused job's 8 MiB are not kept"
    finally:
        stop(worker)
        stop(broker)


def test_a_status_asked_in_the_loop_iteration_of_a_submission_counts_it_in_the_journal_too(tmp_path):
    """The journal writes a loop iteration's changes at its end; a status handled before then reported the
    job as unfinished in memory and not yet in the journal (seen as a flaky end-to-end test)."""
    broker = Broker("tcp://127.0.0.1:*", tmp_path / "j.db", FAST_TEST_SETTINGS)
    try:
        jid = _submit(broker, b"c1", "evaluate", {"x": 1})
        broker._handle(_frames(b"c1", Kind.STATUS))
        status = broker.status()
        assert jid in broker.jobs and status["unfinished"] == 1
        assert status["journal"]["unfinished"] == 1
    finally:
        broker.close()


def test_services_a_worker_registered_are_remembered_across_a_restart(tmp_path):
    settings = dataclasses.replace(FAST_TEST_SETTINGS, services=())
    broker = Broker("tcp://127.0.0.1:*", tmp_path / "j.db", settings)
    try:
        assert _submit(broker, b"c", "special", {"x": 1}) not in broker.jobs
        broker._handle(_frames(b"w", Kind.READY, {"services": ["special"], "capacity": 1, "inflight": []}))
        broker.journal.commit()
    finally:
        broker.close()
    again = Broker("tcp://127.0.0.1:*", tmp_path / "j.db", settings)
    try:
        assert again.known_services == {"special"}
        assert _submit(again, b"c", "special", {"x": 1}) in again.jobs  # before any worker is back
    finally:
        again.close()


# ---------------------------------------------------------------------------- per-client bounds

BOUNDED = dataclasses.replace(PATIENT, max_client_jobs=3, max_client_bytes=10_000,
                              services=("evaluate", "idle"))


def _raw_submit(peer: RawPeer, service: str, jobs: list):
    bodies = [protocol.pack_body(job) for job in jobs]
    items = [{"id": protocol.job_id(service, b), "service": service, "frame": i} for i, b in enumerate(bodies)]
    seen = len(peer.received)
    peer.send(Kind.SUBMIT, {"items": items}, bodies)
    return [item["id"] for item in items], peer.wait_for(Kind.ACCEPTED, start=seen).fields


def test_per_client_bounds_answer_busy_with_the_reason_and_refuse_what_can_never_fit(tmp_path):
    endpoint = free_tcp_endpoint()
    broker = start_broker(endpoint, tmp_path / "journal.db", BOUNDED)
    first, second, third = RawPeer(endpoint), RawPeer(endpoint), RawPeer(endpoint)
    try:
        ids, answer = _raw_submit(first, "idle", [{"n": i} for i in range(5)])
        assert answer["ids"] == ids[:3] and answer["busy"] == ids[3:]
        assert "max_client_jobs=3" in answer["busy_reason"]
        ids, answer = _raw_submit(second, "idle", [{"n": 0}, {"n": 100}])  # a duplicate costs it nothing
        assert answer["ids"] == ids and answer["busy"] == []
        ids, answer = _raw_submit(third, "idle", [{"b": b"x" * 6000}, {"b": b"y" * 6000}, {"b": b"z" * 20_000}])
        assert answer["ids"] == ids[:1] and answer["busy"] == ids[1:2]
        assert "max_client_bytes=10000" in answer["busy_reason"]
        assert [e["id"] for e in answer["errors"]] == ids[2:] and "can never fit" in answer["errors"][0]["error"]
    finally:
        for peer in (first, second, third):
            peer.close()
        stop(broker)


def test_a_client_beyond_its_bound_is_held_back_and_every_job_completes_once(tmp_path):
    endpoint = free_tcp_endpoint()
    settings = dataclasses.replace(BOUNDED, max_client_jobs=2)
    broker = start_broker(endpoint, tmp_path / "journal.db", settings)
    worker = start_worker(endpoint, "counted", settings=settings)
    counter = tmp_path / "counter.txt"
    jobs = [{"counter_file": str(counter), "seconds": 0.02, "tag": f"b{i}"} for i in range(12)]
    try:
        with BridgeClient(endpoint, settings=settings) as client:
            wait_for_workers(client, 1)
            results = client.run_batch("evaluate", jobs, timeout=120)
            counters = client.status()["counters"]
        assert [r["status"] for r in results] == ["correct"] * 12
        assert [r["tag"] for r in results] == [j["tag"] for j in jobs]
        assert sorted(line.split()[0] for line in read_lines(counter)) == sorted(j["tag"] for j in jobs)
        assert counters["busy"] >= 10, "the bound held the client back"
        assert counters["accepted"] == 12 and counters["completed"] == 12
    finally:
        stop(worker)
        stop(broker)


def test_a_job_still_refused_as_busy_at_its_timeout_says_so(tmp_path):
    endpoint = free_tcp_endpoint()
    settings = dataclasses.replace(BOUNDED, max_client_jobs=1)
    broker = start_broker(endpoint, tmp_path / "journal.db", settings)
    try:
        with BridgeClient(endpoint, settings=settings) as client:
            waits, held_back = client.run_batch("idle", [{"n": 1}, {"n": 2}], timeout=3.0)
        assert waits["status"] == held_back["status"] == "infra_error"
        assert "within the timeout" in waits["error"] and "busy" not in waits["error"]
        assert "was busy" in held_back["error"] and "max_client_jobs=1" in held_back["error"]
    finally:
        stop(broker)


@pytest.mark.parametrize("bad", [[{"id": "x"}], ["x"], "x"])
def test_ready_with_malformed_inflight_claims_is_an_error(tmp_path, bad):
    broker = Broker("tcp://127.0.0.1:*", tmp_path / "j.db", FAST_TEST_SETTINGS)
    try:
        broker._handle(_frames(b"w", Kind.READY, {"services": ["evaluate"], "inflight": bad}))
        if bad == [{"id": "x"}]:  # a claim without a lease on an unknown job: nothing to adopt
            assert b"w" in broker.workers
        else:
            assert b"w" not in broker.workers and broker.counters["errors"] == 1
    finally:
        broker.close()
