"""Optional CURVE encryption and authentication, with a role for every key (client or worker).

Off by default: on one host, over loopback TCP or IPC, the bridge runs in the clear. When the
link leaves the host, turn it on:

    cuda-agent keys generate KEYS            # broker, client and worker key pairs + KEYS/authorized/
    cuda-agent broker --bind tcp://0.0.0.0:5555 --curve KEYS
    cuda-agent worker --connect tcp://HOST:5555 --curve KEYS --curve-name worker ...
    cuda-agent submit ... --endpoint tcp://HOST:5555 --curve KEYS --curve-name client

The broker admits the public keys in ``authorized/clients/`` as clients and those in
``authorized/workers/`` as workers; a key in neither is refused during the handshake (it never
gets a message through), and a key in both is a configuration error. The broker's ZAP handler
(:class:`RoleAuthenticator`) gives each admitted connection the User-Id ``"<role>:<public key>"``;
ZeroMQ attaches that User-Id to every message the connection delivers, and the broker checks the
role on every message: a client key cannot register as a worker, heartbeat, or send a result,
and a worker key cannot submit. The role is a property of the key, fixed at the handshake, not
something a peer says about itself.

Copy to each host only what it needs: the broker host keeps ``broker.key_secret`` and
``authorized/``; a client or worker host keeps ``broker.key`` (the broker's public key) and its own
``<name>.key_secret``.
"""

from __future__ import annotations

import logging
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("bridge.security")

DEFAULT_CLIENT_NAMES = ("client",)
DEFAULT_WORKER_NAMES = ("worker",)
BROKER_KEY_NAME = "broker"
AUTHORIZED_DIR = "authorized"
ROLE_DIRS = {"client": "clients", "worker": "workers"}
ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq asks a socket's context for authentication


class KeyError_(ValueError):
    """A key file is missing or unreadable (user error: one line, no traceback)."""


@dataclass(frozen=True)
class CurveServer:
    """The broker's side: its key pair and one folder of allowed public keys per role."""

    secret_key_file: Path
    clients_dir: Path
    workers_dir: Path

    @classmethod
    def from_dir(cls, keys_dir: str | Path) -> "CurveServer":
        keys_dir = Path(keys_dir)
        authorized = keys_dir / AUTHORIZED_DIR
        return cls(keys_dir / f"{BROKER_KEY_NAME}.key_secret", authorized / ROLE_DIRS["client"],
                   authorized / ROLE_DIRS["worker"])

    def missing(self) -> list[Path]:
        """The files and folders this configuration needs that do not exist."""
        return [p for p, ok in ((self.secret_key_file, self.secret_key_file.is_file()),
                                (self.clients_dir, self.clients_dir.is_dir()),
                                (self.workers_dir, self.workers_dir.is_dir())) if not ok]


@dataclass(frozen=True)
class CurveClient:
    """A client's or worker's side: the broker's public key and its own key pair."""

    server_public_file: Path
    secret_key_file: Path

    @classmethod
    def from_dir(cls, keys_dir: str | Path, name: str = "client") -> "CurveClient":
        keys_dir = Path(keys_dir)
        return cls(keys_dir / f"{BROKER_KEY_NAME}.key", keys_dir / f"{name}.key_secret")


def generate_keys(keys_dir: str | Path, clients=DEFAULT_CLIENT_NAMES, workers=DEFAULT_WORKER_NAMES,
                  broker: bool = True) -> list[Path]:
    """Write a CURVE key pair per name; authorize client names as clients and worker names as workers.

    The broker's pair is made too unless ``broker=False`` (adding keys to an existing folder).
    """
    import zmq.auth

    clients, workers = tuple(clients), tuple(workers)
    both = sorted(set(clients) & set(workers))
    if both:
        raise KeyError_(f"a key cannot be both a client and a worker: {', '.join(both)}")
    if BROKER_KEY_NAME in clients + workers:
        raise KeyError_(f"{BROKER_KEY_NAME!r} is the broker's key name")
    keys_dir = Path(keys_dir)
    keys_dir.mkdir(parents=True, exist_ok=True)
    written = []
    plan = ([(BROKER_KEY_NAME, None)] if broker else []) + [(n, "client") for n in clients] + \
        [(n, "worker") for n in workers]
    for role in ROLE_DIRS.values():
        (keys_dir / AUTHORIZED_DIR / role).mkdir(parents=True, exist_ok=True)
    for name, role in plan:
        public_file, secret_file = zmq.auth.create_certificates(str(keys_dir), name)
        Path(secret_file).chmod(0o600)
        written += [Path(public_file), Path(secret_file)]
        if role is not None:
            shutil.copy(public_file, keys_dir / AUTHORIZED_DIR / ROLE_DIRS[role] / Path(public_file).name)
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


def load_role_keys(server: CurveServer) -> dict[bytes, str]:
    """{z85 public key: "client" | "worker"} from the two allow-list folders."""
    import zmq.auth

    for folder in (server.clients_dir, server.workers_dir):
        if not Path(folder).is_dir():
            raise KeyError_(f"authorized-keys folder not found: {folder}")
    flat = sorted(p.name for p in Path(server.clients_dir).parent.glob("*.key"))
    if flat:
        raise KeyError_(f"{Path(server.clients_dir).parent} holds keys without a role ({', '.join(flat)}): "
                        f"move client keys to {ROLE_DIRS['client']}/ and worker keys to {ROLE_DIRS['worker']}/")
    roles: dict[bytes, str] = {}
    for role, folder in (("client", server.clients_dir), ("worker", server.workers_dir)):
        try:
            keys = zmq.auth.load_certificates(str(folder))
        except Exception as exc:
            raise KeyError_(f"cannot read the keys in {folder}: {exc}") from None
        for key in keys:
            if roles.get(key, role) != role:
                raise KeyError_(f"public key {key.decode()[:8]}... is authorized as both client and worker")
            roles[key] = role
    return roles


class RoleAuthenticator:
    """A ZAP handler (ZeroMQ RFC 27) that admits CURVE keys by role and labels their connections.

    Runs in its own thread on the broker's context. Every admitted connection gets the User-Id
    ``"client:<z85 key>"`` or ``"worker:<z85 key>"``; anything else (an unknown key, a peer
    without CURVE) is refused before it can send a message, and counted in ``refused``.
    """

    def __init__(self, context, roles: dict[bytes, str]):
        self.roles = dict(roles)
        self.refused = 0
        self.admitted = {"client": 0, "worker": 0}
        self._context = context
        self._stop = threading.Event()
        self._bound = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="bridge-zap", daemon=True)
        self._thread.start()
        self._bound.wait()
        if self._error is not None:
            raise KeyError_(f"cannot start the ZAP handler: {self._error}")

    def decide(self, frames: list) -> list:
        """The reply to one ZAP request: [version, request id, status, text, user id, metadata]."""
        from zmq.utils import z85

        request_id = frames[1] if len(frames) > 1 else b""
        if len(frames) < 6 or frames[0] != b"1.0":
            self.refused += 1
            return [b"1.0", request_id, b"400", b"malformed ZAP request", b"", b""]
        mechanism, credentials = frames[5], frames[6:]
        if mechanism != b"CURVE" or len(credentials) != 1 or len(credentials[0]) != 32:
            self.refused += 1
            log.warning("refused a %s handshake from %s: this broker admits CURVE keys only",
                        mechanism.decode(errors="replace"), frames[3].decode(errors="replace"))
            return [b"1.0", request_id, b"400", b"CURVE required", b"", b""]
        key = z85.encode(credentials[0])
        role = self.roles.get(key)
        if role is None:
            self.refused += 1
            log.warning("refused unknown CURVE key %s... from %s", key.decode()[:8], frames[3].decode(errors="replace"))
            return [b"1.0", request_id, b"400", b"unknown key", b"", b""]
        self.admitted[role] += 1
        return [b"1.0", request_id, b"200", b"OK", f"{role}:{key.decode()}".encode(), b""]

    def _run(self) -> None:
        import zmq

        try:
            socket = self._context.socket(zmq.REP)
            socket.setsockopt(zmq.LINGER, 0)
            socket.bind(ZAP_ENDPOINT)
        except Exception as exc:
            self._error = exc
            self._bound.set()
            return
        self._bound.set()
        try:
            while not self._stop.is_set():
                if socket.poll(100):
                    socket.send_multipart(self.decide(socket.recv_multipart()))
        finally:
            socket.close(linger=0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def role_of(user_id: str | None) -> tuple[str | None, str | None]:
    """(role, key) from a connection's User-Id as set by :class:`RoleAuthenticator`."""
    if not user_id:
        return None, None
    role, sep, key = user_id.partition(":")
    return (role, key) if sep and role in ROLE_DIRS else (None, None)


def secure_server_socket(context, socket, server: CurveServer) -> RoleAuthenticator:
    """Make ``socket`` a CURVE server that admits only the keys of ``server``'s allow-lists.

    Returns the running authenticator; stop it when the socket closes.
    """
    public, secret = _load(server.secret_key_file, need_secret=True)
    auth = RoleAuthenticator(context, load_role_keys(server))
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
