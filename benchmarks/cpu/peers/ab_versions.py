"""Decode speed of several swiftlm source trees (and optionally llama.cpp), interleaved, in one run.

    git worktree add /tmp/v1 <commit>          # one checkout per version to compare
    python benchmarks/cpu/peers/ab_versions.py --model models/qwen3-0.6b-random \
        --version before=/tmp/v1/src --version after=src \
        --llama-gguf models/qwen3-0.6b-random-gguf/qwen3-0.6b-random-bf16.gguf --repeats 5

Each version runs in its own worker process (``worker.py`` with that tree first on PYTHONPATH),
loaded once; every repeat runs the same prompt through each worker, the order reversing every
repeat. Prints the median decode tok/s and TTFT of each, and each one's ratio to the first;
``--batch 16`` adds the decode throughput of 16 prompts decoded together. The memory bandwidth is
probed before every repeat; its median and range are printed with the results.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import WORKER, Worker  # noqa: E402

from swiftlm.bench.bandwidth import BandwidthProbe  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--version", action="append", required=True, metavar="LABEL=SRC_DIR[:KERNEL,...]",
                    help="a swiftlm source tree (the directory holding the swiftlm package); after a colon, "
                         "CPU kernels to leave out in it (their torch path, no oneDNN packing)")
    ap.add_argument("--quantization", choices=["int8", "int4"], help="load every swiftlm version quantised")
    ap.add_argument("--llama-gguf", help="also run llama.cpp (flash attention on) on this GGUF")
    ap.add_argument("--llama-python", default="/work/peers-venv/bin/python")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=0, help="also decode this many prompts together (swiftlm only)")
    args = ap.parse_args()
    workers = []
    swiftlm_labels = set()
    for spec in args.version:
        label, _, src = spec.partition("=")
        src, _, disabled = src.partition(":")
        src_dir = Path(src).resolve()
        cmd = ["env", f"PYTHONPATH={src_dir}", sys.executable, str(WORKER), "swiftlm", args.model]
        if disabled:
            cmd += ["--disable-kernels", disabled]
        if args.quantization:
            cmd += ["--quantization", args.quantization]
        workers.append(Worker(label, cmd, 2.0))
        swiftlm_labels.add(label)
    if args.llama_gguf:
        workers.append(Worker(f"llama.cpp {Path(args.llama_gguf).stem} fa", [args.llama_python, str(WORKER), "llama",
                                                                             args.llama_gguf, "--flash-attn"], 2.0))
    decode: dict[str, list[float]] = {w.label: [] for w in workers}
    ttft: dict[str, list[float]] = {w.label: [] for w in workers}
    batched: dict[str, list[float]] = {w.label: [] for w in workers}
    bandwidth: list[float] = []
    probe = BandwidthProbe()
    rng = random.Random(0)
    prompt = [rng.randrange(1000, 100000) for _ in range(args.prompt)]
    try:
        for w in workers:
            w.start()
        for rep in range(args.repeats):
            bandwidth.append(probe.measure(3))
            for w in workers if rep % 2 == 0 else workers[::-1]:
                batch = args.batch if w.label in swiftlm_labels else 0
                out = w.run(prompt, args.decode, batch)
                decode[w.label].append(out["decode_tok_s"])
                ttft[w.label].append(out["ttft_s"])
                if batch:
                    batched[w.label].append(out["batch_decode_tok_s"])
    finally:
        for w in workers:
            w.stop()
    first = workers[0].label
    base, base_ttft = statistics.median(decode[first]), statistics.median(ttft[first])
    print(f"prompt {args.prompt}, {args.decode} decoded tokens, {args.repeats} repeats, medians; bandwidth "
          f"{statistics.median(bandwidth):.1f} GB/s (range {min(bandwidth):.1f}-{max(bandwidth):.1f})")
    head = "| version | decode tok/s | vs first | TTFT s | vs first |"
    if args.batch:
        head += f" {args.batch}-way decode tok/s | vs first |"
    print(head + "\n|---|" + "---:|" * (head.count("|") - 2))
    base_batch = statistics.median(batched[first]) if batched[first] else None
    for w in workers:
        d, t = statistics.median(decode[w.label]), statistics.median(ttft[w.label])
        row = f"| {w.label} | {d:.2f} | {d / base:.3f}x | {t:.3f} | {t / base_ttft:.3f}x |"
        if args.batch:
            b = statistics.median(batched[w.label]) if batched[w.label] else None
            row += f" {b:.1f} | {b / base_batch:.3f}x |" if b and base_batch else " - | - |"
        print(row)


if __name__ == "__main__":
    main()
