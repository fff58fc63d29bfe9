"""JobLeases: which process runs each Batch API job, when several share one store.

Replicas of one deployment (``swiftlm serve --replicas``) keep their jobs in the same SQLite
database. A job runs only in the process holding its lease: a row (job id, holder, expiry) in
the ``leases`` table of that database. The holder renews it while the job runs; a holder that
dies stops renewing, and once the lease has expired another process takes the job over and
resumes it from its rows (the runner's lines are idempotent, so nothing runs twice: a line with
a result is never asked again).

Every change is one ``BEGIN IMMEDIATE`` transaction, so two processes racing for a job are
serialised by SQLite: exactly one of them gets it.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (
    batch_id TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_at REAL NOT NULL);
"""


class JobLeases:
    """Leases in ``root/batch.sqlite3`` (the BatchStore's database); ``clock`` gives Unix seconds."""

    def __init__(self, root: str | Path, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(Path(root) / "batch.sqlite3", check_same_thread=False, isolation_level=None,
                                     timeout=10.0)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _write(self, sql: str, args: tuple) -> int:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                changed = self._conn.execute(sql, args).rowcount
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")
            return changed

    def acquire(self, batch_id: str, holder: str, ttl_s: float) -> bool:
        """Take the job's lease for ``ttl_s`` seconds: granted when nobody holds it, ``holder``
        already does, or the last holder's lease has expired (a take-over)."""
        now = self._clock()
        changed = self._write(
            "INSERT INTO leases (batch_id, holder, expires_at) VALUES (?, ?, ?) "
            "ON CONFLICT (batch_id) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at "
            "WHERE leases.holder = excluded.holder OR leases.expires_at <= ?",
            (batch_id, holder, now + ttl_s, now),
        )
        return changed == 1

    def renew(self, batch_id: str, holder: str, ttl_s: float) -> bool:
        """Extend ``holder``'s lease; False when another process has taken the job over."""
        return self._write("UPDATE leases SET expires_at = ? WHERE batch_id = ? AND holder = ?",
                           (self._clock() + ttl_s, batch_id, holder)) == 1

    def release(self, batch_id: str, holder: str) -> None:
        """Give the job up (it finished, or this process is stopping): another may take it at once."""
        self._write("DELETE FROM leases WHERE batch_id = ? AND holder = ?", (batch_id, holder))

    def holder(self, batch_id: str) -> str | None:
        """Who holds an unexpired lease on the job, if anyone."""
        with self._lock:
            row = self._conn.execute("SELECT holder FROM leases WHERE batch_id = ? AND expires_at > ?",
                                     (batch_id, self._clock())).fetchone()
        return None if row is None else row[0]
