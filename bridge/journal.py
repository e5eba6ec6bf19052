"""The broker's journal: accepted jobs and undelivered results in SQLite (WAL mode).

Titanic pattern (ZeroMQ guide): a job is written here before the client is told it was accepted,
and a result stays here until the client acknowledges it, so a broker restart loses neither.
Writes of one broker loop iteration are buffered and written by one ``commit`` (executemany in a
single transaction);
``synchronous=NORMAL`` in WAL mode survives a process crash (a power cut may lose the last
transactions, which the clients then resubmit: job ids are content-derived, so that is safe).

Tables:
  jobs(id, service, body, time_limit, attempts, failures, result, accepted_at, finished_at,
       owner, lease_worker, lease_attempt, lease_hash)
      result IS NULL  -> still to be run; body holds the job (msgpack)
      result NOT NULL -> finished; body dropped, result kept for duplicates until the TTL
      owner: the client the job counts against (per-client bounds)
      lease_*: who holds the job now: worker identity, attempt, and the sha256 of the lease
               token (never the token: reading this file does not let anyone answer a job)
  deliveries(job_id, client) -> a result this client is owed and has not acknowledged
  services(name) -> every service a worker has registered (jobs for others are refused)

The file holds job sources and results: it is created 0600 and a folder made for it 0700.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgpack

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs(
    id TEXT PRIMARY KEY,
    service TEXT NOT NULL,
    body BLOB,
    time_limit REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    failures BLOB,
    result BLOB,
    accepted_at REAL NOT NULL,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS jobs_unfinished ON jobs(accepted_at) WHERE result IS NULL;
CREATE TABLE IF NOT EXISTS deliveries(
    job_id TEXT NOT NULL,
    client BLOB NOT NULL,
    PRIMARY KEY(job_id, client)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS services(
    name TEXT PRIMARY KEY,
    first_seen REAL NOT NULL
) WITHOUT ROWID;
"""
# Columns added after the first release: added to an older journal when it is opened.
_ADDED_COLUMNS = {"owner": "BLOB", "lease_worker": "BLOB", "lease_attempt": "INTEGER", "lease_hash": "BLOB"}


@dataclass
class PendingJob:
    """A journaled job without a result (to be queued again after a restart)."""

    id: str
    service: str
    body: bytes
    time_limit: float | None
    attempts: int
    failures: list
    waiters: set = field(default_factory=set)
    owner: bytes | None = None
    lease_worker: bytes | None = None  # the lease in force when the broker stopped (None: none)
    lease_attempt: int | None = None
    lease_hash: bytes | None = None


def _private_file(path: Path) -> None:
    """Create ``path`` (and a missing parent folder) readable by its owner only."""
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.parent.chmod(0o700)  # mkdir's mode is filtered by the umask
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    path.chmod(0o600)  # an older journal made with the umask's bits
    for suffix in ("-wal", "-shm"):  # SQLite gives new ones the main file's mode; fix older ones
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.chmod(0o600)


class Journal:
    """Durable record of the broker's promises. One instance per broker process."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        if self.path != ":memory:":
            _private_file(Path(self.path))
        self._db = sqlite3.connect(self.path, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        present = {row[1] for row in self._db.execute("PRAGMA table_info(jobs)")}
        for column, kind in _ADDED_COLUMNS.items():
            if column not in present:
                self._db.execute(f"ALTER TABLE jobs ADD COLUMN {column} {kind}")
        self._db.commit()
        self._accepts: list = []
        self._waiters: list = []
        self._failures: list = []
        self._leases: list = []
        self._services: list = []
        self._finishes: dict = {}
        self._delivered: list = []

    # -- writes: buffered, then written together by commit() (once per broker loop iteration) --
    def accept(self, job_id: str, service: str, body: bytes, time_limit: float | None, client: bytes,
               owner: bytes | None = None) -> None:
        """A new job from ``client`` (its routing id), counted against ``owner`` (default: the client)."""
        self._accepts.append((job_id, service, body, time_limit, time.time(), owner or client))
        self.add_waiter(job_id, client)

    def lease(self, job_id: str, worker: bytes | None, attempt: int | None, lease_hash: bytes | None) -> None:
        """The job's lease now (None everywhere: no worker holds it). Applied in call order."""
        self._leases.append((worker, attempt, lease_hash, job_id))

    def add_service(self, name: str) -> None:
        self._services.append((name, time.time()))

    def add_waiter(self, job_id: str, client: bytes) -> None:
        self._waiters.append((job_id, client))

    def record_failure(self, job_id: str, attempts: int, failures: list) -> None:
        self._failures.append((attempts, msgpack.packb(failures, use_bin_type=True), job_id))

    def finish(self, job_id: str, result: bytes) -> None:
        self._finishes[job_id] = result

    def delivered(self, pairs: list) -> None:
        """Forget deliveries the clients acknowledged: pairs of (job_id, client)."""
        self._delivered.extend(pairs)

    def commit(self) -> None:
        """Write everything buffered since the last commit in one transaction."""
        if not (self._accepts or self._waiters or self._failures or self._leases or self._services
                or self._finishes or self._delivered):
            return
        db = self._db
        if self._accepts:
            db.executemany("INSERT OR IGNORE INTO jobs(id, service, body, time_limit, accepted_at, owner) "
                           "VALUES (?,?,?,?,?,?)", self._accepts)
        if self._waiters:
            db.executemany("INSERT OR IGNORE INTO deliveries(job_id, client) VALUES (?,?)", self._waiters)
        if self._failures:
            db.executemany("UPDATE jobs SET attempts=?, failures=? WHERE id=?", self._failures)
        if self._leases:
            db.executemany("UPDATE jobs SET lease_worker=?, lease_attempt=?, lease_hash=? WHERE id=?", self._leases)
        if self._services:
            db.executemany("INSERT OR IGNORE INTO services(name, first_seen) VALUES (?,?)", self._services)
        if self._finishes:
            now = time.time()
            db.executemany("UPDATE jobs SET result=?, body=NULL, finished_at=?, lease_hash=NULL WHERE id=?",
                           [(result, now, jid) for jid, result in self._finishes.items()])
        if self._delivered:
            db.executemany("DELETE FROM deliveries WHERE job_id=? AND client=?", self._delivered)
        db.commit()
        self._accepts, self._waiters, self._failures, self._delivered = [], [], [], []
        self._leases, self._services = [], []
        self._finishes = {}

    def prune(self, ttl_s: float) -> int:
        """Drop finished jobs older than ttl_s; deliveries of them still owed are given up too.

        Returns the number of jobs dropped.
        """
        self.commit()
        self._db.execute(
            "DELETE FROM deliveries WHERE job_id IN (SELECT id FROM jobs WHERE result IS NOT NULL AND finished_at < ?)",
            (time.time() - ttl_s,),
        )
        cursor = self._db.execute(
            "DELETE FROM jobs WHERE result IS NOT NULL AND finished_at < ?",
            (time.time() - ttl_s,),
        )
        self._db.commit()
        return cursor.rowcount

    # -- reads --
    def result_of(self, job_id: str) -> bytes | None:
        return self.results_of([job_id]).get(job_id)

    def results_of(self, job_ids: list) -> dict:
        """{job id: result} for those of ``job_ids`` that are finished (including uncommitted ones)."""
        found = {jid: self._finishes[jid] for jid in job_ids if jid in self._finishes}
        rest = [jid for jid in job_ids if jid not in found]
        for start in range(0, len(rest), 500):
            chunk = rest[start:start + 500]
            marks = ",".join("?" * len(chunk))
            found.update(self._db.execute(
                f"SELECT id, result FROM jobs WHERE result IS NOT NULL AND id IN ({marks})", chunk))
        return found

    def pending_jobs(self) -> list[PendingJob]:
        """Jobs accepted but not finished, oldest first, with the clients waiting for them."""
        jobs = {}
        for jid, service, body, limit, attempts, failures, owner, worker, attempt, lease_hash in self._db.execute(
            "SELECT id, service, body, time_limit, attempts, failures, owner, lease_worker, lease_attempt, lease_hash "
            "FROM jobs WHERE result IS NULL ORDER BY accepted_at"
        ):
            failures = msgpack.unpackb(failures, raw=False) if failures else []
            job = PendingJob(jid, service, body, limit, attempts, failures, owner=bytes(owner) if owner else None)
            if worker is not None and lease_hash is not None and attempt == attempts + 1:
                job.lease_worker, job.lease_attempt, job.lease_hash = bytes(worker), attempt, bytes(lease_hash)
            jobs[jid] = job
        for jid, client in self._db.execute(
            "SELECT d.job_id, d.client FROM deliveries d JOIN jobs j ON j.id = d.job_id WHERE j.result IS NULL"
        ):
            jobs[jid].waiters.add(bytes(client))
        return list(jobs.values())

    def undelivered_results(self) -> list[tuple[bytes, str, bytes]]:
        """(client, job_id, result) for finished jobs a client has not acknowledged."""
        return [
            (bytes(client), jid, result)
            for client, jid, result in self._db.execute(
                "SELECT d.client, d.job_id, j.result FROM deliveries d JOIN jobs j ON j.id = d.job_id "
                "WHERE j.result IS NOT NULL"
            )
        ]

    def services(self) -> set:
        """Every service a worker has registered with this broker (or an earlier run of it)."""
        return {name for (name,) in self._db.execute("SELECT name FROM services")}

    def counts(self) -> dict:
        unfinished, finished = self._db.execute(
            "SELECT SUM(result IS NULL), SUM(result IS NOT NULL) FROM jobs"
        ).fetchone()
        (owed,) = self._db.execute("SELECT COUNT(*) FROM deliveries").fetchone()
        return {"unfinished": unfinished or 0, "finished": finished or 0, "owed_deliveries": owed}

    def close(self) -> None:
        self.commit()
        self._db.close()
