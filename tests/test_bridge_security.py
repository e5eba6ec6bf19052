"""CURVE on: a key not on the broker's allow-lists gets nothing through, and a key gets only its role."""

from __future__ import annotations

import dataclasses
import shutil

import zmq.auth

from bridge import protocol
from bridge.broker import Broker
from bridge.client import BridgeClient
from bridge.protocol import Kind
from bridge.security import (CurveClient, CurveServer, KeyError_, RoleAuthenticator, generate_keys,
                             load_role_keys, secure_client_socket)
from bridge.settings import FAST_TEST_SETTINGS
from tests.bridge_procs import (RawPeer, free_tcp_endpoint, start_broker, start_worker, stop, wait_for,
                                wait_for_workers)

import pytest


def test_generate_keys_writes_pairs_and_authorizes_each_key_for_its_role(tmp_path):
    generate_keys(tmp_path)
    assert sorted(p.name for p in (tmp_path / "authorized").iterdir()) == ["clients", "workers"]
    assert [p.name for p in (tmp_path / "authorized" / "clients").iterdir()] == ["client.key"]
    assert [p.name for p in (tmp_path / "authorized" / "workers").iterdir()] == ["worker.key"]
    roles = load_role_keys(CurveServer.from_dir(tmp_path))
    assert sorted(roles.values()) == ["client", "worker"]
    public, secret = zmq.auth.load_certificate(str(tmp_path / "client.key_secret"))
    assert len(public) == 40 and len(secret) == 40  # Z85 of 32-byte keys
    assert (tmp_path / "client.key_secret").stat().st_mode & 0o077 == 0


def test_missing_key_file_is_one_clear_error(tmp_path):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    try:
        with pytest.raises(KeyError_, match="not found"):
            secure_client_socket(sock, CurveClient.from_dir(tmp_path))
    finally:
        sock.close(0)


def test_known_client_key_works_and_unknown_key_is_refused(tmp_path):
    keys = tmp_path / "keys"
    generate_keys(keys)
    outsider = tmp_path / "outsider"
    generate_keys(outsider, clients=("intruder",), workers=(), broker=False)
    (outsider / "broker.key").write_bytes((keys / "broker.key").read_bytes())  # knows the server key only

    endpoint = free_tcp_endpoint()
    broker = start_broker(endpoint, tmp_path / "journal.db", curve=CurveServer.from_dir(keys))
    worker = start_worker(endpoint, "square", curve=CurveClient.from_dir(keys, "worker"))
    try:
        with BridgeClient(endpoint, curve=keys, settings=FAST_TEST_SETTINGS) as client:
            wait_for_workers(client, 1)
            known = client.run_batch("evaluate", [{"x": 6}], timeout=10)[0]
            with BridgeClient(endpoint, curve=CurveClient.from_dir(outsider, "intruder"),
                              settings=FAST_TEST_SETTINGS) as intruder:
                refused = intruder.run_batch("evaluate", [{"x": 7}], timeout=1.0)[0]
                assert intruder.status(timeout=0.5) is None
            with BridgeClient(endpoint, settings=FAST_TEST_SETTINGS) as plain:
                assert plain.status(timeout=0.5) is None  # no CURVE at all: refused too
            counters = client.status()["counters"]
        assert known["status"] == "correct" and known["value"] == 36
        assert refused["status"] == "infra_error"
        assert counters["accepted"] == 1 and counters["handshakes_refused"] >= 1
    finally:
        stop(worker)
        stop(broker)


def test_a_client_key_cannot_act_as_a_worker_and_a_worker_key_cannot_submit(tmp_path):
    """The role belongs to the key: a holder of a client key who starts a worker (one that answers
    every job with a perfect score) is refused on every message, and so is a worker key that submits."""
    keys = tmp_path / "keys"
    generate_keys(keys)
    endpoint = free_tcp_endpoint()
    broker = start_broker(endpoint, tmp_path / "journal.db", curve=CurveServer.from_dir(keys))
    impostor = start_worker(endpoint, "forged", curve=CurveClient.from_dir(keys, "client"), name="impostor")
    honest = None
    peer = RawPeer(endpoint, curve=CurveClient.from_dir(keys, "client"), identity=b"raw-impostor")
    try:
        with BridgeClient(endpoint, curve=keys, settings=FAST_TEST_SETTINGS) as client:
            future = client.submit_future("evaluate", {"x": 6}, timeout=120)
            # The impostor's 'ready' and heartbeats are refused and counted; it is never a worker.
            wait_for(lambda: client.status()["counters"]["roles_refused"] >= 3, timeout=60,
                     what="the impostor to be refused")
            jid = protocol.job_id("evaluate", protocol.pack_body({"x": 6}))
            peer.send(Kind.READY, {"services": ["evaluate"], "capacity": 1, "inflight": []})
            peer.send(Kind.DONE, {"items": [{"id": jid, "lease": "0" * 32, "attempt": 1,
                                             "body": protocol.pack_body({"status": "correct", "reward": 3})}]})
            refusal = peer.wait_for(Kind.ERROR)
            assert "needs a worker key" in refusal.fields["error"]
            assert client.status()["workers"] == [] and not future.done()

            with BridgeClient(endpoint, curve=CurveClient.from_dir(keys, "worker"),
                              settings=FAST_TEST_SETTINGS) as wrong_role:
                submitted = wrong_role.run_batch("evaluate", [{"x": 7}], timeout=30)[0]
            honest = start_worker(endpoint, "square", curve=CurveClient.from_dir(keys, "worker"), name="honest")
            result = future.result(timeout=60)
            status = client.status()
        assert result["value"] == 36 and "verdict" not in result, "the honest worker's answer"
        assert submitted["status"] == "infra_error" and "needs a client key" in submitted["error"]
        assert [w["id"] for w in status["workers"]] == ["honest"]
        assert status["counters"]["accepted"] == 1 and status["counters"]["completed"] == 1
    finally:
        peer.close()
        for proc in (impostor, honest):
            if proc is not None:
                stop(proc)
        stop(broker)


def test_a_worker_key_cannot_speak_for_a_worker_another_key_registered(tmp_path):
    keys = tmp_path / "keys"
    generate_keys(keys, workers=("worker", "other"))
    endpoint = free_tcp_endpoint()
    patient = dataclasses.replace(FAST_TEST_SETTINGS, liveness=300)  # w-1 stays registered while silent
    broker = start_broker(endpoint, tmp_path / "journal.db", patient, curve=CurveServer.from_dir(keys))
    first = RawPeer(endpoint, curve=CurveClient.from_dir(keys, "worker"), identity=b"w-1")
    second = None
    try:
        with BridgeClient(endpoint, curve=keys, settings=patient) as client:
            first.send(Kind.READY, {"services": ["evaluate"], "capacity": 1, "inflight": []})
            first.heartbeat_until(lambda: len(client.status()["workers"]) == 1, what="w-1 to register")
            # Another worker key connects with w-1's routing id (the broker hands the id over to the
            # newest connection) and speaks for it: refused, because w-1 registered with another key.
            second = RawPeer(endpoint, curve=CurveClient.from_dir(keys, "other"), identity=b"w-1")
            second.send(Kind.HEARTBEAT)
            assert "registered with another key" in second.wait_for(Kind.ERROR).fields["error"]
            assert client.status()["counters"]["roles_refused"] >= 1
    finally:
        first.close()
        if second is not None:
            second.close()
        stop(broker)


def test_role_allow_lists_are_checked_when_the_broker_starts(tmp_path):
    keys = tmp_path / "keys"
    generate_keys(keys)
    shutil.copy(keys / "client.key", keys / "authorized" / "workers" / "client.key")
    with pytest.raises(KeyError_, match="both client and worker"):
        load_role_keys(CurveServer.from_dir(keys))
    flat = tmp_path / "flat"
    generate_keys(flat)
    shutil.copy(flat / "client.key", flat / "authorized" / "client.key")  # the layout before roles
    with pytest.raises(KeyError_, match="keys without a role"):
        Broker("tcp://127.0.0.1:*", tmp_path / "j.db", FAST_TEST_SETTINGS, curve=CurveServer.from_dir(flat))


def test_the_zap_handler_labels_each_key_with_its_role_and_refuses_the_rest():
    from zmq.utils import z85

    client_key, worker_key, stranger = b"c" * 32, b"w" * 32, b"s" * 32
    context = zmq.Context()
    try:
        auth = RoleAuthenticator(context, {z85.encode(client_key): "client", z85.encode(worker_key): "worker"})
        try:
            def ask(mechanism, *credentials):
                return auth.decide([b"1.0", b"7", b"", b"127.0.0.1", b"", mechanism, *credentials])

            assert ask(b"CURVE", client_key)[2:5] == [b"200", b"OK", b"client:" + z85.encode(client_key)]
            assert ask(b"CURVE", worker_key)[4] == b"worker:" + z85.encode(worker_key)
            assert ask(b"CURVE", stranger)[2] == b"400" and ask(b"NULL")[2] == b"400"
            assert auth.refused == 2
        finally:
            auth.stop()
    finally:
        context.term()
