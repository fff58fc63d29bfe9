"""The HTTP/1.1 connection layer: uvicorn's h11 protocol with the limits a public server needs.

uvicorn resets its keep-alive timer on every byte and has no timer at all before a connection's
first request, so a client that sends a byte a second (or nothing) holds a connection forever.
``guarded_protocol`` adds:

- a receive deadline: from the first byte of a request (or from the connection's opening, for its
  first request) its headers and body must arrive within ``receive_timeout_s``. Still waiting
  for headers: the answer is a 408 in OpenAI's error envelope and the connection closes. Waiting
  for the body of a request the app is already handling: the connection closes (the app sees the
  client go, as for any disconnect);
- a connection limit: beyond ``max_connections`` open connections a new one is answered 503 (with
  ``Retry-After``) and closed, without reaching the app.

Idle keep-alive connections close after uvicorn's ``timeout_keep_alive``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from swiftlm.config import ServerConfig
from swiftlm.server.errors import error_body


def _error_bytes(status: int, reason: str, message: str, extra_headers: str = "") -> bytes:
    body = json.dumps(error_body(message, "invalid_request_error" if status < 500 else "service_unavailable",
                                 None, None)).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"{extra_headers}connection: close\r\n\r\n")
    return head.encode("ascii") + body


async def _refuse_connection(scope: Scope, receive: Receive, send: Send) -> None:
    """The app of a connection over the limit: 503, then close."""
    body = json.dumps(error_body("Too many open connections; retry shortly.", "service_unavailable", None, None))
    await send({"type": "http.response.start", "status": 503, "headers": [
        (b"content-type", b"application/json"), (b"retry-after", b"1"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body.encode()})


class _GuardedH11Protocol(H11Protocol):
    receive_timeout_s: float = 60.0
    max_connections: int | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        over = self.max_connections is not None and len(self.connections) >= self.max_connections
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        if over:
            self.app = _refuse_connection
        self._arm()  # the first request must arrive in time too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self._between_requests():
            self._arm()  # the first byte of the next request on a kept-alive connection
        super().data_received(data)
        if self._received_whole_request():
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request already buffered
        if self.cycle is not None and not self.cycle.response_complete and self.cycle.more_body:
            self._arm()
        elif self._between_requests():
            self._disarm()  # idle: uvicorn's keep-alive timer closes it

    # -- the deadline ---------------------------------------------------------------------
    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _received_whole_request(self) -> bool:
        return self.cycle is not None and not self.cycle.more_body and not self.cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.receive_timeout_s, self._timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._between_requests():  # the headers never completed: nothing of the app has run
            message = f"The request did not arrive within {self.receive_timeout_s:g} seconds."
            self.transport.write(_error_bytes(408, "Request Timeout", message))
        self.transport.close()  # connection_lost tells a running app the client is gone


def guarded_protocol(receive_timeout_s: float, max_connections: int | None) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a receive deadline and a connection limit (``uvicorn.Config(http=...)``)."""
    return type("GuardedH11Protocol", (_GuardedH11Protocol,), {
        "receive_timeout_s": receive_timeout_s, "max_connections": max_connections})


def uvicorn_config(app: Any, config: ServerConfig, **overrides: Any) -> uvicorn.Config:
    """The uvicorn configuration ``swiftlm serve`` runs ``app`` with (tests start servers with it too)."""
    options: dict[str, Any] = dict(
        host=config.host, port=config.port, log_level=config.log_level, access_log=False,
        timeout_keep_alive=config.timeout_keep_alive_s, timeout_graceful_shutdown=30,
        http=guarded_protocol(config.request_receive_timeout_s, config.max_concurrent_connections),
    )
    return uvicorn.Config(app, **{**options, **overrides})
