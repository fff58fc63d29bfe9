"""The response cache as the routes use it: whether a request may be cached, its key, and
storing what it answered (``swiftlm.server.answer_cache.policy`` holds the policy)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel

from swiftlm.sampling import SamplingParams
from swiftlm.server.answer_cache.answers import nothing_to_abort, recorded, replayed, stored_answer, whole_hit
from swiftlm.server.answer_cache.policy import CACHE_HEADER, ResponseCache, bypasses_cache, is_deterministic
from swiftlm.server.completions.sampling_protocol import BaseSamplingRequest
from swiftlm.server.operations.auth import Caller, request_caller
from swiftlm.server.state import ServerState
from swiftlm.server.streaming import EventStream

if TYPE_CHECKING:
    from swiftlm.server.responses.protocol import ResponsesRequest

# (stored answer, request id, include_usage) -> the stream's events: how a route replays a hit
HitEvents = Callable[[dict[str, Any], str, bool], Iterator[str]]

_COMPLETE = frozenset({"stop", "length", "tool_calls"})  # finish reasons of an answer worth keeping


@dataclass(frozen=True, slots=True)
class CacheUse:
    """How one request meets the cache: ``status`` "hit", "miss" or "bypass" (None: the cache is
    off); ``key`` is set for a cacheable request."""

    cache: ResponseCache | None
    key: str | None
    status: str | None

    @property
    def extension(self) -> dict[str, Any]:
        return {} if self.status is None else {"cache": self.status}

    def mark(self, response: Response) -> Response:
        if self.status is not None:
            response.headers[CACHE_HEADER] = self.status
        return response

    def keep(self, body: dict[str, Any], thinking: str | None = None) -> None:
        """Store a whole answer (a body as sent), if it is complete."""
        if self.cache is None or self.key is None:
            return
        if all(c.get("finish_reason") in _COMPLETE for c in body.get("choices", ())) and body.get("choices"):
            self.cache.put(self.key, stored_answer(body, thinking))

    def keep_json(self, text: str, thinking: str | None = None) -> None:
        if self.key is not None:
            self.keep(json.loads(text), thinking)

    def record(
        self, events: AsyncIterator[str], assemble: Callable[[list[dict[str, Any]]], dict[str, Any]],
        include_usage: bool, thinking: str | None = None,
    ) -> AsyncIterator[str]:
        """``events`` (asked with usage) passed to the client, stored when the stream completes."""
        if self.key is None:
            return events
        return recorded(events, lambda chunks: self.keep(assemble(chunks), thinking), include_usage)


def cache_use(
    state: ServerState, req: BaseSamplingRequest | ResponsesRequest, raw: Request, route: str, params: SamplingParams,
    key_body: BaseModel | None = None, continues_session: bool = False,
) -> CacheUse:
    """How ``req`` meets the cache. ``key_body``: what the key is made of when not ``req`` itself
    (the Responses API keys the chat request it becomes: the whole conversation, not the previous
    response's id); ``continues_session``: the request's turn must reach a session (bypass)."""
    cache = state.response_cache
    if cache is None:
        return CacheUse(None, None, None)
    if bypasses_cache(req, raw.headers) or continues_session or not is_deterministic(params):
        return CacheUse(cache, None, "bypass")
    key = cache.key(route, state.response_model(req.model), request_caller(raw).scope,
                    req if key_body is None else key_body)
    return CacheUse(cache, key, "miss")


def lookup(use: CacheUse) -> dict[str, Any] | None:
    """The stored answer for a cacheable request (counted as a hit or a miss)."""
    if use.cache is None or use.key is None:
        return None
    return use.cache.get(use.key)


def answer_from_cache(
    state: ServerState, use: CacheUse, caller: Caller, stream: bool, request_id: str, include_usage: bool,
    events: HitEvents,
) -> Response | None:
    """The response to a request the cache holds, whole or streamed (``events`` replays it), or None
    (not a hit). A hit computes nothing: it is counted as a request, not as tokens."""
    answer = lookup(use)
    if answer is None:
        return None
    state.admit(caller, 0)
    hit = dataclasses.replace(use, status="hit")
    if stream:
        return hit.mark(EventStream(replayed(events(answer, request_id, include_usage)), nothing_to_abort))
    return hit.mark(Response(whole_hit(answer, request_id), media_type="application/json"))
