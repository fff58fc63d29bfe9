"""The ingress: one thin Serve deployment in front of the engine replicas.

It reads just enough of each request to route it (``RoutingKey.of``: the body's ``session_id`` or
the ``x-session-id`` header, else the conversation's prefix), forwards it to the replica
deployment's handle (``SessionPrefixRouter`` picks the replica) and relays the answer: an SSE
stream chunk by chunk, any other body whole. A session named only by the header is written into
the body as ``session_id``, so the replica keeps that session's KV as it would for the field.

A replica that dies while it holds a request fails that request with a 503 (OpenAI's error
body; a stream that had started ends with an error event), which clients retry; the next
request of its sessions reaches a live replica and is prefilled afresh from its messages.

Debug route (with ``--enable-debug-endpoints``): ``/debug/replicas/{replica_id}/{path}`` sends a
request for ``/{path}`` to that replica alone, e.g. its ``/metrics``; every response names its
replica in ``x-swiftlm-replica``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import ray.exceptions
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from swiftlm.cluster.config import ClusterConfig
from swiftlm.cluster.forwarding import ForwardedRequest, ResponseStart
from swiftlm.cluster.routing import RoutingKey
from swiftlm.server.errors import OpenAIError, service_unavailable

SESSION_HEADER = "x-session-id"
DEBUG_PREFIX = "/debug/replicas/"
_DROPPED_HEADERS = {b"content-length", b"transfer-encoding", b"connection"}

logger = logging.getLogger("swiftlm.cluster")


def _replica_error(exc: BaseException) -> OpenAIError:
    """A failed replica call as the HTTP error: 503 (retry) when the replica was lost, else 500."""
    if not isinstance(exc, (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)):
        return OpenAIError(500, f"The request failed inside its replica: {exc}")
    return service_unavailable(f"The replica serving this request stopped ({type(exc).__name__}); retry it.",
                               retry_after_s=1)


def with_session(body: bytes, session_id: str) -> bytes:
    """``body`` with ``session_id`` set, when it is a JSON object that names none."""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    if not isinstance(data, dict) or "session_id" in data:
        return body
    return json.dumps({**data, "session_id": session_id}).encode()


class EngineIngress:
    """Serve deployment class (made a deployment by ``swiftlm.cluster.app``)."""

    def __init__(self, config: ClusterConfig, replicas: Any) -> None:
        self.config = config
        self.replicas = replicas.options(stream=True)

    async def __call__(self, request: Request) -> Response:
        body = await request.body()
        path = request.url.path
        key = self._routing_key(request, body)
        if key.replica is not None:
            path = "/" + path[len(DEBUG_PREFIX):].partition("/")[2]
        elif key.session_id is not None and request.headers.get(SESSION_HEADER) == key.session_id:
            body = with_session(body, key.session_id)
        headers = tuple((k, v) for k, v in request.headers.raw if k.lower() != b"content-length")
        headers += ((b"content-length", str(len(body)).encode()),)
        client = (request.client.host, request.client.port) if request.client else ("127.0.0.1", 0)
        forwarded = ForwardedRequest(request.method, path, request.url.query.encode(), headers, body, client)
        parts = self.replicas.forward.remote(key, forwarded)
        try:
            start = await parts.__anext__()
        except StopAsyncIteration:
            return OpenAIError(500, "The replica ended the request without an answer.").response()
        except ray.exceptions.RayError as exc:
            return _replica_error(exc).response()
        if not isinstance(start, ResponseStart):
            return OpenAIError(500, "The replica answered out of order.").response()
        headers = [(k, v) for k, v in start.headers if k.lower() not in _DROPPED_HEADERS]
        if (start.header("content-type") or "").startswith("text/event-stream"):
            response: Response = StreamingResponse(_relay_stream(parts), status_code=start.status)
            response.raw_headers = headers
            return response
        try:
            chunks = [chunk async for chunk in parts]
        except ray.exceptions.RayError as exc:
            return _replica_error(exc).response()
        content = b"".join(chunks)
        response = Response(content, status_code=start.status)
        response.raw_headers = [*headers, (b"content-length", str(len(content)).encode())]
        return response

    def _routing_key(self, request: Request, body: bytes) -> RoutingKey:
        path = request.url.path
        if self.config.server.enable_debug_endpoints and path.startswith(DEBUG_PREFIX):
            return RoutingKey(replica=path[len(DEBUG_PREFIX):].partition("/")[0])
        data: Any = None
        if body and request.method == "POST":
            try:
                data = json.loads(body)
            except ValueError:
                data = None  # the replica answers the 400
        return RoutingKey.of(data if isinstance(data, dict) else None, request.headers.get(SESSION_HEADER),
                             self.config.prefix_chunk_chars)


async def _relay_stream(parts: Any) -> AsyncIterator[bytes]:
    """The rest of an SSE stream; a replica lost mid-stream ends it with an error event."""
    try:
        async for chunk in parts:
            yield chunk
    except ray.exceptions.RayError as exc:
        logger.warning("a replica stopped during a stream: %s", exc)
        yield _replica_error(exc).sse_event().encode()
