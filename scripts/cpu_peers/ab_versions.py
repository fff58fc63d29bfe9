"""Decode speed of several swiftlm source trees (and optionally llama.cpp), interleaved, in one run.

    git worktree add /tmp/v1 <commit>          # one checkout per version to compare
    python scripts/cpu_peers/ab_versions.py --model models/qwen3-0.6b-random \
        --version before=/tmp/v1/src --version after=src \
        --llama-gguf models/qwen3-0.6b-random-gguf/qwen3-0.6b-random-bf16.gguf --repeats 5

Each version runs in its own worker process (``worker.py`` with that tree first on PYTHONPATH),
loaded once; every repeat runs the same prompt through each worker, the order reversing every
repeat. Prints the median decode tok/s and TTFT of each, and each one's ratio to the first.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import WORKER, Worker  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--version", action="append", required=True, metavar="LABEL=SRC_DIR",
                    help="a swiftlm source tree (the directory holding the swiftlm package)")
    ap.add_argument("--quantization", choices=["int8", "int4"], help="load every swiftlm version quantised")
    ap.add_argument("--llama-gguf", help="also run llama.cpp (flash attention on) on this GGUF")
    ap.add_argument("--llama-python", default="/work/peers-venv/bin/python")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    workers = []
    for spec in args.version:
        label, _, src = spec.partition("=")
        src_dir = Path(src).resolve()
        cmd = ["env", f"PYTHONPATH={src_dir}", sys.executable, str(WORKER), "swiftlm", args.model]
        if args.quantization:
            cmd += ["--quantization", args.quantization]
        workers.append(Worker(label, cmd, 2.0))
    if args.llama_gguf:
        workers.append(Worker(f"llama.cpp {Path(args.llama_gguf).stem} fa", [args.llama_python, str(WORKER), "llama",
                                                                             args.llama_gguf, "--flash-attn"], 2.0))
    decode: dict[str, list[float]] = {w.label: [] for w in workers}
    ttft: dict[str, list[float]] = {w.label: [] for w in workers}
    rng = random.Random(0)
    prompt = [rng.randrange(1000, 100000) for _ in range(args.prompt)]
    try:
        for w in workers:
            w.start()
        for rep in range(args.repeats):
            for w in workers if rep % 2 == 0 else workers[::-1]:
                out = w.run(prompt, args.decode)
                decode[w.label].append(out["decode_tok_s"])
                ttft[w.label].append(out["ttft_s"])
    finally:
        for w in workers:
            w.stop()
    base = statistics.median(decode[workers[0].label])
    print(f"prompt {args.prompt}, {args.decode} decoded tokens, {args.repeats} repeats, medians")
    print("| version | decode tok/s | vs first | TTFT s |\n|---|---:|---:|---:|")
    for w in workers:
        d = statistics.median(decode[w.label])
        print(f"| {w.label} | {d:.2f} | {d / base:.2f}x | {statistics.median(ttft[w.label]):.3f} |")


if __name__ == "__main__":
    main()
