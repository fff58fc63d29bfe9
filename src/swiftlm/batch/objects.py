"""The Batch API's records (files, batches, line results) and their OpenAI JSON shapes.

A line *succeeds* when it has no error and an HTTP status below 400; every other line *fails*.
Successful lines go to the batch's output file, failed ones to its error file, one JSON object
per line in OpenAI's format::

    {"id": "batch_req_…", "custom_id": "…",
     "response": {"status_code": 200, "request_id": "req_…", "body": {…}} | null,
     "error": {"code": "…", "message": "…"} | null}

The ``batch_req_`` and ``req_`` ids are derived from the batch id and the line index, so writing
the files again gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from typing import Any

STATUSES = ("validating", "in_progress", "finalizing", "completed", "failed", "cancelling", "cancelled", "expired")
TERMINAL = ("completed", "failed", "cancelled", "expired")
UNFINISHED = ("validating", "in_progress", "finalizing", "cancelling")

# The timestamp each status stamps when a batch enters it.
STATUS_TIMESTAMP = {
    "in_progress": "in_progress_at",
    "finalizing": "finalizing_at",
    "completed": "completed_at",
    "failed": "failed_at",
    "cancelling": "cancelling_at",
    "cancelled": "cancelled_at",
    "expired": "expired_at",
}


def new_file_id() -> str:
    """A fresh file id, ``file-`` and 24 hex digits."""
    return f"file-{secrets.token_hex(12)}"


def new_batch_id() -> str:
    """A fresh batch id, ``batch_`` and 24 hex digits."""
    return f"batch_{secrets.token_hex(12)}"


@dataclass(frozen=True, slots=True)
class FileRecord:
    """An uploaded file (purpose ``batch``) or one a batch wrote (purpose ``batch_output``)."""

    id: str
    owner: str
    purpose: str
    filename: str
    bytes: int
    created_at: int

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's File object."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
            "expires_at": None,
        }


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """One batch job: where it is in its life, and how many of its lines have a result."""

    id: str
    owner: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: int
    metadata: dict[str, str] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[dict[str, Any]] | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    expires_at: int | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0

    @property
    def terminal(self) -> bool:
        """Whether the batch has reached a status it never leaves."""
        return self.status in TERMINAL

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's Batch object."""
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": None if self.errors is None else {"object": "list", "data": list(self.errors)},
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": self.in_progress_at,
            "expires_at": self.expires_at,
            "finalizing_at": self.finalizing_at,
            "completed_at": self.completed_at,
            "failed_at": self.failed_at,
            "expired_at": self.expired_at,
            "cancelling_at": self.cancelling_at,
            "cancelled_at": self.cancelled_at,
            "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
            "metadata": self.metadata,
        }


@dataclass(frozen=True, slots=True)
class LineResult:
    """The outcome of one input line: an HTTP response, an error, or both."""

    index: int
    custom_id: str
    status_code: int | None
    body: dict[str, Any] | None
    error: dict[str, Any] | None

    @property
    def succeeded(self) -> bool:
        """No error and a status below 400: the line belongs in the output file."""
        return self.error is None and self.status_code is not None and self.status_code < 400


def _derived_hex(batch_id: str, index: int, kind: str) -> str:
    return hashlib.sha256(f"{batch_id}/{index}/{kind}".encode()).hexdigest()[:32]


def _response(batch_id: str, r: LineResult) -> dict[str, Any] | None:
    if r.status_code is None:
        return None
    return {"status_code": r.status_code, "request_id": f"req_{_derived_hex(batch_id, r.index, 'req')}",
            "body": r.body}


def _error(error: dict[str, Any] | None) -> dict[str, str] | None:
    if error is None:
        return None
    return {"code": str(error.get("code") or "error"), "message": str(error.get("message") or "")}


def _line(batch_id: str, r: LineResult) -> str:
    obj = {"id": f"batch_req_{_derived_hex(batch_id, r.index, 'line')}", "custom_id": r.custom_id,
           "response": _response(batch_id, r), "error": _error(r.error)}
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def output_line(batch_id: str, r: LineResult) -> str:
    """One line of the output file (no trailing newline) for a line that succeeded."""
    if not r.succeeded:
        raise ValueError(f"line {r.index} of {batch_id} failed; it belongs in the error file")
    return _line(batch_id, r)


def error_line(batch_id: str, r: LineResult) -> str:
    """One line of the error file (no trailing newline) for a line that failed; ``response`` is
    null when the request never ran, ``error`` is null when the response itself was an error."""
    if r.succeeded:
        raise ValueError(f"line {r.index} of {batch_id} succeeded; it belongs in the output file")
    return _line(batch_id, r)
