"""SessionTranscripts: sessions' conversations where every replica of a cluster can read them.

A session's transcript (the conversation through the last answer returned) normally lives in the
process that holds its KV (``swiftlm.text.session_prompt.SessionPrompts``). Replicas that share a
storage directory (``ServerConfig.batch_storage_shared``, set by ``swiftlm.cluster``) also write it
here after every turn, so a session whose replica died, or whose key moved to another replica, still
continues on turn N+1 when the client sends only the new messages: that replica reads the transcript
and prefills the whole conversation afresh.

One SQLite database (WAL, shared by processes) in the storage directory:
``root/session_transcripts.sqlite3``, one row per session key (the key already carries the API key's
scope). A transcript idle longer than ``ttl_s`` (``--session-ttl``, the KV's own idle limit) is never
served, and rows that old are deleted now and then when one is written.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

FILE_NAME = "session_transcripts.sqlite3"
_SCHEMA = "CREATE TABLE IF NOT EXISTS transcripts (session TEXT PRIMARY KEY, updated REAL NOT NULL, messages TEXT NOT NULL)"
_PRUNE_EVERY = 64  # writes between deletions of expired rows


class SessionTranscripts:
    """Thread-safe (one connection behind a lock); processes share the file through SQLite's locks."""

    def __init__(self, root: str | os.PathLike[str], ttl_s: float, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(root) / FILE_NAME
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None  # opened on first use
        self._writes = 0

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # a lost last turn after a power cut is a fresh prefill
            db.execute(_SCHEMA)
            self._db = db
        return self._db

    def load(self, session: str) -> list[dict[str, Any]] | None:
        """The session's transcript, or None (never written, deleted, or idle past the TTL)."""
        with self._lock:
            row = self._conn().execute(
                "SELECT messages FROM transcripts WHERE session = ? AND updated >= ?",
                (session, self._clock() - self.ttl_s),
            ).fetchone()
        return None if row is None else json.loads(row[0])

    def save(self, session: str, messages: list[dict[str, Any]]) -> None:
        now = self._clock()
        text = json.dumps(messages, ensure_ascii=False)
        with self._lock:
            db = self._conn()
            db.execute("INSERT OR REPLACE INTO transcripts (session, updated, messages) VALUES (?, ?, ?)",
                       (session, now, text))
            self._writes += 1
            if self._writes % _PRUNE_EVERY == 0:
                db.execute("DELETE FROM transcripts WHERE updated < ?", (now - self.ttl_s,))

    def delete(self, session: str) -> None:
        with self._lock:
            self._conn().execute("DELETE FROM transcripts WHERE session = ?", (session,))

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
