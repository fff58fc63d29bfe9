"""/v1/batches: create, retrieve, list and cancel Batch API jobs, as OpenAI's Batches API.

``POST /v1/batches`` takes OpenAI's body (``input_file_id``, ``endpoint``, ``completion_window``
"24h", ``metadata``) or the inline form ``{"input": [{"custom_id", "method", "url", "body"},
...]}``, for which the server writes the input file itself (endpoint: the lines' url, else
``/v1/chat/completions``). Jobs belong to the API key that created them.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from swiftlm.batch.objects import BatchRecord
from swiftlm.server.batch.api import BATCH_ENDPOINTS, COMPLETION_WINDOWS, BatchApi
from swiftlm.server.batch.protocol import BatchCreateRequest, BatchList, BatchObject
from swiftlm.server.errors import bad_request, not_found
from swiftlm.server.openapi import error_responses, json_body
from swiftlm.server.operations.auth import session_scope
from swiftlm.server.routes.files import batch_api, list_page, owned_file, too_large

router = APIRouter()


async def _body(raw: Request) -> dict[str, Any]:
    try:
        body = json.loads(await raw.body() or b"{}")
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8 (UnicodeDecodeError), nested too deep
        raise bad_request(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def _inline_input(api: BatchApi, owner: str, lines: Any, endpoint: str | None) -> tuple[str, str]:
    """The inline form's input file: (file id, endpoint)."""
    if not isinstance(lines, list) or not lines:
        raise bad_request("input must be a non-empty list of request lines", param="input")
    if endpoint is None:
        urls = {line.get("url") for line in lines if isinstance(line, dict)}
        endpoint = urls.pop() if len(urls) == 1 and next(iter(urls)) in BATCH_ENDPOINTS else BATCH_ENDPOINTS[0]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    if len(data) > api.max_file_bytes:
        raise too_large(len(data), api.max_file_bytes)
    return api.store.create_file(owner, "batch", "inline_input.jsonl", data).id, endpoint


@router.post(
    "/v1/batches", openapi_extra=json_body(BatchCreateRequest),
    responses={200: {"model": BatchObject}, **error_responses(400, 404, 413)},
)
async def create_batch(raw: Request) -> JSONResponse:
    api = batch_api(raw)
    owner = session_scope(raw)
    body = await _body(raw)
    endpoint = body.get("endpoint")
    if endpoint is not None and endpoint not in BATCH_ENDPOINTS:
        raise bad_request(f"endpoint must be one of {', '.join(BATCH_ENDPOINTS)}, got {endpoint!r}", param="endpoint")
    window = body.get("completion_window", "24h")
    if window not in COMPLETION_WINDOWS:
        raise bad_request(f"completion_window must be '24h', got {window!r}", param="completion_window")
    metadata = body.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and len(metadata) <= 16
                                     and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise bad_request("metadata must be an object of at most 16 string values", param="metadata")
    if "input" in body:
        file_id, endpoint = _inline_input(api, owner, body["input"], endpoint)
    else:
        file_id = body.get("input_file_id")
        if not isinstance(file_id, str):
            raise bad_request("input_file_id is required (or give the lines inline as input)", param="input_file_id")
        if endpoint is None:
            raise bad_request("endpoint is required", param="endpoint")
        record = owned_file(api, owner, file_id)
        if record.purpose != "batch":
            raise bad_request(f"file {file_id!r} has purpose {record.purpose!r}; a batch needs a 'batch' file",
                              param="input_file_id")
    try:
        batch = api.store.create_batch(owner, file_id, endpoint, window, metadata, expires_in_s=COMPLETION_WINDOWS[window])
    except ValueError as exc:  # the input file was deleted meanwhile
        raise not_found(f"No such file: {file_id!r}.", param="input_file_id", code="file_not_found") from exc
    api.runner.launch(batch)
    return JSONResponse(batch.to_openai())


@router.get("/v1/batches", responses={200: {"model": BatchList}, **error_responses(400)})
async def list_batches(raw: Request, after: str | None = None, limit: int = 20) -> JSONResponse:
    api = batch_api(raw)
    if not 1 <= limit <= 100:
        raise bad_request("limit must be between 1 and 100", param="limit")
    return list_page(*api.store.list_batches(session_scope(raw), after, limit))


def _found(batch: BatchRecord | None, batch_id: str) -> JSONResponse:
    if batch is None:  # no such batch, or another key's
        raise not_found(f"No such batch: {batch_id!r}.", param="batch_id", code="batch_not_found")
    return JSONResponse(batch.to_openai())


@router.get("/v1/batches/{batch_id}", responses={200: {"model": BatchObject}, **error_responses(404)})
async def retrieve_batch(raw: Request, batch_id: str) -> JSONResponse:
    return _found(batch_api(raw).store.get_batch(session_scope(raw), batch_id), batch_id)


@router.post("/v1/batches/{batch_id}/cancel", responses={200: {"model": BatchObject}, **error_responses(404)})
async def cancel_batch(raw: Request, batch_id: str) -> JSONResponse:
    return _found(batch_api(raw).runner.cancel(session_scope(raw), batch_id), batch_id)
