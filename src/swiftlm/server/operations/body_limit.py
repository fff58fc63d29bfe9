"""A request body larger than ``--max-request-bytes`` is a 413 before the app parses any of it.

An ASGI middleware: a declared ``Content-Length`` over the limit is refused at once; a body sent
without one (chunked) is read up to the limit and refused as soon as it passes it; within the
limit the body is handed to the app as it was read. File uploads (``/v1/files``) fall under the
Batch API's own limit (``--max-batch-file-bytes``) instead.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from swiftlm.server.errors import OpenAIError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

EXEMPT_PREFIXES = ("/v1/files",)


def _too_large(limit: int) -> OpenAIError:
    return OpenAIError(413, f"The request body is larger than this server accepts ({limit} bytes, "
                            "--max-request-bytes).", code="request_too_large")


def replay_body(body: bytes, then: Receive) -> Receive:
    """An ASGI ``receive`` that gives ``body`` whole as the first message, then defers to ``then``."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await then()

    return receive


class BodyLimit:
    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(EXEMPT_PREFIXES):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client left: let the app see it
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                await self._refuse(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        await self.app(scope, replay_body(b"".join(chunks), receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _too_large(self.limit).response()(scope, receive, send)
