"""ResponseStore: stored responses of the Responses API, durable across restarts.

One SQLite database (WAL, as the Batch API's ``swiftlm.batch.store``) in the Batch API's storage
directory: ``root/responses.sqlite3``. A row holds the response object as answered, the input
items it was made from, and the conversation through its answer as chat messages (without the
instructions, which a later turn does not inherit), so ``previous_response_id`` can continue it
after the KV cache let the session go or the server restarted. ``chain`` names the conversation's
first response: the turns of one chain share a KV session.

Rows belong to an owner (the API key's scope, ``swiftlm.server.operations.auth.session_scope``): another
owner's id reads as absent. Rows older than the retention are never served, and are deleted when
the database is opened (on first use) and whenever a response is stored.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at INTEGER NOT NULL, chain TEXT NOT NULL,
    body TEXT NOT NULL, input_items TEXT NOT NULL, messages TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS responses_by_created ON responses (created_at);
"""


@dataclass(frozen=True, slots=True)
class StoredResponse:
    id: str
    owner: str
    created_at: int
    chain: str  # the id of the conversation's first response
    body: dict[str, Any]  # the response object
    input_items: list[dict[str, Any]]
    messages: list[dict[str, Any]]  # the conversation through the answer, as chat messages


class ResponseStore:
    """Thread-safe: one connection behind a lock. ``retention_s`` None keeps rows forever."""

    def __init__(self, root: str | os.PathLike[str], retention_s: float | None,
                 clock: Callable[[], float] = time.time) -> None:
        self.root = Path(root)
        self.retention_s = retention_s
        self._clock = clock
        self._lock = threading.RLock()
        self._db: sqlite3.Connection | None = None  # opened on first use: a server never asked makes no files

    @property
    def _conn(self) -> sqlite3.Connection:
        with self._lock:
            if self._db is None:
                self.root.mkdir(parents=True, exist_ok=True)
                db = sqlite3.connect(self.root / "responses.sqlite3", check_same_thread=False, isolation_level=None)
                db.row_factory = sqlite3.Row
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.executescript(_SCHEMA)
                self._db = db
                self.sweep()
            return self._db

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def put(self, record: StoredResponse) -> None:
        self.sweep()
        with self._lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO responses (id, owner, created_at, chain, body, input_items, messages) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (record.id, record.owner, record.created_at, record.chain, json.dumps(record.body, ensure_ascii=False),
                 json.dumps(record.input_items, ensure_ascii=False), json.dumps(record.messages, ensure_ascii=False)),
            )

    def get(self, owner: str, response_id: str) -> StoredResponse | None:
        """The response, or None when it does not exist, has expired or belongs to someone else."""
        with self._lock:
            row = self._conn.execute(
                "SELECT * FROM responses WHERE id = ? AND owner = ? AND created_at >= ?",
                (response_id, owner, self._oldest()),
            ).fetchone()
        if row is None:
            return None
        return StoredResponse(row["id"], row["owner"], row["created_at"], row["chain"], json.loads(row["body"]),
                              json.loads(row["input_items"]), json.loads(row["messages"]))

    def delete(self, owner: str, response_id: str) -> bool:
        with self._lock:
            cursor = self._conn.execute("DELETE FROM responses WHERE id = ? AND owner = ?", (response_id, owner))
        return cursor.rowcount > 0

    def sweep(self) -> int:
        """Delete the rows past the retention; returns how many."""
        if self.retention_s is None:
            return 0
        with self._lock:
            cursor = self._conn.execute("DELETE FROM responses WHERE created_at < ?", (self._oldest(),))
        return cursor.rowcount

    def _oldest(self) -> int:
        return -(2**62) if self.retention_s is None else int(self._clock() - self.retention_s)
