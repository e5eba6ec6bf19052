"""CURVE on: a client whose key is not on the broker's allow-list gets nothing through."""

from __future__ import annotations

import zmq.auth

from bridge.client import BridgeClient
from bridge.security import CurveClient, CurveServer, KeyError_, generate_keys, secure_client_socket
from bridge.settings import FAST_TEST_SETTINGS
from tests.bridge_procs import free_tcp_endpoint, start_broker, start_worker, stop, wait_for_workers

import pytest


def test_generate_keys_writes_pairs_and_authorizes_only_clients_and_workers(tmp_path):
    generate_keys(tmp_path)
    authorized = sorted(p.name for p in (tmp_path / "authorized").iterdir())
    assert authorized == ["client.key", "worker.key"]
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
    generate_keys(outsider, names=("intruder",))
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
        assert counters["accepted"] == 1
    finally:
        stop(worker)
        stop(broker)
