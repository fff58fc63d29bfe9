"""Latency of a response-cache hit against a miss, through the openai client, on one
``swiftlm serve --response-cache memory`` process.

    OMP_NUM_THREADS=2 OMP_PROC_BIND=close OMP_PLACES=cores \
        python benchmarks/server/bench_response_cache.py models/qwen3-0.6b-random [--repeats 8]

Each repeat asks a new question (a miss: prefill + 64 decoded tokens, ``ignore_eos``, greedy,
thinking off), then the same question again (a hit), whole and streamed (time to the last
chunk). Prints p50 and p90 of each with the ratio, and writes JSON with every sample.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def ask(client: openai.OpenAI, question: str, stream: bool) -> tuple[float, str, str]:
    """(seconds, content, x-swiftlm-cache)."""
    def call():
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": question}], max_tokens=64, temperature=0, stream=stream,
            extra_body={"ignore_eos": True, "enable_thinking": False})
        if not stream:
            return raw.headers.get("x-swiftlm-cache"), raw.parse().choices[0].message.content
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
        return raw.headers.get("x-swiftlm-cache"), text

    seconds, (status, text) = timed(call)
    return seconds, text, status


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1] if len(values) > 1 else values[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--port", type=int, default=8127)
    ap.add_argument("--out", default="bench-out/response_cache.json")
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="swiftlm-response-cache-bench-")
    cmd = [sys.executable, "-m", "swiftlm", "serve", args.model, "--dtype", "bfloat16", "--port", str(args.port),
           "--served-model-name", "m", "--response-cache", "memory", "--batch-storage-dir", workdir]
    log = open(Path(workdir) / "serve.log", "w")  # noqa: SIM115 (open for the server's lifetime)
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{args.port}"
    samples: dict[str, list[float]] = {"miss": [], "hit": [], "miss_stream": [], "hit_stream": []}
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit(f"the server did not start; see {workdir}/serve.log")
            time.sleep(0.5)
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
        ask(client, "warm-up question", stream=False)
        for rep in range(args.repeats):
            for stream in (False, True):
                suffix = "_stream" if stream else ""
                question = f"Question {rep}{suffix}: describe the river and the city in a few sentences."
                miss_s, miss_text, status = ask(client, question, stream)
                assert status == "miss", status
                hit_s, hit_text, status = ask(client, question, stream)
                assert status == "hit" and hit_text == miss_text, (status, hit_text, miss_text)
                samples["miss" + suffix].append(miss_s)
                samples["hit" + suffix].append(hit_s)
    finally:
        server.terminate()
        server.wait(timeout=60)
    summary = {}
    for name, values in samples.items():
        summary[name] = {"p50_ms": 1000 * statistics.median(values), "p90_ms": 1000 * quantile(values, 0.9)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"summary": summary, "samples_s": samples, "repeats": args.repeats}, indent=2))
    print(f"{args.repeats} repeats, 64-token answers (ignore_eos, greedy, thinking off), bf16, openai client")
    print("| request | miss p50 (ms) | hit p50 (ms) | miss p90 | hit p90 | miss / hit (p50) |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, suffix in (("whole answer", ""), ("streamed, to the last chunk", "_stream")):
        miss, hit = summary["miss" + suffix], summary["hit" + suffix]
        print(f"| {label} | {miss['p50_ms']:.1f} | {hit['p50_ms']:.2f} | {miss['p90_ms']:.1f} | {hit['p90_ms']:.2f} | "
              f"{miss['p50_ms'] / hit['p50_ms']:.0f}x |")


if __name__ == "__main__":
    main()
