"""Errors in OpenAI's envelope: ``{"error": {"message", "type", "param", "code"}}``.

Every error the server returns has this shape, so the openai SDK raises its typed exceptions
(BadRequestError, AuthenticationError, NotFoundError, RateLimitError, ...) with our message.
Types follow OpenAI: "invalid_request_error" for 400/404/405/413/422 and for 401 (with code
"invalid_api_key", as OpenAI does), "rate_limit_exceeded" for 429, "service_unavailable" for
503, "server_error" for other 5xx. 429 and 503 may carry ``Retry-After`` (whole seconds, which
HTTP requires) and ``retry-after-ms`` (read by the openai SDK's retry loop).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("swiftlm.server")

_MAX_LISTED_ERRORS = 5
_TYPE_BY_STATUS = {401: "invalid_request_error", 403: "permission_error", 429: "rate_limit_exceeded", 503: "service_unavailable"}


def error_type_for(status: int) -> str:
    if status in _TYPE_BY_STATUS:
        return _TYPE_BY_STATUS[status]
    return "server_error" if status >= 500 else "invalid_request_error"


def error_body(message: str, type: str, param: str | None = None, code: str | int | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class OpenAIError(Exception):
    """An error a handler raises to answer with ``status`` and the OpenAI envelope."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str | None = None,
        param: str | None = None,
        code: str | int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or error_type_for(status)
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers or None)

    def sse_event(self) -> str:
        """The error as one server-sent event, for failures after a stream has started."""
        return f"data: {json.dumps(self.body())}\n\n"


def _retry_headers(retry_after_s: float | None) -> dict[str, str]:
    if retry_after_s is None:
        return {}
    retry_after_s = max(0.0, retry_after_s)
    return {"Retry-After": str(max(1, math.ceil(retry_after_s))), "retry-after-ms": str(int(retry_after_s * 1000))}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def not_found(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    """e.g. ``not_found("The model 'x' does not exist", param="model", code="model_not_found")``."""
    return OpenAIError(404, message, param=param, code=code)


def unauthorized(message: str = "Incorrect API key provided.") -> OpenAIError:
    return OpenAIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def too_many_requests(
    retry_after_s: float | None = None, message: str = "The server is at capacity; retry after a short wait."
) -> OpenAIError:
    return OpenAIError(429, message, code="rate_limit_exceeded", headers=_retry_headers(retry_after_s))


def service_unavailable(
    message: str = "The server is not ready to serve requests.", retry_after_s: float | None = None
) -> OpenAIError:
    return OpenAIError(503, message, headers=_retry_headers(retry_after_s))


# ---------------------------------------------------------------- validation errors


def _json_type(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array", dict: "an object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _field_path(loc: Iterable[Any]) -> str:
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        parts = parts[1:]
    return ".".join(str(p) for p in parts)


def _describe(error: Mapping[str, Any]) -> str:
    message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    if str(error.get("type", "")).endswith("_type") and "input" in error:
        message += f" (got {_json_type(error['input'])})"
    return message


def validation_failure(errors: list[Mapping[str, Any]]) -> OpenAIError:
    """A 400 listing the offending fields ("messages.0.role: ..."); ``param`` is the first one.

    Takes ``RequestValidationError.errors()`` or ``pydantic.ValidationError.errors()`` (a route
    that validates by hand should raise ``validation_failure(exc.errors())``)."""
    for error in errors:
        if error.get("type") == "json_invalid":
            detail = (error.get("ctx") or {}).get("error")
            return bad_request("could not parse JSON body" + (f": {detail}" if detail else ""))
    for error in errors:
        if _field_path(error.get("loc", ())) == "" and not isinstance(error.get("input"), dict):  # the body
            if error.get("type") == "missing":
                return bad_request("the request body is missing; send a JSON object")
            if isinstance(error.get("input"), bytes):  # FastAPI did not parse it: not a JSON content type
                return bad_request("the request body must be a JSON object sent with Content-Type: application/json")
            return bad_request(f"the request body must be a JSON object (got {_json_type(error.get('input'))})")
    listed = []
    for error in errors[:_MAX_LISTED_ERRORS]:
        path = _field_path(error.get("loc", ()))
        listed.append(f"{path}: {_describe(error)}" if path else _describe(error))
    if len(errors) > _MAX_LISTED_ERRORS:
        listed.append(f"and {len(errors) - _MAX_LISTED_ERRORS} more")
    first = _field_path(errors[0].get("loc", ())) if errors else ""
    return bad_request("; ".join(listed) or "invalid request", param=first or None)


# ---------------------------------------------------------------- handlers


async def _openai_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, OpenAIError)
    return exc.response()


async def _request_validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return validation_failure(list(exc.errors())).response()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    if status in (204, 304):
        return Response(status_code=status, headers=exc.headers)
    try:
        default_detail: str | None = HTTPStatus(status).phrase
    except ValueError:
        default_detail = None
    if status == 404 and exc.detail == default_detail:
        message = f"Invalid URL ({request.method} {request.url.path})"
    elif status == 405 and exc.detail == default_detail:
        message = f"Method {request.method} is not allowed for {request.url.path}"
    else:
        message = str(exc.detail)
    return JSONResponse(error_body(message, error_type_for(status)), status_code=status, headers=exc.headers)


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    # Starlette re-raises after this response is sent, so the server also logs it.
    logger.error("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
    message = f"The server had an error while processing the request ({type(exc).__name__}); it was logged."
    return JSONResponse(error_body(message, "server_error"), status_code=500)


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error of ``app`` in OpenAI's envelope: OpenAIError as raised, request
    validation (and malformed JSON) as 400, Starlette's 404/405 (and other HTTPExceptions) with
    their status, anything else as 500 (logged)."""
    app.add_exception_handler(OpenAIError, _openai_error)
    app.add_exception_handler(RequestValidationError, _request_validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
