"""The client's silence rule against a scripted broker: a broker that stops answering pings gets every
waiting job again, while a client thread that itself stalled (no pings went out) resubmits nothing."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import zmq

from bridge import protocol
from bridge.client import BridgeClient
from bridge.protocol import Kind
from bridge.settings import FAST_TEST_SETTINGS
from tests.bridge_procs import free_tcp_endpoint, wait_for

SETTINGS = dataclasses.replace(FAST_TEST_SETTINGS, heartbeat_s=0.1, liveness=3)  # silent after 0.3 s


class ScriptedBroker:
    """A ROUTER that accepts every submission and answers pings while `answering` is set; counts SUBMITs per job."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.bind(endpoint)
        self.answering = threading.Event()
        self.answering.set()
        self.submits: dict[str, int] = {}
        self.pings = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.socket.poll(20):
                continue
            peer, *frames = self.socket.recv_multipart()
            message = protocol.decode(frames, 1 << 30)
            if message.kind == Kind.SUBMIT:
                ids = [item["id"] for item in message.fields["items"]]
                for jid in ids:
                    self.submits[jid] = self.submits.get(jid, 0) + 1
                self.socket.send_multipart([peer, *protocol.encode(Kind.ACCEPTED, {"ids": ids, "epoch": "e1"})])
            elif message.kind == Kind.PING:
                self.pings += 1
                if self.answering.is_set():
                    self.socket.send_multipart([peer, *protocol.encode(Kind.PONG, {"epoch": "e1"})])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.socket.close(linger=0)
        self.context.term()


class StallingClient(BridgeClient):
    """A client whose thread can be made to stop for a while, as a thread starved of the interpreter does."""

    stall_s = 0.0

    def _receive(self) -> None:
        super()._receive()
        if self.stall_s:
            stall, self.stall_s = self.stall_s, 0.0
            time.sleep(stall)


def _one_waiting_job(client: BridgeClient, broker: ScriptedBroker) -> str:
    client.submit_future("evaluate", {"task": "t"}, timeout=60)
    wait_for(lambda: broker.submits, timeout=10, what="the job's first submission")
    (jid,) = broker.submits
    return jid


@pytest.fixture
def broker():
    scripted = ScriptedBroker(free_tcp_endpoint())
    yield scripted
    scripted.close()


def test_a_broker_that_stops_answering_pings_gets_the_waiting_job_again(broker):
    with BridgeClient(broker.endpoint, settings=SETTINGS) as client:
        jid = _one_waiting_job(client, broker)
        broker.answering.clear()
        wait_for(lambda: broker.submits[jid] >= 2, timeout=10, what="the job's resubmission")


def test_a_stalled_client_thread_resubmits_nothing_when_the_broker_answers(broker):
    with StallingClient(broker.endpoint, settings=SETTINGS) as client:
        jid = _one_waiting_job(client, broker)
        pings = broker.pings
        client.stall_s = 1.5  # five silence limits without a ping sent
        wait_for(lambda: client.stall_s == 0.0, timeout=10, what="the stall to begin")
        wait_for(lambda: broker.pings >= pings + 10, timeout=20, what="pings after the stall")
        assert broker.submits == {jid: 1}
