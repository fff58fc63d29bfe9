"""The server's added latency: HTTP end-to-end minus the same request through ``LLM`` in-process.

Starts ``swiftlm serve MODEL`` on loopback, loads the same model in this process, and sends the
same short greedy request alternately to both (the two never run at once). Also checks that
streaming and non-streaming deliver the same tokens.

Usage: python scripts/bench_server_overhead.py models/qwen3-0.6b-random [--repeats 30]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

import httpx

from swiftlm import LLM, SamplingParams

MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
MAX_TOKENS = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("server did not become healthy")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "swiftlm", "serve", args.model, "--port", str(port), "--dtype", args.dtype,
         "--served-model-name", "m", "--max-model-len", "4096", "--log-level", "warning"],
        env={**os.environ}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_healthy(base, proc)
        llm = LLM(args.model, dtype=args.dtype, max_model_len=4096)
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        kwargs = {"enable_thinking": False}
        body = {"model": "m", "messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0,
                "ignore_eos": True, "enable_thinking": False, "logprobs": False}
        client = httpx.Client(timeout=60)
        for _ in range(3):  # warm-up both sides
            llm.chat(MESSAGES, params, kwargs)
            client.post(base + "/v1/chat/completions", json=body)
        local, http = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            local_out = llm.chat(MESSAGES, params, kwargs)
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
            "in_process_median_ms": statistics.median(local) * 1000,
            "http_median_ms": statistics.median(http) * 1000,
            "added_latency_median_ms": statistics.median(diffs) * 1000,
            "added_latency_p90_ms": diffs[int(0.9 * (len(diffs) - 1))] * 1000,
            "stream_equals_whole": "".join(streamed) == whole,
            "same_text_as_in_process": whole == local_out.outputs[0].text,
            "repeats": args.repeats,
        }, indent=2))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


if __name__ == "__main__":
    main()
