"""One HTTP request run against an ASGI app in process, its response as a stream of parts.

A replica executes the requests the ingress forwards with this: the request reaches the very
same FastAPI app ``swiftlm serve`` runs (routes, validation, errors, streaming), only without a
socket. The parts are picklable, so they cross Ray's streaming calls unchanged:

    ResponseStart(status, headers)   once, first
    bytes                            each body chunk as the app sends it (an SSE event, a JSON body)

When the consumer stops early (the client went away, the stream was cancelled), the app sees
``http.disconnect`` and aborts the engine request, as it does for a closed socket.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from swiftlm.server.operations.body_limit import replay_body


@dataclass(frozen=True, slots=True)
class ForwardedRequest:
    """What the ingress received: enough to rebuild the ASGI scope on the replica."""

    method: str
    path: str
    query_string: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    client: tuple[str, int] = ("127.0.0.1", 0)


@dataclass(frozen=True, slots=True)
class ResponseStart:
    status: int
    headers: tuple[tuple[bytes, bytes], ...]

    def header(self, name: str) -> str | None:
        key = name.lower().encode()
        return next((v.decode("latin-1") for k, v in self.headers if k.lower() == key), None)


def asgi_scope(request: ForwardedRequest) -> dict[str, Any]:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": request.method,
        "scheme": "http", "path": request.path, "raw_path": request.path.encode(),
        "query_string": request.query_string, "root_path": "", "headers": list(request.headers),
        "client": request.client, "server": ("127.0.0.1", 0),
    }


async def run_in_app(app: Any, request: ForwardedRequest) -> AsyncIterator[ResponseStart | bytes]:
    """Run ``request`` through ``app``; yields its ResponseStart, then its body chunks."""
    parts: asyncio.Queue[ResponseStart | bytes | None] = asyncio.Queue()
    disconnected = asyncio.Event()

    async def wait_for_disconnect() -> dict:
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            headers = tuple((bytes(k), bytes(v)) for k, v in message.get("headers", ()))
            parts.put_nowait(ResponseStart(message["status"], headers))
        elif message["type"] == "http.response.body":
            if message.get("body"):
                parts.put_nowait(bytes(message["body"]))
            if not message.get("more_body", False):
                parts.put_nowait(None)

    async def call() -> None:
        try:
            await app(asgi_scope(request), replay_body(request.body, wait_for_disconnect), send)
        finally:
            parts.put_nowait(None)  # the app returned (or failed) without ending its body

    task = asyncio.create_task(call())
    try:
        while (part := await parts.get()) is not None:
            yield part
        await task  # an exception the app raised outside its error handlers surfaces here
    finally:
        disconnected.set()
        if not task.done():
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), timeout=5.0)
            task.cancel()


class Lifespan:
    """An app's ASGI lifespan run in process: ``start`` runs its startup hooks (the Batch API
    resumes its jobs) and ``stop`` its shutdown hooks, as uvicorn would around serving."""

    def __init__(self, app: Any) -> None:
        self._app = app
        self._inbox: asyncio.Queue[dict] = asyncio.Queue()
        self._outbox: asyncio.Queue[dict] = asyncio.Queue()
        self._task: asyncio.Task | None = None

    async def _call(self) -> None:
        await self._app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
                        self._inbox.get, self._outbox.put)

    async def _step(self, message: str) -> None:
        self._inbox.put_nowait({"type": f"lifespan.{message}"})
        reply = await self._outbox.get()
        if reply["type"].endswith(".failed"):
            raise RuntimeError(f"the app's {message} failed: {reply.get('message', '')}")

    async def start(self) -> None:
        self._task = asyncio.create_task(self._call())
        await self._step("startup")

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            await self._step("shutdown")
            await self._task
