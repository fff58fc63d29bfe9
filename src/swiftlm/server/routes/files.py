"""/v1/files: upload, list, retrieve, download and delete files, as OpenAI's Files API.

Files belong to the API key that uploaded them (a hash of it): another key sees a 404. Uploads are
multipart forms (``file``, ``purpose``); ``purpose`` "batch" files feed ``/v1/batches``, whose
output and error files come back with purpose "batch_output".
"""

from __future__ import annotations

from fastapi import APIRouter, Form, Request, UploadFile
from fastapi.responses import JSONResponse, Response

from swiftlm.batch.objects import FileRecord
from swiftlm.server.batch.api import BatchApi
from swiftlm.server.batch.protocol import FileDeleted, FileList, FileObject
from swiftlm.server.errors import OpenAIError, bad_request, not_found
from swiftlm.server.openapi import error_responses
from swiftlm.server.operations.auth import session_scope
from swiftlm.server.state import server_state

router = APIRouter()

UPLOAD_PURPOSES = ("batch", "user_data", "assistants", "fine-tune", "vision", "evals")
_BYTES = {"schema": {"type": "string", "format": "binary"}}
_CONTENT = {"description": "The file's bytes", "content": {"application/jsonl": _BYTES, "application/octet-stream": _BYTES}}


def batch_api(raw: Request) -> BatchApi:
    api = server_state(raw).batch_api
    if api is None:  # routes are only mounted with the API on; kept for safety
        raise not_found("The Batch API is turned off on this server (--disable-batch-api).")
    return api


def too_large(size: int, limit: int) -> OpenAIError:
    return OpenAIError(413, f"The file is {size} bytes; this server accepts at most {limit} (--max-batch-file-bytes).",
                       param="file", code="file_too_large")


def list_page(records: list, has_more: bool) -> JSONResponse:
    """OpenAI's list object for a page of files or batches (each with ``id`` and ``to_openai``)."""
    return JSONResponse({
        "object": "list", "data": [r.to_openai() for r in records], "has_more": has_more,
        "first_id": records[0].id if records else None, "last_id": records[-1].id if records else None,
    })


def owned_file(api: BatchApi, owner: str, file_id: str) -> FileRecord:
    record = api.store.get_file(owner, file_id)
    if record is None:
        raise not_found(f"No such file: {file_id!r}.", param="file_id", code="file_not_found")
    return record


async def read_upload(upload: UploadFile, limit: int) -> bytes:
    """The upload's bytes, refusing (413) as soon as it passes ``limit``."""
    data = bytearray()
    while chunk := await upload.read(1 << 20):
        data += chunk
        if len(data) > limit:
            raise too_large(len(data), limit)
    return bytes(data)


@router.post("/v1/files", responses={200: {"model": FileObject}, **error_responses(400, 413)})
async def create_file(raw: Request, file: UploadFile, purpose: str = Form(..., json_schema_extra={"enum": list(UPLOAD_PURPOSES)})) -> JSONResponse:
    api = batch_api(raw)
    if purpose not in UPLOAD_PURPOSES:
        raise bad_request(f"purpose must be one of {', '.join(UPLOAD_PURPOSES)}, got {purpose!r}", param="purpose")
    data = await read_upload(file, api.max_file_bytes)
    record = api.store.create_file(session_scope(raw), purpose, file.filename or "upload.jsonl", data)
    return JSONResponse(record.to_openai())


@router.get("/v1/files", responses={200: {"model": FileList}, **error_responses(400)})
async def list_files(raw: Request, purpose: str | None = None, after: str | None = None, limit: int = 10000,
                     order: str = "desc") -> JSONResponse:
    api = batch_api(raw)
    if order not in ("asc", "desc"):
        raise bad_request("order must be 'asc' or 'desc'", param="order")
    if not 1 <= limit <= 10000:
        raise bad_request("limit must be between 1 and 10000", param="limit")
    records = api.store.list_files(session_scope(raw), purpose=purpose, after=after, limit=limit + 1, order=order)
    return list_page(records[:limit], len(records) > limit)


@router.get("/v1/files/{file_id}", responses={200: {"model": FileObject}, **error_responses(404)})
async def retrieve_file(raw: Request, file_id: str) -> JSONResponse:
    api = batch_api(raw)
    return JSONResponse(owned_file(api, session_scope(raw), file_id).to_openai())


@router.get("/v1/files/{file_id}/content", response_class=Response, responses={200: _CONTENT, **error_responses(404)})
async def file_content(raw: Request, file_id: str) -> Response:
    api = batch_api(raw)
    owner = session_scope(raw)
    record = owned_file(api, owner, file_id)
    data = api.store.read_file(owner, file_id)
    if data is None:
        raise not_found(f"The content of file {file_id!r} is gone.", param="file_id", code="file_not_found")
    media = "application/jsonl" if record.filename.endswith(".jsonl") else "application/octet-stream"
    return Response(data, media_type=media)


@router.delete("/v1/files/{file_id}", responses={200: {"model": FileDeleted}, **error_responses(404)})
async def delete_file(raw: Request, file_id: str) -> JSONResponse:
    api = batch_api(raw)
    owner = session_scope(raw)
    owned_file(api, owner, file_id)
    return JSONResponse({"id": file_id, "object": "file", "deleted": api.store.delete_file(owner, file_id)})
