"""BatchStore: the Batch API's files, jobs and per-line results, durable across crashes.

Layout under ``root``::

    root/batch.sqlite3      files, batches, lines (the requests), results (one row per line, once)
    root/files/<file id>    each file's content, written atomically (temp file, fsync, rename)

Invariants:
- a line has at most one result: ``record_result`` inserts under the (batch_id, idx) primary key
  and bumps ``completed`` or ``failed`` in the same transaction, so the counts always equal the
  result rows;
- a line without a result is pending: after a crash, ``pending_lines`` is exactly what is left;
- a file row exists only once its content is on disk; content without a row (a crash between
  the two) is removed when the store is next opened. One store per root directory at a time.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any

from swiftlm.batch.objects import (
    STATUS_TIMESTAMP,
    STATUSES,
    TERMINAL,
    UNFINISHED,
    BatchRecord,
    FileRecord,
    LineResult,
    error_line,
    new_batch_id,
    new_file_id,
    output_line,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, owner TEXT NOT NULL, purpose TEXT NOT NULL,
    filename TEXT NOT NULL, bytes INTEGER NOT NULL, created_at INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS files_by_owner ON files (owner, created_at, seq);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, owner TEXT NOT NULL, endpoint TEXT NOT NULL,
    input_file_id TEXT NOT NULL, completion_window TEXT NOT NULL, status TEXT NOT NULL,
    created_at INTEGER NOT NULL, metadata TEXT, output_file_id TEXT, error_file_id TEXT, errors TEXT,
    in_progress_at INTEGER, finalizing_at INTEGER, completed_at INTEGER, failed_at INTEGER,
    expired_at INTEGER, cancelling_at INTEGER, cancelled_at INTEGER, expires_at INTEGER,
    total INTEGER NOT NULL DEFAULT 0, completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS batches_by_owner ON batches (owner, created_at, seq);
CREATE INDEX IF NOT EXISTS batches_by_status ON batches (status);
CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL, idx INTEGER NOT NULL, custom_id TEXT NOT NULL, url TEXT NOT NULL,
    body TEXT NOT NULL, PRIMARY KEY (batch_id, idx));
CREATE TABLE IF NOT EXISTS results (
    batch_id TEXT NOT NULL, idx INTEGER NOT NULL, custom_id TEXT NOT NULL, status_code INTEGER,
    body TEXT, error TEXT, PRIMARY KEY (batch_id, idx));
PRAGMA user_version = 1;
"""

_BATCH_COLUMNS = tuple(f.name for f in fields(BatchRecord))
_SETTABLE = frozenset({*STATUS_TIMESTAMP.values(), "expires_at", "output_file_id", "error_file_id", "errors"})
_TMP_PREFIX = ".tmp-"


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves the old content or the new, never a
    part: a temp file in the same directory, fsynced, renamed over ``path``."""
    tmp = path.with_name(f"{_TMP_PREFIX}{path.name}.{secrets.token_hex(4)}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _file(row: sqlite3.Row) -> FileRecord:
    return FileRecord(row["id"], row["owner"], row["purpose"], row["filename"], row["bytes"], row["created_at"])


def _batch(row: sqlite3.Row) -> BatchRecord:
    values = {name: row[name] for name in _BATCH_COLUMNS}
    values["metadata"] = _loads(values["metadata"])
    values["errors"] = _loads(values["errors"])
    return BatchRecord(**values)


class BatchStore:
    """Thread-safe: one SQLite connection (WAL) behind a lock; ``clock`` gives Unix seconds."""

    def __init__(self, root: str | os.PathLike[str], clock: Callable[[], float] = time.time,
                 sweep_orphans: bool = True) -> None:
        """``sweep_orphans``: False when other live processes share ``root`` (their files in the
        making would look orphaned)."""
        self.root = Path(root)
        self.files_dir = self.root / "files"
        self.files_dir.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(self.root / "batch.sqlite3", check_same_thread=False, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL: a process crash loses nothing; a power cut may lose the last results, which
        # then run again (a lost result is a pending line, never a half-written one).
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(_SCHEMA)
        if sweep_orphans:
            self._sweep_orphans()

    def close(self) -> None:
        """Close the database connection; the store is unusable afterwards."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> BatchStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, under the lock; rolled back if the block raises."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, args).fetchall()

    def _now(self) -> int:
        return int(self._clock())

    def _sweep_orphans(self) -> None:
        """Remove temp files and content files without a row (left by a crash)."""
        known = {row["id"] for row in self._query("SELECT id FROM files")}
        for path in self.files_dir.iterdir():
            if path.name.startswith(_TMP_PREFIX) or path.name not in known:
                path.unlink(missing_ok=True)

    # Files

    def create_file(self, owner: str, purpose: str, filename: str, data: bytes) -> FileRecord:
        """Store ``data`` as a new file of ``owner``'s."""
        record = FileRecord(new_file_id(), owner, purpose, filename, len(data), self._now())
        write_atomic(self.files_dir / record.id, data)
        try:
            with self._tx() as c:
                self._insert_file(c, record)
        except BaseException:
            (self.files_dir / record.id).unlink(missing_ok=True)
            raise
        return record

    @staticmethod
    def _insert_file(c: sqlite3.Connection, r: FileRecord) -> None:
        """Insert ``r``, or update its size if a row with its id exists (a rewritten file)."""
        c.execute(
            "INSERT INTO files (id, seq, owner, purpose, filename, bytes, created_at) "
            "VALUES (?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM files), ?, ?, ?, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET bytes = excluded.bytes",
            (r.id, r.owner, r.purpose, r.filename, r.bytes, r.created_at))

    def get_file(self, owner: str, file_id: str) -> FileRecord | None:
        """The file, or None when it does not exist or belongs to someone else."""
        rows = self._query("SELECT * FROM files WHERE id = ? AND owner = ?", (file_id, owner))
        return _file(rows[0]) if rows else None

    def list_files(self, owner: str, purpose: str | None = None, after: str | None = None,
                   limit: int = 10000, order: str = "desc") -> list[FileRecord]:
        """``owner``'s files by creation time (``order`` "desc" or "asc"), those past the file id
        ``after`` only; an ``after`` that is not one of ``owner``'s files gives nothing."""
        if order not in ("asc", "desc"):
            raise ValueError(f"order must be 'asc' or 'desc', not {order!r}")
        where, args = ["owner = ?"], [owner]
        if purpose is not None:
            where.append("purpose = ?")
            args.append(purpose)
        if after is not None:
            cursor = self._query("SELECT created_at, seq FROM files WHERE id = ? AND owner = ?", (after, owner))
            if not cursor:
                return []
            where.append(f"(created_at, seq) {'<' if order == 'desc' else '>'} (?, ?)")
            args += [cursor[0]["created_at"], cursor[0]["seq"]]
        sql = (f"SELECT * FROM files WHERE {' AND '.join(where)} "
               f"ORDER BY created_at {order}, seq {order} LIMIT ?")
        return [_file(row) for row in self._query(sql, (*args, limit))]

    def file_path(self, owner: str, file_id: str) -> Path | None:
        """Where the file's content lies, or None when ``owner`` has no such file."""
        return self.files_dir / file_id if self.get_file(owner, file_id) is not None else None

    def read_file(self, owner: str, file_id: str) -> bytes | None:
        """The file's content, or None when ``owner`` has no such file."""
        path = self.file_path(owner, file_id)
        try:
            return path.read_bytes() if path is not None else None
        except FileNotFoundError:  # deleted between the lookup and the read
            return None

    def delete_file(self, owner: str, file_id: str) -> bool:
        """Delete ``owner``'s file; False when there was none."""
        with self._tx() as c:
            deleted = c.execute("DELETE FROM files WHERE id = ? AND owner = ?", (file_id, owner)).rowcount
        if deleted:
            (self.files_dir / file_id).unlink(missing_ok=True)
        return bool(deleted)

    # Batches

    def create_batch(self, owner: str, input_file_id: str, endpoint: str, completion_window: str,
                     metadata: dict[str, str] | None, expires_in_s: int = 86400) -> BatchRecord:
        """A new batch in status "validating" over ``owner``'s file ``input_file_id``."""
        now = self._now()
        record = BatchRecord(id=new_batch_id(), owner=owner, endpoint=endpoint, input_file_id=input_file_id,
                             completion_window=completion_window, status="validating", created_at=now,
                             metadata=metadata, expires_at=now + int(expires_in_s))
        with self._tx() as c:
            if c.execute("SELECT 1 FROM files WHERE id = ? AND owner = ?", (input_file_id, owner)).fetchone() is None:
                raise ValueError(f"no file {input_file_id!r}: upload the input file first")
            values = {name: getattr(record, name) for name in _BATCH_COLUMNS}
            values["metadata"] = _dumps(metadata)
            values["errors"] = None
            columns = ", ".join(values)
            c.execute(f"INSERT INTO batches (seq, {columns}) VALUES "
                      f"((SELECT COALESCE(MAX(seq), 0) + 1 FROM batches), {', '.join('?' * len(values))})",
                      tuple(values.values()))
        return record

    def _get(self, c: sqlite3.Connection, batch_id: str) -> BatchRecord | None:
        row = c.execute("SELECT * FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return _batch(row) if row is not None else None

    def get_batch(self, owner: str, batch_id: str) -> BatchRecord | None:
        """The batch, or None when it does not exist or belongs to someone else."""
        rows = self._query("SELECT * FROM batches WHERE id = ? AND owner = ?", (batch_id, owner))
        return _batch(rows[0]) if rows else None

    def list_batches(self, owner: str, after: str | None = None, limit: int = 20) -> tuple[list[BatchRecord], bool]:
        """``owner``'s batches newest first, those older than the batch id ``after`` only, and
        whether more follow the ``limit`` returned."""
        where, args = "owner = ?", [owner]
        if after is not None:
            cursor = self._query("SELECT created_at, seq FROM batches WHERE id = ? AND owner = ?", (after, owner))
            if not cursor:
                return [], False
            where += " AND (created_at, seq) < (?, ?)"
            args += [cursor[0]["created_at"], cursor[0]["seq"]]
        rows = self._query(f"SELECT * FROM batches WHERE {where} ORDER BY created_at DESC, seq DESC LIMIT ?",
                           (*args, limit + 1))
        return [_batch(row) for row in rows[:limit]], len(rows) > limit

    def set_status(self, batch_id: str, status: str, **fields: Any) -> BatchRecord | None:
        """Move the batch to ``status`` and set ``fields`` (timestamps, ``output_file_id``,
        ``error_file_id``, ``errors``). The status's own timestamp (``completed_at`` for
        "completed", ...) is stamped now unless given or already set. Returns the updated
        batch, or None when there is none or it is already terminal (terminal is final)."""
        if status not in STATUSES:
            raise ValueError(f"unknown batch status {status!r}; expected one of {', '.join(STATUSES)}")
        unknown = set(fields) - _SETTABLE
        if unknown:
            raise ValueError(f"set_status cannot set {', '.join(sorted(unknown))}")
        assignments, args = ["status = ?"], [status]
        stamp = STATUS_TIMESTAMP.get(status)
        if stamp is not None and stamp not in fields:
            assignments.append(f"{stamp} = COALESCE({stamp}, ?)")
            args.append(self._now())
        for name, value in fields.items():
            assignments.append(f"{name} = ?")
            args.append(_dumps(value) if name == "errors" else value)
        with self._tx() as c:
            current = self._get(c, batch_id)
            if current is None or current.terminal:
                return None
            c.execute(f"UPDATE batches SET {', '.join(assignments)} WHERE id = ?", (*args, batch_id))
            return self._get(c, batch_id)

    def request_cancel(self, owner: str, batch_id: str) -> BatchRecord | None:
        """Move a "validating" or "in_progress" batch to "cancelling"; any other batch is
        returned unchanged. None when ``owner`` has no such batch."""
        with self._tx() as c:
            current = self._get(c, batch_id)
            if current is None or current.owner != owner:
                return None
            if current.status in ("validating", "in_progress"):
                c.execute("UPDATE batches SET status = 'cancelling', cancelling_at = ? WHERE id = ?",
                          (self._now(), batch_id))
            return self._get(c, batch_id)

    def unfinished_batches(self) -> list[BatchRecord]:
        """Every owner's batches that have not reached a terminal status, oldest first: the jobs
        to resume after a restart."""
        marks = ", ".join("?" * len(UNFINISHED))
        rows = self._query(f"SELECT * FROM batches WHERE status IN ({marks}) ORDER BY created_at, seq", UNFINISHED)
        return [_batch(row) for row in rows]

    # Lines and results

    def add_lines(self, batch_id: str, lines: list[tuple[int, str, str, str]]) -> int:
        """Add request lines ``(index, custom_id, url, body_json)``; lines already there are
        kept as they are. Sets the batch's ``total``; returns how many lines were new."""
        with self._tx() as c:
            if self._get(c, batch_id) is None:
                raise KeyError(f"no batch {batch_id!r}")
            before = c.total_changes
            c.executemany("INSERT OR IGNORE INTO lines (batch_id, idx, custom_id, url, body) VALUES (?, ?, ?, ?, ?)",
                          [(batch_id, *line) for line in lines])
            added = c.total_changes - before
            c.execute("UPDATE batches SET total = (SELECT COUNT(*) FROM lines WHERE batch_id = ?) WHERE id = ?",
                      (batch_id, batch_id))
        return added

    def pending_lines(self, batch_id: str) -> list[tuple[int, str, str, str]]:
        """The lines without a result, ``(index, custom_id, url, body_json)`` in index order."""
        rows = self._query(
            "SELECT l.idx, l.custom_id, l.url, l.body FROM lines l LEFT JOIN results r "
            "ON r.batch_id = l.batch_id AND r.idx = l.idx WHERE l.batch_id = ? AND r.idx IS NULL ORDER BY l.idx",
            (batch_id,))
        return [(row[0], row[1], row[2], row[3]) for row in rows]

    def record_result(self, batch_id: str, r: LineResult) -> bool:
        """Record line ``r.index``'s result and count it as completed or failed, in one
        transaction. False (and nothing changes) when the line already has a result."""
        with self._tx() as c:
            if c.execute("SELECT 1 FROM lines WHERE batch_id = ? AND idx = ?", (batch_id, r.index)).fetchone() is None:
                raise KeyError(f"batch {batch_id!r} has no line {r.index}")
            inserted = c.execute(
                "INSERT OR IGNORE INTO results (batch_id, idx, custom_id, status_code, body, error) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (batch_id, r.index, r.custom_id, r.status_code, _dumps(r.body), _dumps(r.error))).rowcount
            if not inserted:
                return False
            counter = "completed" if r.succeeded else "failed"
            c.execute(f"UPDATE batches SET {counter} = {counter} + 1 WHERE id = ?", (batch_id,))
        return True

    def results(self, batch_id: str) -> list[LineResult]:
        """Every recorded result of the batch, in index order."""
        rows = self._query("SELECT idx, custom_id, status_code, body, error FROM results "
                           "WHERE batch_id = ? ORDER BY idx", (batch_id,))
        return [LineResult(row[0], row[1], row[2], _loads(row[3]), _loads(row[4])) for row in rows]

    def finalize(self, batch_id: str) -> BatchRecord:
        """Write the output file (lines that succeeded) and the error file (lines that failed)
        as the owner's "batch_output" files and point the batch at them; a file with no lines is
        not written and its id stays null. Calling it again rewrites the same file ids."""
        with self._lock:
            batch = self._get(self._conn, batch_id)
            if batch is None:
                raise KeyError(f"no batch {batch_id!r}")
            results = self.results(batch_id)
            written: dict[str, FileRecord] = {}
            for column, suffix, format_line, keep in (("output_file_id", "output", output_line, True),
                                                      ("error_file_id", "error", error_line, False)):
                lines = [format_line(batch_id, r) + "\n" for r in results if r.succeeded == keep]
                if lines:
                    written[column] = self._write_output(batch, getattr(batch, column), suffix, "".join(lines))
            with self._tx() as c:
                for column, record in written.items():
                    self._insert_file(c, record)
                    c.execute(f"UPDATE batches SET {column} = ? WHERE id = ?", (record.id, batch_id))
                final = self._get(c, batch_id)
        assert final is not None
        return final

    def _write_output(self, batch: BatchRecord, file_id: str | None, suffix: str, text: str) -> FileRecord:
        data = text.encode()
        record = FileRecord(file_id or new_file_id(), batch.owner, "batch_output",
                            f"{batch.id}_{suffix}.jsonl", len(data), self._now())
        write_atomic(self.files_dir / record.id, data)
        return record

    # Retention

    def delete_older_than(self, cutoff_ts: float) -> int:
        """Delete terminal batches created before ``cutoff_ts`` with their lines, results and
        output files, then every file created before it that no remaining batch refers to.
        Returns how many batches were deleted."""
        marks = ", ".join("?" * len(TERMINAL))
        with self._tx() as c:
            old = c.execute(f"SELECT id, output_file_id, error_file_id FROM batches "
                            f"WHERE created_at < ? AND status IN ({marks})", (cutoff_ts, *TERMINAL)).fetchall()
            doomed = {fid for row in old for fid in (row[1], row[2]) if fid is not None}
            for table, key in (("lines", "batch_id"), ("results", "batch_id"), ("batches", "id")):
                c.executemany(f"DELETE FROM {table} WHERE {key} = ?", [(row[0],) for row in old])
            doomed.update(row[0] for row in c.execute(
                "SELECT id FROM files f WHERE created_at < ? AND NOT EXISTS (SELECT 1 FROM batches b "
                "WHERE f.id IN (b.input_file_id, b.output_file_id, b.error_file_id))", (cutoff_ts,)))
            c.executemany("DELETE FROM files WHERE id = ?", [(fid,) for fid in doomed])
        for fid in doomed:
            (self.files_dir / fid).unlink(missing_ok=True)
        return len(old)
