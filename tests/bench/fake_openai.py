"""A small fake OpenAI-compatible server for the bench tests (FastAPI).

The path prefix picks the behaviour: `/v1/...` or `/ok/v1/...` answers normally; `/lag` waits
150 ms before the first token (far above the jitter of a loaded 2-core machine); `/slow` waits 5 s; `/busy` answers 429 with Retry-After; `/mixed`
answers 429 to every third request; `/error` 500; `/bad` 400; `/broken` breaks the protocol;
`/nousage` streams without a usage chunk.

Replies: `min(max_tokens, 8)` tokens "w0 w1 ..."; with `enable_thinking` the first two are
reasoning. Usage: prompt_tokens = words in the prompt, cached_tokens = 4 when a session_id is
sent. Run as a script (`fake_openai.py MODEL --host H --port P`) it stands in for `swiftlm serve`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

MODEL = "fake-model"
TOKEN_GAP_S = 0.002


def _prompt_words(body: dict[str, Any]) -> int:
    if "messages" in body:
        return sum(len(m["content"].split()) for m in body["messages"])
    return len(str(body.get("prompt", "")).split())


def _usage(body: dict[str, Any], n: int, reasoning: int) -> dict[str, Any]:
    prompt = _prompt_words(body)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": n,
        "total_tokens": prompt + n,
        "prompt_tokens_details": {"cached_tokens": 4 if body.get("session_id") else 0},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


def create_app() -> FastAPI:
    app = FastAPI()
    app.state.bodies = []
    app.state.counter = 0

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    @app.get("/{mode}/v1/models")
    async def models(mode: str = "ok") -> dict[str, Any]:
        return {"object": "list", "data": [{"id": MODEL, "object": "model"}]}

    @app.post("/v1/chat/completions")
    @app.post("/{mode}/v1/chat/completions")
    async def chat(request: Request, mode: str = "ok") -> Response:
        return await _complete(app, request, mode, chat=True)

    @app.post("/v1/completions")
    @app.post("/{mode}/v1/completions")
    async def completions(request: Request, mode: str = "ok") -> Response:
        return await _complete(app, request, mode, chat=False)

    return app


async def _complete(app: FastAPI, request: Request, mode: str, chat: bool) -> Response:
    body = await request.json()
    app.state.bodies.append(body)
    app.state.counter += 1
    if mode == "busy" or (mode == "mixed" and app.state.counter % 3 == 0):
        return JSONResponse(
            {"error": {"message": "queue full", "type": "rate_limit"}},
            status_code=429,
            headers={"Retry-After": "1"},
        )
    if mode == "error":
        return JSONResponse({"error": {"message": "boom"}}, status_code=500)
    if mode == "bad":
        return JSONResponse({"error": {"message": "bad request"}}, status_code=400)
    if mode == "slow":
        await asyncio.sleep(5.0)
    if mode == "lag":
        await asyncio.sleep(0.15)
    n = min(int(body.get("max_tokens", 8)), 8)
    reasoning = min(2, n) if body.get("enable_thinking") else 0
    words = [f"w{i}" for i in range(n)]
    if not body.get("stream"):
        if mode == "broken":
            return Response("this is not json", media_type="application/json")
        answer = " ".join(words[reasoning:])
        choice = (
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": answer,
                    "reasoning_content": " ".join(words[:reasoning]) or None,
                },
                "finish_reason": "length",
            }
            if chat
            else {"index": 0, "text": answer, "finish_reason": "length"}
        )
        return JSONResponse(
            {
                "id": "x",
                "object": "chat.completion",
                "model": MODEL,
                "choices": [choice],
                "usage": _usage(body, n, reasoning),
            }
        )

    async def events() -> AsyncIterator[str]:
        for i, word in enumerate(words):
            await asyncio.sleep(TOKEN_GAP_S)
            text = word if i == 0 or i == reasoning else " " + word
            if chat:
                delta = {"reasoning_content": text} if i < reasoning else {"content": text}
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None}
            else:
                choice = {"index": 0, "text": text, "finish_reason": None}
            yield f"data: {json.dumps({'id': 'x', 'choices': [choice]})}\n\n"
        if mode == "broken":
            return
        if (body.get("stream_options") or {}).get("include_usage") and mode != "nousage":
            yield f"data: {json.dumps({'id': 'x', 'choices': [], 'usage': _usage(body, n, reasoning)})}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


class ServerThread:
    """uvicorn serving `app` on 127.0.0.1 (a free port) in a daemon thread."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.server = uvicorn.Server(
            uvicorn.Config(
                app, host="127.0.0.1", port=0, log_level="error", timeout_graceful_shutdown=1, lifespan="off"
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("fake server did not start")
            time.sleep(0.01)
        return self

    @property
    def url(self) -> str:
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.server.force_exit = True  # do not wait for /slow requests still sleeping
        self.thread.join(timeout=5)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args, _ = parser.parse_known_args()
    uvicorn.run(create_app(), host=args.host, port=args.port, log_level="error")
