"""Interactive latency with and without a Batch API job running, interleaved, against one
``swiftlm serve`` process; and the job's throughput with and without interactive traffic.

    OMP_NUM_THREADS=2 OMP_PROC_BIND=close OMP_PLACES=cores \
        python benchmarks/server/bench_batch_interference.py models/qwen3-0.6b-random [--repeats 3]

Each repeat runs, in alternating order: the ``qa`` workload at concurrency 2 alone, and the same
requests while a 500-line batch (~300-token prompts, 64-token answers) runs (created just
before, cancelled just after). p50 TTFT and p50 TPOT (streamed, ``ignore_eos``) per phase; the
batch's lines per minute while the qa requests ran; at the end the batch alone for
``--alone-s`` seconds. Prints a markdown table with medians over repeats and the bandwidth seen.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from swiftlm.bench.bandwidth import BandwidthProbe
from swiftlm.bench.client import LoadConfig, run_load_sync
from swiftlm.bench.workloads import build_workload

WORDS = ("model data system network result value energy signal memory process river city history light "
         "number market language garden window music").split()


def batch_lines(model: str, n: int, prompt_words: int, seed: int) -> bytes:
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(prompt_words))
        body = {"model": model, "messages": [{"role": "user", "content": f"{i}: {text}"}], "max_tokens": 64,
                "ignore_eos": True, "temperature": 0.7, "enable_thinking": False}
        lines.append(json.dumps({"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}))
    return ("\n".join(lines) + "\n").encode()


def start_batch(v1: str, data: bytes) -> str:
    file_id = httpx.post(f"{v1}/files", data={"purpose": "batch"}, files={"file": ("b.jsonl", data)}, timeout=60).json()["id"]
    return httpx.post(f"{v1}/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                             "completion_window": "24h"}, timeout=60).json()["id"]


def done_lines(v1: str, batch_id: str) -> int:
    counts = httpx.get(f"{v1}/batches/{batch_id}", timeout=30).json()["request_counts"]
    return counts["completed"] + counts["failed"]


def cancel(v1: str, batch_id: str) -> None:
    httpx.post(f"{v1}/batches/{batch_id}/cancel", timeout=30)
    while httpx.get(f"{v1}/batches/{batch_id}", timeout=30).json()["status"] not in ("cancelled", "completed"):
        time.sleep(0.2)


def qa_phase(base: str, model: str, n: int, seed: int) -> tuple[float, float]:
    requests = build_workload("qa", n, seed=seed)
    config = LoadConfig(base_url=base, model=model, concurrency=2, num_requests=n, show_progress=False,
                        extra_body={"ignore_eos": True, "enable_thinking": False})
    records = [r for r in run_load_sync(requests, config).records if r.ok]
    ttft = statistics.median(r.ttft for r in records if r.ttft is not None)
    tpot = statistics.median((r.latency - r.ttft) / (r.completion_tokens - 1) for r in records
                             if r.ttft is not None and r.latency and (r.completion_tokens or 0) > 1)
    return ttft, tpot


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--qa-requests", type=int, default=12)
    ap.add_argument("--lines", type=int, default=500)
    ap.add_argument("--prompt-words", type=int, default=300)
    ap.add_argument("--alone-s", type=float, default=60.0)
    ap.add_argument("--port", type=int, default=8123)
    args = ap.parse_args()
    storage = tempfile.mkdtemp(prefix="swiftlm-batch-bench-")
    cmd = [sys.executable, "-m", "swiftlm", "serve", args.model, "--dtype", "bfloat16", "--port", str(args.port),
           "--batch-storage-dir", storage, "--served-model-name", "m"]
    log = open(Path(storage) / "serve.log", "w")  # noqa: SIM115 (open for the server's lifetime)
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    base, v1 = f"http://127.0.0.1:{args.port}", f"http://127.0.0.1:{args.port}/v1"
    try:
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        qa_phase(base, "m", 2, seed=999)  # warm-up
        probe = BandwidthProbe()
        alone, together, rates, bandwidth = [], [], [], []
        for rep in range(args.repeats):
            bandwidth.append(probe.measure(3))
            for with_batch in ((False, True) if rep % 2 == 0 else (True, False)):
                if not with_batch:
                    alone.append(qa_phase(base, "m", args.qa_requests, seed=rep))
                    continue
                batch_id = start_batch(v1, batch_lines("m", args.lines, args.prompt_words, seed=rep))
                while done_lines(v1, batch_id) < 1:  # the batch is running: its first line answered
                    time.sleep(0.2)
                t0, d0 = time.monotonic(), done_lines(v1, batch_id)
                together.append(qa_phase(base, "m", args.qa_requests, seed=rep))
                rates.append(60 * (done_lines(v1, batch_id) - d0) / (time.monotonic() - t0))
                cancel(v1, batch_id)
        batch_id = start_batch(v1, batch_lines("m", args.lines, args.prompt_words, seed=99))
        while done_lines(v1, batch_id) < 1:
            time.sleep(0.2)
        t0, d0 = time.monotonic(), done_lines(v1, batch_id)
        time.sleep(args.alone_s)
        alone_rate = 60 * (done_lines(v1, batch_id) - d0) / (time.monotonic() - t0)
        cancel(v1, batch_id)
        bandwidth.append(probe.measure(3))
    finally:
        server.terminate()
        server.wait(timeout=60)
    ttft_a, tpot_a = statistics.median(a for a, _ in alone), statistics.median(b for _, b in alone)
    ttft_t, tpot_t = statistics.median(a for a, _ in together), statistics.median(b for _, b in together)
    print(f"qa at concurrency 2, {args.qa_requests} requests a phase, {args.repeats} repeats (medians); batch "
          f"{args.lines} lines of ~{args.prompt_words} words, 64 tokens; bandwidth "
          f"{min(bandwidth):.1f}-{max(bandwidth):.1f} GB/s")
    print("| | p50 TTFT s | p50 TPOT ms | batch lines/min |\n|---|---:|---:|---:|")
    print(f"| qa alone | {ttft_a:.3f} | {1e3 * tpot_a:.1f} | |")
    print(f"| qa with the batch running | {ttft_t:.3f} | {1e3 * tpot_t:.1f} | {statistics.median(rates):.1f} |")
    print(f"| ratio | **{ttft_t / ttft_a:.2f}x** | **{tpot_t / tpot_a:.2f}x** | |")
    print(f"| batch alone | | | {alone_rate:.1f} |")
    print("per repeat (alone, with): " + "; ".join(
        f"{a[0]:.3f}/{1e3 * a[1]:.1f} vs {t[0]:.3f}/{1e3 * t[1]:.1f}" for a, t in zip(alone, together, strict=True)))


if __name__ == "__main__":
    main()
