"""The Files and Batches APIs' wire objects, as pydantic models for the OpenAPI document.

The routes build these objects as dicts (``swiftlm.batch.objects``' ``to_openai``) and
``POST /v1/batches`` parses its body by hand (``routes/batches.py``, for OpenAI's messages), so
nothing here validates or serializes at run time: the models say what the routes accept and
answer, and the schema fuzzer (tests/server/test_schema_fuzz.py) holds the routes to them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from swiftlm.batch.objects import STATUSES
from swiftlm.server.batch.api import BATCH_ENDPOINTS

BatchEndpoint = Literal[BATCH_ENDPOINTS]  # type: ignore[valid-type]
BatchStatus = Literal[STATUSES]  # type: ignore[valid-type]
Metadata = dict[str, str]


class FileObject(BaseModel):
    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["processed"]
    status_details: None
    expires_at: None


class FileList(BaseModel):
    object: Literal["list"]
    data: list[FileObject]
    has_more: bool
    first_id: str | None
    last_id: str | None


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"]
    deleted: bool


class BatchRequestLine(BaseModel):
    """One line of a batch's input: a request to ``url`` with ``body``."""

    model_config = ConfigDict(extra="allow")

    custom_id: str
    method: Literal["POST"]
    url: BatchEndpoint
    body: dict[str, Any]


class BatchCreateRequest(BaseModel):
    """POST /v1/batches: OpenAI's body (``input_file_id`` and ``endpoint``) or the inline form
    (``input``: the lines themselves; ``endpoint`` defaults to their ``url``)."""

    model_config = ConfigDict(extra="allow")

    input_file_id: str | None = None
    input: list[BatchRequestLine] | None = Field(default=None, min_length=1)
    endpoint: BatchEndpoint | None = None
    completion_window: Literal["24h"] = "24h"
    metadata: Metadata | None = Field(default=None, max_length=16)


class BatchError(BaseModel):
    code: str
    message: str
    line: int | None = None
    param: str | None = None


class BatchErrors(BaseModel):
    object: Literal["list"]
    data: list[BatchError]


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class BatchObject(BaseModel):
    id: str
    object: Literal["batch"]
    endpoint: str
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: Metadata | None


class BatchList(BaseModel):
    object: Literal["list"]
    data: list[BatchObject]
    has_more: bool
    first_id: str | None
    last_id: str | None
