"""Who may answer for a job, and what the broker takes in: leases, known services, per-client bounds.

Each test plays one adversary or overload against real processes on loopback (or, where only the
broker's bookkeeping matters, against a Broker driven message by message). Jobs are held in flight
by the `gated` handler until the test releases them: no sleeps tuned to the machine's speed.
"""

from __future__ import annotations

import sqlite3
import stat

from bridge.journal import Journal


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
