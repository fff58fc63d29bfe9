"""The server's added latency: HTTP end-to-end minus the same request straight into the engine.

One process, one engine: the real app runs on uvicorn (127.0.0.1) in a thread over an
AsyncEngine, and the same short greedy request is sent alternately (never at once) through HTTP
and directly to the engine (``AsyncEngine.submit``, what ``LLM`` does minus its own loop). The
difference is what the HTTP layer adds: parsing, validation, the chat template, response JSON.
Also checks that streaming and non-streaming deliver the same text.

Usage: python benchmarks/server/bench_server_overhead.py models/qwen3-0.6b-random [--repeats 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import threading
import time

import httpx
import uvicorn

from swiftlm import SamplingParams
from swiftlm.config import ServerConfig
from swiftlm.core.generation import GenerationRequest
from swiftlm.engine.async_engine import AsyncEngine
from swiftlm.engine.engine import Engine
from swiftlm.frontend.output_processor import RequestText
from swiftlm.frontend.text_stream import TextStream
from swiftlm.llm import engine_config
from swiftlm.server.app import create_app

MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
MAX_TOKENS = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    engine = AsyncEngine(Engine(engine_config(args.model, args.dtype, "cpu", max_model_len=4096)))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(engine, ServerConfig(), "m"), host="127.0.0.1", port=port,
                                           log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    base = f"http://127.0.0.1:{port}"
    tokenizer = engine.tokenizer
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, enable_thinking=False)
    ids = tokenizer.encode(prompt)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    body = {"model": "m", "messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            "enable_thinking": False}
    counter = iter(range(10**9))

    async def direct() -> str:
        request = GenerationRequest(f"direct-{next(counter)}", ids, params, final_only=True)
        out = await TextStream(engine.submit(request), RequestText(request, engine.tokenizer)).final()
        return out.outputs[0].text

    client = httpx.Client(timeout=120)
    for _ in range(3):  # warm-up: the same shapes on both paths
        asyncio.run(direct())
        client.post(base + "/v1/chat/completions", json=body)
    local, http = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        local_text = asyncio.run(direct())
        local.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        r = client.post(base + "/v1/chat/completions", json=body)
        http.append(time.perf_counter() - t0)
        assert r.status_code == 200
    whole = r.json()["choices"][0]["message"]["content"]
    streamed = []
    with client.stream("POST", base + "/v1/chat/completions", json={**body, "stream": True}) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    streamed.append(choice["delta"].get("content") or "")
    diffs = sorted(h - loc for h, loc in zip(http, local, strict=True))
    print(json.dumps({
        "engine_direct_median_ms": statistics.median(local) * 1000,
        "http_median_ms": statistics.median(http) * 1000,
        "added_latency_median_ms": statistics.median(diffs) * 1000,
        "added_latency_p90_ms": diffs[int(0.9 * (len(diffs) - 1))] * 1000,
        "stream_equals_whole": "".join(streamed) == whole,
        "same_text_as_direct": whole == local_text,
        "repeats": args.repeats,
    }, indent=2))
    server.should_exit = True
    engine.shutdown(drain_timeout_s=5)


if __name__ == "__main__":
    main()
