"""Server-sent events for one engine request, aborted when the client goes away."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


class EventStream(StreamingResponse):
    """An SSE response that calls ``on_close`` however it ends (finished, client disconnected,
    task cancelled), so the engine frees the request's blocks at once instead of generating
    into a closed socket. ``on_close`` must be a no-op for a request that already finished."""

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(
            events, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()
