"""The socket a client or a worker reaches the broker through: a DEALER with its own routing
identity, no linger, the settings' reconnect back-off, deep high-water marks (the broker's
ROUTER uses the same), and CURVE when a client key is given."""

from __future__ import annotations

import zmq

from bridge.settings import BridgeSettings

HIGH_WATER_MARK = 100_000  # messages queued per peer before ZeroMQ blocks or drops


def connect_dealer(context, identity: bytes, endpoint: str, settings: BridgeSettings, curve=None):
    """A DEALER socket connected to `endpoint` (CURVE with `curve`, a security.CurveClient, when given)."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.ROUTING_ID, identity)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, int(settings.reconnect_min_s * 1000))
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, int(settings.reconnect_max_s * 1000))
    sock.setsockopt(zmq.SNDHWM, HIGH_WATER_MARK)
    sock.setsockopt(zmq.RCVHWM, HIGH_WATER_MARK)
    if curve is not None:
        from bridge.security import secure_client_socket

        secure_client_socket(sock, curve)
    sock.connect(endpoint)
    return sock
