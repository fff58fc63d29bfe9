"""/openapi.json as the server really answers, so that a schema fuzzer holds the routes to it.

FastAPI's own document gets three things wrong here, which ``install_openapi`` corrects:

- request validation fails with 400 in OpenAI's envelope (``swiftlm.server.errors``), not 422 in
  FastAPI's: each 422 entry is replaced by a 400 ``ErrorResponse``;
- the middleware answers 401 (a missing or wrong API key) on every path but the open ones, and
  413 (``--max-request-bytes``) to any body too large: both are added where they apply;
- routes that stream answer ``text/event-stream`` as well as JSON: ``json_or_stream`` documents
  each event's ``data`` (a chunk, an error envelope, or ``[DONE]``).

Routes document their own success and error answers with ``responses=`` built from
``error_responses`` and ``json_or_stream``; models referenced only from these hand-written
entries are added to the components here (``_EXTRA_MODELS``).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from swiftlm.server.batch.protocol import BatchCreateRequest
from swiftlm.server.completions.chat_protocol import ChatCompletionChunk
from swiftlm.server.completions.completion_protocol import CompletionChunk
from swiftlm.server.operations.auth import OPEN_PATHS
from swiftlm.server.protocol import ErrorResponse
from swiftlm.server.responses.objects import ResponseStreamEvent

_DESCRIPTIONS = {
    400: "The request is invalid (malformed JSON, a field of the wrong type or out of range, a prompt too long)",
    401: "The API key is missing or wrong",
    404: "No such model, session, file or batch",
    408: "The request's headers and body did not arrive within --request-receive-timeout",
    413: "The request body is larger than --max-request-bytes (uploads: --max-batch-file-bytes)",
    429: "The server is at capacity, or the caller is over its rate limit; retry after Retry-After seconds",
    503: ("The model is loading, the engine failed, the server is shutting down, or it has "
          "--max-concurrent-connections open already"),
}
_EXTRA_MODELS: tuple[type[BaseModel], ...] = (
    ChatCompletionChunk, CompletionChunk, ResponseStreamEvent, BatchCreateRequest, ErrorResponse,
)
_REF = "#/components/schemas/{model}"
_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


def ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries for the errors a route raises, each in OpenAI's envelope."""
    return {status: {"model": ErrorResponse, "description": _DESCRIPTIONS[status]} for status in statuses}


def json_or_stream(whole: type[BaseModel], chunk: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """The 200 of a route that answers ``whole`` as JSON, or with ``stream: true`` server-sent
    events whose ``data`` is a ``chunk``, an error envelope (a failure after the stream started),
    or ``[DONE]`` (the last event)."""
    payload = {"anyOf": [ref(chunk), ref(ErrorResponse)]}
    event = {
        "type": "object",
        "required": ["data"],
        "properties": {
            "data": {"anyOf": [
                {"const": "[DONE]"},
                {"type": "string", "contentMediaType": "application/json", "contentSchema": payload},
            ]},
        },
    }
    return {200: {
        "model": whole,
        "description": f"A {whole.__name__}; with stream: true, server-sent events of {chunk.__name__}",
        "content": {"text/event-stream": {"schema": event}},
    }}


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` for a route that parses its JSON body by hand: the body is a ``model``."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref(model)}}}}


def _error_entry(status: int, schema_ref: dict[str, str]) -> dict[str, Any]:
    return {"description": _DESCRIPTIONS[status], "content": {"application/json": {"schema": schema_ref}}}


def _correct(operation: dict[str, Any], path: str) -> None:
    responses = operation.setdefault("responses", {})
    validated = responses.pop("422", None) is not None
    error = ref(ErrorResponse)
    if validated or "requestBody" in operation:
        responses.setdefault("400", _error_entry(400, error))
    if path not in OPEN_PATHS:
        responses.setdefault("401", _error_entry(401, error))
    if "requestBody" in operation:
        responses.setdefault("413", _error_entry(413, error))
    # the connection layer (swiftlm.server.operations.connections) may answer any route: a request that did
    # not arrive in time, a connection over the limit
    responses.setdefault("408", _error_entry(408, error))
    responses.setdefault("503", _error_entry(503, error))


def build_openapi(app: FastAPI) -> dict[str, Any]:
    # Validation mode for responses too: their wrap serializer (protocol._Response) would read
    # as "any object" in serialization mode, and fields left out of an exclude_none dump are optional.
    document = get_openapi(
        title=app.title, version=app.version, openapi_version=app.openapi_version, routes=app.routes,
        separate_input_output_schemas=False,
    )
    for path, item in document.get("paths", {}).items():
        for method in _METHODS:
            if method in item:
                _correct(item[method], path)
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    _, extra = models_json_schema([(m, "validation") for m in _EXTRA_MODELS], ref_template=_REF)
    for name, schema in extra.get("$defs", {}).items():
        schemas.setdefault(name, schema)
    return document


def install_openapi(app: FastAPI) -> None:
    """Serve ``build_openapi``'s document at /openapi.json (built once, on the first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
