"""Optional CURVE encryption and authentication (ZeroMQ CURVE + a ZAP allow-list).

Off by default: on one host, over loopback TCP or IPC, the bridge runs in the clear. When the
link leaves the host, turn it on:

    cuda-agent keys generate KEYS            # broker, client and worker key pairs + KEYS/authorized/
    cuda-agent broker --bind tcp://0.0.0.0:5555 --curve KEYS
    cuda-agent worker --connect tcp://HOST:5555 --curve KEYS --curve-name worker ...
    cuda-agent submit ... --endpoint tcp://HOST:5555 --curve KEYS --curve-name client

Copy to each host only what it needs: the broker host keeps ``broker.key_secret`` and
``authorized/`` (public keys of every allowed client and worker); a client or worker host keeps
``broker.key`` (the broker's public key) and its own ``<name>.key_secret``. A peer whose public key
is not in ``authorized/`` is refused during the handshake: it never gets a message through.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

DEFAULT_KEY_NAMES = ("broker", "client", "worker")
BROKER_KEY_NAME = "broker"
AUTHORIZED_DIR = "authorized"


class KeyError_(ValueError):
    """A key file is missing or unreadable (user error: one line, no traceback)."""


@dataclass(frozen=True)
class CurveServer:
    """The broker's side: its key pair and the folder of allowed public keys."""

    secret_key_file: Path
    authorized_dir: Path

    @classmethod
    def from_dir(cls, keys_dir: str | Path) -> "CurveServer":
        keys_dir = Path(keys_dir)
        return cls(keys_dir / f"{BROKER_KEY_NAME}.key_secret", keys_dir / AUTHORIZED_DIR)


@dataclass(frozen=True)
class CurveClient:
    """A client's or worker's side: the broker's public key and its own key pair."""

    server_public_file: Path
    secret_key_file: Path

    @classmethod
    def from_dir(cls, keys_dir: str | Path, name: str = "client") -> "CurveClient":
        keys_dir = Path(keys_dir)
        return cls(keys_dir / f"{BROKER_KEY_NAME}.key", keys_dir / f"{name}.key_secret")


def generate_keys(keys_dir: str | Path, names=DEFAULT_KEY_NAMES) -> list[Path]:
    """Write a CURVE key pair per name, and copy every non-broker public key to authorized/."""
    import zmq.auth

    keys_dir = Path(keys_dir)
    authorized = keys_dir / AUTHORIZED_DIR
    authorized.mkdir(parents=True, exist_ok=True)
    written = []
    for name in names:
        public_file, secret_file = zmq.auth.create_certificates(str(keys_dir), name)
        Path(secret_file).chmod(0o600)
        written += [Path(public_file), Path(secret_file)]
        if name != BROKER_KEY_NAME:
            shutil.copy(public_file, authorized / Path(public_file).name)
    return written


def _load(path: Path, need_secret: bool):
    import zmq.auth

    if not Path(path).is_file():
        raise KeyError_(f"CURVE key file not found: {path}")
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except Exception as exc:
        raise KeyError_(f"cannot read CURVE key file {path}: {exc}") from None
    if need_secret and not secret:
        raise KeyError_(f"{path} holds no secret key (use the .key_secret file)")
    return public, secret


def secure_server_socket(context, socket, server: CurveServer):
    """Make ``socket`` a CURVE server that only admits keys in ``server.authorized_dir``.

    Returns the running authenticator; stop it when the socket closes.
    """
    from zmq.auth.thread import ThreadAuthenticator

    public, secret = _load(server.secret_key_file, need_secret=True)
    if not Path(server.authorized_dir).is_dir():
        raise KeyError_(f"authorized-keys folder not found: {server.authorized_dir}")
    auth = ThreadAuthenticator(context)
    auth.start()
    auth.configure_curve(domain="*", location=str(server.authorized_dir))
    socket.curve_publickey = public
    socket.curve_secretkey = secret
    socket.curve_server = True
    return auth


def secure_client_socket(socket, client: CurveClient) -> None:
    """Make ``socket`` a CURVE client of the broker whose public key is given."""
    server_public, _ = _load(client.server_public_file, need_secret=False)
    public, secret = _load(client.secret_key_file, need_secret=True)
    socket.curve_serverkey = server_public
    socket.curve_publickey = public
    socket.curve_secretkey = secret


def as_curve_client(curve, default_name: str) -> CurveClient | None:
    """Accept None, a CurveClient, or a keys folder path (using ``<default_name>.key_secret``)."""
    if curve is None or isinstance(curve, CurveClient):
        return curve
    return CurveClient.from_dir(curve, default_name)
