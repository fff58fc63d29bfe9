"""Where the response cache keeps its entries: in memory, or in a SQLite file that outlives the process.

Both stores hold ``key -> (value bytes, stored_at)`` with a last-use time for LRU order; the policy
(TTL, which entries to drop) is ``swiftlm.server.answer_cache.policy.ResponseCache``'s. Times are wall
clock seconds (``time.time()``): a SQLite entry's age must mean the same after a restart.

A SQLite file that is not a database, or whose table is damaged, is deleted and made anew with a
logged warning (the cache only ever holds answers that can be computed again).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Protocol

logger = logging.getLogger("swiftlm.server.response_cache")


class CacheStore(Protocol):
    def get(self, key: str, now: float) -> tuple[bytes, float] | None:
        """The value and its stored_at time, marked as used at ``now``; None when absent."""

    def put(self, key: str, value: bytes, now: float) -> None: ...

    def delete(self, key: str) -> None: ...

    def trim(self, max_entries: int, max_bytes: int) -> int:
        """Drop the least recently used entries until both limits hold; return how many went."""

    def usage(self) -> tuple[int, int]:
        """(entries, bytes of stored values)."""

    def close(self) -> None: ...


class MemoryStore:
    """An LRU dict; lost when the process ends."""

    def __init__(self) -> None:
        self._entries: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        self._bytes = 0

    def get(self, key: str, now: float) -> tuple[bytes, float] | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: str, value: bytes, now: float) -> None:
        self.delete(key)
        self._entries[key] = (value, now)
        self._bytes += len(value)

    def delete(self, key: str) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= len(old[0])

    def trim(self, max_entries: int, max_bytes: int) -> int:
        dropped = 0
        while self._entries and (len(self._entries) > max_entries or self._bytes > max_bytes):
            _, (value, _) = self._entries.popitem(last=False)
            self._bytes -= len(value)
            dropped += 1
        return dropped

    def usage(self) -> tuple[int, int]:
        return len(self._entries), self._bytes

    def close(self) -> None:
        self._entries.clear()
        self._bytes = 0


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, value BLOB NOT NULL, size INTEGER NOT NULL, "
    "stored_at REAL NOT NULL, used_at REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS entries_used_at ON entries (used_at)",
)


class SqliteStore:
    """Entries in one SQLite file (WAL journal); safe to call from several threads."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = self._open()

    def _open(self) -> sqlite3.Connection:
        try:
            return self._connect()
        except sqlite3.DatabaseError as exc:
            return self._rebuild(exc)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            for statement in _SCHEMA:
                db.execute(statement)
            check = db.execute("PRAGMA quick_check").fetchone()
            if check is None or check[0] != "ok":
                raise sqlite3.DatabaseError(f"integrity check: {check[0] if check else 'no answer'}")
            db.execute("SELECT key, value, size, stored_at, used_at FROM entries LIMIT 1").fetchall()
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def _rebuild(self, exc: Exception) -> sqlite3.Connection:
        logger.warning("response cache file %s is unreadable (%s); starting it anew, empty", self.path, exc)
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        return self._connect()

    def _run(self, sql: str, args: tuple = ()) -> list[tuple]:
        """One statement; a database damaged while running is rebuilt (the statement then answers
        nothing)."""
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.DatabaseError as exc:
                self._db.close()
                self._db = self._rebuild(exc)
                return []

    def get(self, key: str, now: float) -> tuple[bytes, float] | None:
        rows = self._run("SELECT value, stored_at FROM entries WHERE key = ?", (key,))
        if not rows:
            return None
        self._run("UPDATE entries SET used_at = ? WHERE key = ?", (now, key))
        return bytes(rows[0][0]), float(rows[0][1])

    def put(self, key: str, value: bytes, now: float) -> None:
        self._run(
            "INSERT OR REPLACE INTO entries (key, value, size, stored_at, used_at) VALUES (?, ?, ?, ?, ?)",
            (key, value, len(value), now, now),
        )

    def delete(self, key: str) -> None:
        self._run("DELETE FROM entries WHERE key = ?", (key,))

    def trim(self, max_entries: int, max_bytes: int) -> int:
        entries, size = self.usage()
        if entries <= max_entries and size <= max_bytes:
            return 0
        dropped = []
        for key, value_size in self._run("SELECT key, size FROM entries ORDER BY used_at, rowid"):
            if entries <= max_entries and size <= max_bytes:
                break
            dropped.append(key)
            entries -= 1
            size -= value_size
        for key in dropped:
            self.delete(key)
        return len(dropped)

    def usage(self) -> tuple[int, int]:
        rows = self._run("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM entries")
        return (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)

    def close(self) -> None:
        with self._lock:
            self._db.close()
