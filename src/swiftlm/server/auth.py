"""API keys: who may call the server, and the scope their sessions live in."""

from __future__ import annotations

import hashlib
import hmac

from fastapi import Request

from swiftlm.server.errors import unauthorized

_OPEN_PATHS = frozenset({"/health", "/metrics", "/ping", "/version"})


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if not header:
        return request.headers.get("x-api-key")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def check_api_key(request: Request, api_key: str | None) -> None:
    """Raise 401 unless ``api_key`` is unset or the request carries it (compared in constant time)."""
    if api_key is None or request.url.path in _OPEN_PATHS:
        return
    token = bearer_token(request)
    if token is None:
        raise unauthorized("Missing API key: send it as 'Authorization: Bearer <key>'.")
    if not hmac.compare_digest(token.encode(), api_key.encode()):
        raise unauthorized()


def session_scope(request: Request) -> str:
    """Sessions are keyed by the caller's API key (a hash of it), so one key cannot reach
    another key's conversation even with the same session_id."""
    token = bearer_token(request) or ""
    return hashlib.sha256(token.encode()).hexdigest()[:16]
