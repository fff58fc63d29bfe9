"""Batch API lines run through the server's own endpoints, in process: a line's result is exactly
what the same body sent to ``/v1/chat/completions`` (or ``/v1/completions``) returns, with the
same validation, errors and response objects.

The call goes through the ASGI app with its caller in the scope (``CALLER``, a background caller
that no HTTP client can be): the endpoints submit such a request to the engine at background
priority (batch lines wait for interactive traffic). Lines never stream: ``stream`` is dropped from the body.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from swiftlm.server.operations.auth import CALLER, background_caller
from swiftlm.server.operations.body_limit import replay_body


class InProcessCall:
    """``await call(url, body, owner)`` -> (status, response body) through ``app``. The line runs
    as its job's owner (the scope key ``CALLER``: authenticated when the job was created), so its
    sessions are the owner's."""

    def __init__(self, app: Any) -> None:
        self._app = app

    async def __call__(self, url: str, body: dict, owner: str) -> tuple[int, dict]:
        body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        payload = json.dumps(body).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
            "scheme": "http", "path": url, "raw_path": url.encode(), "query_string": b"", "root_path": "",
            "headers": headers, "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0),
            CALLER: background_caller(owner),
        }

        async def never_disconnect() -> dict:
            await asyncio.Event().wait()  # the caller never disconnects: wait until cancelled
            return {"type": "http.disconnect"}

        status = 500
        chunks: list[bytes] = []

        async def send(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self._app(scope, replay_body(payload, never_disconnect), send)
        raw = b"".join(chunks)
        try:
            response = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            response = {"error": {"message": raw.decode(errors="replace"), "type": "internal_error"}}
        return status, response
