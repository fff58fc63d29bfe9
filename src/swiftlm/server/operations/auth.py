"""API keys: who may call the server, the scope their sessions, files and batch jobs live in,
and the rate limits that apply to them.

Keys come from ``--api-key`` and ``--api-key-file``; with neither, anyone may call and each
bearer token (or none) is its own scope. Keys are looked up by their SHA-256 and never logged:
a caller is named by the key's ``name=`` or by the first characters of that hash.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from fastapi import Request
from starlette.types import Scope

from swiftlm.config import ApiKeySpec, ServerConfig
from swiftlm.server.errors import unauthorized

OPEN_PATHS = frozenset({"/health", "/metrics", "/ping", "/version", "/"})
UI_PREFIX = "/ui/"  # the web playground's static files (its API calls carry the key the page is given)
CALLER = "swiftlm.caller"  # ASGI scope key: the Caller of this request, set once it is authenticated


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a request. ``scope``: what its sessions, files and batch jobs belong to;
    ``rpm``/``tpm``: its limits (None: none); ``background``: a Batch API line run in process."""

    scope: str
    name: str
    rpm: int | None = None
    tpm: int | None = None
    background: bool = False


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if not header:
        return request.headers.get("x-api-key")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


class KeyRing:
    """The keys a server accepts, each with its limits (``default_rpm``/``default_tpm`` where a
    key has none of its own; they also apply to each scope of a server without keys)."""

    def __init__(self, config: ServerConfig) -> None:
        specs = list(config.api_keys)
        if config.api_key is not None:
            specs.insert(0, ApiKeySpec(config.api_key, name="default"))
        self._by_digest: dict[str, ApiKeySpec] = {_digest(s.key): s for s in specs}
        self._default_rpm = config.default_rpm
        self._default_tpm = config.default_tpm

    @property
    def required(self) -> bool:
        return bool(self._by_digest)

    def caller(self, request: Request) -> Caller | None:
        """The request's caller (None on the open paths); raises 401 for a missing or wrong key."""
        if request.url.path in OPEN_PATHS or request.url.path.startswith(UI_PREFIX):
            return None
        token = bearer_token(request)
        if self.required and token is None:
            raise unauthorized("Missing API key: send it as 'Authorization: Bearer <key>'.")
        digest = _digest(token or "")
        scope = digest[:16]
        if not self.required:
            return Caller(scope, f"key-{scope[:8]}", self._default_rpm, self._default_tpm)
        spec = self._by_digest.get(digest)  # a dict keyed by the hash: no timing on the key itself
        if spec is None:
            raise unauthorized()
        rpm = spec.rpm if spec.rpm is not None else self._default_rpm
        tpm = spec.tpm if spec.tpm is not None else self._default_tpm
        return Caller(scope, spec.name or f"key-{scope[:8]}", rpm, tpm)


def background_caller(owner_scope: str) -> Caller:
    """The caller of a Batch API line: the job's owner, without interactive rate limits."""
    return Caller(owner_scope, "batch", background=True)


def request_caller(request: Request) -> Caller:
    """The authenticated caller (set by the app's middleware; Batch API lines carry their owner)."""
    caller = request.scope.get(CALLER)
    if caller is None:  # a path outside the middleware's care: scope by the token alone
        caller = Caller(_digest(bearer_token(request) or "")[:16], "anonymous")
    return caller


def set_caller(scope: Scope, caller: Caller | None) -> None:
    if caller is not None:
        scope[CALLER] = caller


def session_scope(request: Request) -> str:
    """Sessions, files and batch jobs are keyed by the caller's API key (a hash of it), so one key
    cannot reach another key's conversation or jobs even with the same ids."""
    return request_caller(request).scope
