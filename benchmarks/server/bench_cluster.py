"""Replicas on Ray Serve against one process (issue 21, acceptance 3).

On one machine, with `swiftlm bench serve` as the load generator:

  throughput and p50 / p95 latency of the `chat` workload (sessions) at concurrency 8:
      single    one process, 2 threads                       (swiftlm serve MODEL)
      affinity  2 replicas x 1 thread, session/prefix routing (--replicas 2 --threads-per-replica 1)
      rr        2 replicas x 1 thread, round-robin            (--routing round-robin)
  the session hit rate (turns after the first whose prompt hit the cache) of affinity vs rr;
  the ingress's overhead at concurrency 1: 1 replica x 1 thread behind the ingress against one
  process with 1 thread (the same engine, only Ray's proxy, the ingress and the handle between).

Needs a quiet machine. Every server is started, measured and stopped in turn; results land in
OUTPUT_DIR/<config>/ (swiftlm bench's own files) and OUTPUT_DIR/summary.{json,md}.

    python benchmarks/server/bench_cluster.py models/qwen3-0.6b-random
    python benchmarks/server/bench_cluster.py /tmp/tiny --num-requests 8 --turns 2 --max-tokens 8   # a dry run
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

SWIFTLM = [sys.executable, "-m", "swiftlm"]


def wait_ready(base_url: str, timeout_s: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{base_url} was not ready within {timeout_s:.0f}s")


def start_server(args: argparse.Namespace, port: int, threads: int, cluster: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    cmd = [*SWIFTLM, "serve", args.model, "--port", str(port), "--served-model-name", "bench",
           "--disable-batch-api", "--no-ui", "--log-level", "warning", *args.serve_arg, *cluster]
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)  # the cluster takes Serve and Ray down on SIGTERM
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_bench(args: argparse.Namespace, base_url: str, concurrency: int, out: Path) -> dict:
    cmd = [*SWIFTLM, "bench", "serve", "--base-url", base_url, "--workload", "chat", "--concurrency", str(concurrency),
           "--num-requests", str(args.num_requests), "--turns", str(args.turns), "--seed", str(args.seed),
           "--extra-body", json.dumps({"enable_thinking": False}), "--no-plots", "--no-progress",
           "--output-dir", str(out), "--model", "bench", "--warmup", str(args.warmup)]
    if args.max_tokens:
        cmd += ["--max-tokens", str(args.max_tokens)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "results.json").read_text())


def digest(results: dict) -> dict:
    """Throughput, latency and session hit rate of one run."""
    run = results["runs"][0]
    summary, records = run["summary"], run["records"]
    later = [r for r in records if r.get("ok") and r.get("turn", 0) > 0]
    hits = sum(1 for r in later if (r.get("cached_tokens") or 0) > 0)
    return {
        "requests": summary["num_requests"], "failed": summary["num_failed"],
        "requests_per_s": summary["requests_per_s"], "output_tokens_per_s": summary["output_tokens_per_s"],
        "latency_p50_s": summary["latency_s"]["p50"], "latency_p95_s": summary["latency_s"]["p95"],
        "ttft_p50_s": summary["ttft_s"]["p50"],
        "session_hit_rate": hits / len(later) if later else None,
        "cached_token_ratio": summary["cached_token_ratio"],
    }


CONFIGS = {  # name: (engine threads, cluster flags, concurrency)
    "single": (2, [], 8),
    "affinity": (1, ["--replicas", "2", "--threads-per-replica", "1"], 8),
    "rr": (1, ["--replicas", "2", "--threads-per-replica", "1", "--routing", "round-robin"], 8),
    "single-c1": (1, [], 1),
    "ingress-c1": (1, ["--replicas", "1", "--threads-per-replica", "1"], 1),
}


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.0f}"


def markdown(rows: dict[str, dict]) -> str:
    lines = ["| config | concurrency | req/s | output tok/s | p50 latency (ms) | p95 latency (ms) | p50 TTFT (ms) "
             "| session hit rate | failed |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        rate = "-" if r["session_hit_rate"] is None else f"{r['session_hit_rate']:.0%}"
        lines.append(f"| {name} | {CONFIGS[name][2]} | {r['requests_per_s']:.2f} | {r['output_tokens_per_s']:.1f} "
                     f"| {_ms(r['latency_p50_s'])} | {_ms(r['latency_p95_s'])} | {_ms(r['ttft_p50_s'])} "
                     f"| {rate} | {r['failed']} |")
    base, ingress = rows.get("single-c1", {}).get("latency_p50_s"), rows.get("ingress-c1", {}).get("latency_p50_s")
    if base is not None and ingress is not None:
        lines.append(f"\ningress overhead at concurrency 1 (p50 latency, 1 replica vs 1 process): "
                     f"{1000 * (ingress - base):+.1f} ms")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {', '.join(CONFIGS)}")
    p.add_argument("--num-requests", type=int, default=96)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--max-tokens", type=int, help="replace the chat workload's max_tokens")
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, default=8600)
    p.add_argument("--ready-timeout", type=float, default=300.0)
    p.add_argument("--serve-arg", action="append", default=[], help="one more `swiftlm serve` argument (repeatable)")
    p.add_argument("--output-dir", type=Path, default=Path(f"bench_results/cluster-{time.strftime('%Y%m%d-%H%M%S')}"))
    args = p.parse_args()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    rows: dict[str, dict] = {}
    for name in args.configs.split(","):
        threads, cluster, concurrency = CONFIGS[name]
        out = args.output_dir / name
        out.mkdir(exist_ok=True)
        base_url = f"http://127.0.0.1:{args.port}"
        proc = start_server(args, args.port, threads, cluster, out / "server.log")
        try:
            wait_ready(base_url, args.ready_timeout, proc)
            rows[name] = digest(run_bench(args, base_url, concurrency, out))
        finally:
            stop_server(proc)
        print(f"{name}: {json.dumps(rows[name])}", flush=True)
    (args.output_dir / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    (args.output_dir / "summary.md").write_text(markdown(rows))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
