"""swiftlm.cluster.forwarding: a request run against an ASGI app in process (no Ray, no socket)."""

from __future__ import annotations

import asyncio
import json

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from swiftlm.cluster.forwarding import ForwardedRequest, Lifespan, ResponseStart, run_in_app


def _app(events: list[str]) -> FastAPI:
    app = FastAPI()
    app.router.on_startup.append(lambda: events.append("startup"))
    app.router.on_shutdown.append(lambda: events.append("shutdown"))

    @app.post("/echo")
    async def echo(request: Request) -> JSONResponse:
        body = await request.json()
        return JSONResponse({"got": body, "path": request.url.path, "q": request.url.query,
                             "key": request.headers.get("x-key")}, status_code=201, headers={"x-extra": "1"})

    @app.get("/stream")
    async def stream(request: Request) -> StreamingResponse:
        async def events_out():
            try:
                for i in range(1000):
                    yield f"data: {i}\n\n"
                    await asyncio.sleep(0.001)
            finally:
                events.append("stream closed")

        return StreamingResponse(events_out(), media_type="text/event-stream")

    return app


def _request(method: str, path: str, body: bytes = b"", query: bytes = b"") -> ForwardedRequest:
    headers = ((b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"x-key", b"k"))
    return ForwardedRequest(method, path, query, headers, body)


def test_a_whole_answer_comes_back_as_start_then_body() -> None:
    async def main() -> list:
        return [p async for p in run_in_app(_app([]), _request("POST", "/echo", b'{"a": 1}', b"x=2"))]

    parts = asyncio.run(main())
    start, body = parts[0], b"".join(parts[1:])
    assert isinstance(start, ResponseStart) and start.status == 201
    assert start.header("X-Extra") == "1" and start.header("missing") is None
    assert json.loads(body) == {"got": {"a": 1}, "path": "/echo", "q": "x=2", "key": "k"}


def test_errors_and_unknown_routes_are_the_apps_own() -> None:
    async def main() -> list:
        return [p async for p in run_in_app(_app([]), _request("POST", "/nowhere", b"{}"))]

    parts = asyncio.run(main())
    assert parts[0].status == 404


def test_a_consumer_that_stops_early_ends_the_stream() -> None:
    events: list[str] = []

    async def main() -> list:
        chunks = []
        parts = run_in_app(_app(events), _request("GET", "/stream"))
        async for part in parts:
            chunks.append(part)
            if len(chunks) == 4:
                break
        await parts.aclose()
        return chunks

    chunks = asyncio.run(main())
    assert chunks[0].header("content-type").startswith("text/event-stream")
    assert chunks[1:] == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n"]
    assert events == ["stream closed"]  # the app's generator did not run to its 1000 events


def test_lifespan_runs_the_apps_hooks() -> None:
    events: list[str] = []

    async def main() -> None:
        lifespan = Lifespan(_app(events))
        await lifespan.start()
        assert events == ["startup"]
        await lifespan.stop()

    asyncio.run(main())
    assert events == ["startup", "shutdown"]
